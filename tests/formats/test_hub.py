"""Hugging Face Hub ids (``jaxspec.load("owner/name")``), offline: a Hugging Face cache laid out as huggingface_hub
lays it out, prepared by the test; the download path through a stand-in for ``snapshot_download`` that fills that
cache (no network here); the errors."""

import json
import shutil
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
from helpers import FIXTURES_DIR
from huggingface_hub import errors

import jaxspec
from jaxspec.formats import hub

FIXTURES = FIXTURES_DIR
LLAMA = FIXTURES / "hf" / "llama_gqa"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _cache_repo(cache: Path, repo_id: str, files: dict[str, Path], ref: str = "main") -> Path:
    """``repo_id`` at ``ref`` in huggingface_hub's cache layout: blobs, a snapshot of links, refs/<ref>."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name, src in files.items():
        blob = repo / "blobs" / f"blob-{name.replace('/', '_')}"
        shutil.copyfile(src, blob)
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).symlink_to(blob)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(COMMIT)
    return snap


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # no local directory named like the ids below
    return tmp_path / "hf-cache"


def _llama_files():
    return {p.name: p for p in LLAMA.iterdir() if p.name != "expected.npz"}


def _expected():
    data = np.load(LLAMA / "expected.npz")
    return data["ids"], data["logits"]


def test_a_cached_repo_loads_offline(cache):
    _cache_repo(cache, "someone/tiny-llama", _llama_files())
    model = jaxspec.load("someone/tiny-llama")
    ids, logits = _expected()
    assert np.abs(np.asarray(model.logits(ids)) - logits).max() <= 1e-4
    assert model.name == "tiny-llama"  # not the snapshot directory's name (a commit hash)


def test_a_revision_and_a_gguf_file_in_a_repo(cache):
    _cache_repo(cache, "someone/tiny-llama", _llama_files(), ref="v1")
    assert jaxspec.load("someone/tiny-llama", revision="v1").vocab_size == 64
    manifest = json.loads((FIXTURES / "gguf" / "manifest.json").read_text())["fixtures"][0]
    _cache_repo(cache, "someone/tiny-GGUF", {"model.Q8_0.gguf": FIXTURES / "gguf" / manifest["gguf"]})
    model = jaxspec.load("someone/tiny-GGUF", gguf_file="model.Q8_0.gguf", tokenizer=False)
    assert model.vocab_size == manifest["config"]["vocab"]


def test_offline_and_not_cached_says_what_to_run(cache):
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE is set; .* run: hf download someone/absent --include"):
        jaxspec.load("someone/absent")
    # a cached snapshot without its weights is not taken for a model
    _cache_repo(cache, "someone/no-weights", {"config.json": LLAMA / "config.json"})
    with pytest.raises(FileNotFoundError, match="not in the Hugging Face cache"):
        jaxspec.load("someone/no-weights")


def test_a_missing_repo_is_downloaded_once_with_a_message(cache, monkeypatch, capsys):
    """Online: the first load fills the cache (through huggingface_hub, stood in for here: no network), with a
    message and only the files jaxspec reads; the second load finds it cached and downloads nothing."""
    monkeypatch.delenv("HF_HUB_OFFLINE")
    real = huggingface_hub.snapshot_download
    calls = []

    def stand_in(repo_id, *, local_files_only=False, allow_patterns=None, cache_dir=None, revision=None):
        calls.append((repo_id, local_files_only))
        if not local_files_only:  # "the Hub": a repository with pickled weights and a vision tower's files too
            files = {
                **_llama_files(),
                "pytorch_model.bin": LLAMA / "config.json",
                "preprocessor_config.json": LLAMA / "config.json",
            }
            wanted = {n: p for n, p in files.items() if any(Path(n).match(pat) for pat in allow_patterns)}
            _cache_repo(Path(cache_dir), repo_id, wanted)
        return real(
            repo_id, local_files_only=True, allow_patterns=allow_patterns, cache_dir=cache_dir, revision=revision
        )

    monkeypatch.setattr(huggingface_hub, "snapshot_download", stand_in)
    first = jaxspec.load("someone/tiny-llama")
    assert "downloading someone/tiny-llama from the Hugging Face Hub" in capsys.readouterr().err
    snap = next((cache / "models--someone--tiny-llama" / "snapshots").iterdir())
    assert not (snap / "pytorch_model.bin").exists() and not (snap / "preprocessor_config.json").exists()
    assert calls == [("someone/tiny-llama", True), ("someone/tiny-llama", False)]
    calls.clear()
    again = jaxspec.load("someone/tiny-llama")
    assert calls == [("someone/tiny-llama", True)] and "downloading" not in capsys.readouterr().err
    ids, _ = _expected()
    np.testing.assert_array_equal(np.asarray(first.logits(ids)), np.asarray(again.logits(ids)))


def _http(cls, status: int):
    """One of huggingface_hub's HTTP errors, as it raises them (with the Hub's response; its HTTP client is httpx2
    in huggingface_hub 2, httpx before)."""
    try:
        import httpx2 as httpx
    except ImportError:
        import httpx

    request = httpx.Request("GET", "https://huggingface.co/api/models/someone/x")
    return cls(f"{status}", response=httpx.Response(status, request=request))


@pytest.mark.parametrize(
    "error,kind,match",
    [
        (
            _http(errors.RepositoryNotFoundError, 404),
            FileNotFoundError,
            "no local path 'someone/x', and the Hugging Face",
        ),
        (_http(errors.GatedRepoError, 403), PermissionError, "is gated: accept its license"),
        (_http(errors.RevisionNotFoundError, 404), FileNotFoundError, "has no revision"),
        (errors.LocalEntryNotFoundError("no connection"), FileNotFoundError, "could not be downloaded .* hf download"),
    ],
)
def test_hub_errors_are_clear(cache, monkeypatch, error, kind, match):
    monkeypatch.delenv("HF_HUB_OFFLINE")

    def stand_in(repo_id, *, local_files_only=False, **kwargs):
        if local_files_only:
            raise errors.LocalEntryNotFoundError("not cached")
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", stand_in)
    with pytest.raises(kind, match=match):
        jaxspec.load("someone/x", revision="v9" if "revision" in match else None)


def test_local_paths_win_and_hub_arguments_are_checked(cache, tmp_path):
    shutil.copytree(LLAMA, tmp_path / "someone" / "tiny-llama")  # a local directory named like an id
    assert not hub.is_repo_id("someone/tiny-llama")
    assert jaxspec.load("someone/tiny-llama").vocab_size == 64  # offline, nothing cached: the local one
    assert hub.is_repo_id("Qwen/Qwen2.5-0.5B-Instruct") and not hub.is_repo_id("a/b/c")
    assert not hub.is_repo_id("../x") and not hub.is_repo_id("smollm2-135m-instruct")
    with pytest.raises(ValueError, match="revision= is for Hugging Face Hub ids"):
        jaxspec.load(tmp_path / "someone" / "tiny-llama", revision="main")


def test_only_what_load_reads_is_fetched():
    pats = hub._patterns(None)
    for name in ["config.json", "model.safetensors", "model-00001-of-00002.safetensors", "tokenizer.json"]:
        assert any(Path(name).match(p) for p in pats), name
    for name in ["pytorch_model.bin", "model.gguf", "preprocessor_config.json", "consolidated.pth"]:
        assert not any(Path(name).match(p) for p in pats), name
    assert hub._patterns("q4/m-00002-of-00003.gguf") == ["q4/m-*-of-00003.gguf"]
    assert hub._patterns("m.Q4_K_M.gguf") == ["m.Q4_K_M.gguf"]


def test_the_command_line_takes_hub_ids(cache, tmp_path, capsys):
    from jaxspec import cli
    from jaxspec.cli.models import check_model_arg

    check_model_arg("someone/tiny-llama", "--target")  # passes unchecked: fetched (or refused) when loaded
    assert cli.main(["convert", "someone/absent", str(tmp_path / "out"), "--to", "hf"]) == 2
    assert "SRC: cannot load someone/absent: someone/absent is not in the Hugging Face cache" in capsys.readouterr().err
    _cache_repo(cache, "someone/tiny-llama", _llama_files())
    assert cli.main(["convert", "someone/tiny-llama", str(tmp_path / "out"), "--to", "hf"]) == 0
    ids, logits = _expected()
    assert np.abs(np.asarray(jaxspec.load(tmp_path / "out").logits(ids)) - logits).max() <= 1e-4
