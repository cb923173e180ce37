"""Hugging Face Hub model ids: ``jaxspec.load("Qwen/Qwen2.5-0.5B-Instruct")``.

An id ``owner/name`` that is not a local path (nor a shipped ``jaxspec/...`` name) is looked up in the Hugging Face
cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``: the one transformers uses, so a
model it downloaded is found) and, when missing there, downloaded into it once with ``huggingface_hub`` (a
dependency of transformers) with a message saying so. Only what ``jaxspec.load`` reads is fetched: configs,
``*.safetensors`` (never pickled weights) and tokenizer files; for a GGUF repository, the one file named by
``gguf_file=`` (all its shards if it is one of a split set). ``revision`` picks a branch, tag or commit. A gated
model takes the token huggingface_hub finds (``HF_TOKEN`` or ``hf auth login``).

Offline (``HF_HUB_OFFLINE=1``, or the Hub unreachable) and not cached is a ``FileNotFoundError`` that says what to
run where the Hub can be reached.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

# what jaxspec.load reads from a Hugging Face model directory (jaxspec.formats.hf, jaxspec.formats.hf_wrappers)
PATTERNS = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.json",
    "chat_template.jinja",
)
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")
_SHARD = re.compile(r"^(?P<prefix>.+)-\d{5}-of-(?P<count>\d{5})\.gguf$")


def is_repo_id(value) -> bool:
    """``owner/name`` that names no local path."""
    return isinstance(value, str) and bool(_REPO_ID.match(value)) and ".." not in value and not Path(value).exists()


def cache_dir() -> Path:
    """The Hugging Face hub cache, as read now from the environment."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _patterns(gguf_file: str | None) -> list[str]:
    if gguf_file is None:
        return list(PATTERNS)
    match = _SHARD.match(Path(gguf_file).name)
    if match is None:
        return [gguf_file]
    parent = str(Path(gguf_file).parent)
    prefix = "" if parent == "." else parent + "/"
    return [f"{prefix}{match['prefix']}-*-of-{match['count']}.gguf"]


def _complete(local: Path, gguf_file: str | None) -> bool:
    if gguf_file is not None:
        return (local / gguf_file).is_file()
    has_weights = (local / "model.safetensors.index.json").is_file() or any(local.glob("*.safetensors"))
    return (local / "config.json").is_file() and has_weights


def _command(repo_id: str, revision: str | None, gguf_file: str | None) -> str:
    include = " ".join(f"'{p}'" for p in _patterns(gguf_file))
    rev = f" --revision {revision}" if revision else ""
    return f"hf download {repo_id}{rev} --include {include}"


def snapshot(repo_id: str, *, revision: str | None = None, gguf_file: str | None = None) -> Path:
    """The local path of ``repo_id`` at ``revision`` (a directory, or the GGUF file ``gguf_file`` in it): from the
    Hugging Face cache, downloaded there first when it is not complete there.

    Raises ``FileNotFoundError`` when it is not cached and cannot be downloaded (offline, the Hub unreachable, no
    such repository, revision or file) and ``PermissionError`` for a gated or private repository without access.
    """
    import huggingface_hub
    from huggingface_hub import errors

    cache = cache_dir()
    patterns = _patterns(gguf_file)
    kwargs: dict[str, Any] = dict(revision=revision, cache_dir=str(cache), allow_patterns=patterns)
    try:
        local = Path(huggingface_hub.snapshot_download(repo_id, local_files_only=True, **kwargs))
        if _complete(local, gguf_file):
            return local / gguf_file if gguf_file else local
    except errors.LocalEntryNotFoundError:
        pass
    where = f"{repo_id}{'@' + revision if revision else ''}"
    if _offline():
        raise FileNotFoundError(
            f"{where} is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE is set; where the Hub can be "
            f"reached run: {_command(repo_id, revision, gguf_file)} (or pass a local directory)"
        )
    print(f"jaxspec: downloading {where} from the Hugging Face Hub into {cache} (once)", file=sys.stderr, flush=True)
    try:
        local = Path(huggingface_hub.snapshot_download(repo_id, **kwargs))
    except errors.GatedRepoError:
        raise PermissionError(
            f"{repo_id} is gated: accept its license on huggingface.co, then log in (hf auth login) or set HF_TOKEN"
        ) from None
    except errors.RepositoryNotFoundError:
        raise FileNotFoundError(
            f"no local path {repo_id!r}, and the Hugging Face Hub has no repository {repo_id!r} you can read (private "
            "ones need hf auth login or HF_TOKEN)"
        ) from None
    except errors.RevisionNotFoundError:
        raise FileNotFoundError(f"{repo_id} has no revision {revision!r} on the Hugging Face Hub") from None
    except (errors.LocalEntryNotFoundError, OSError) as err:  # the Hub unreachable, a disk error
        raise FileNotFoundError(
            f"{where} is not in the Hugging Face cache ({cache}) and could not be downloaded "
            f"({type(err).__name__}: {err}); where the Hub can be reached run: {_command(repo_id, revision, gguf_file)}"
        ) from None
    if not _complete(local, gguf_file):
        what = (
            f"a file {gguf_file!r}"
            if gguf_file
            else "config.json and *.safetensors weights (pickled weights are never read)"
        )
        raise FileNotFoundError(f"{where} on the Hugging Face Hub has no {what}")
    return local / gguf_file if gguf_file else local
