"""Shared tiny models. Weights use a larger init std than training would, so logits are well separated
(greedy comparisons are then about engine bookkeeping, not float ties)."""

import faulthandler
import os
import shutil
import tempfile
from pathlib import Path

# XLA:CPU's cheapest settings for the suite's compiles (helpers.TEST_XLA_FLAGS says why), set before the backend
# starts; subprocesses the tests start (CLI, multi-host) inherit them.
from helpers import TEST_XLA_FLAGS  # noqa: E402

os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()

import jax  # noqa: E402

# Eight simulated CPU devices for the mesh tests (must precede any use of the backend; no effect elsewhere).
jax.config.update("jax_num_cpu_devices", 8)

# No persistent compilation cache shared by the xdist workers: three full-suite runs crashed a worker inside XLA's
# compiler (an abort in backend_compile_and_load, a segfault in put_executable_and_time, one with the cache off).
# The cause was the workers' memory maps: XLA:CPU maps every kernel of a compiled program, and with layers held
# split a worker that kept every program passed Linux's 65 530 maps ("LLVM compilation error: Cannot allocate
# memory", then SIGSEGV). jaxspec.loop.executables now bounds what is kept; see _bounded_memory_maps below.


# The CLI turns JAX's persistent compilation cache on by default (jaxspec.loop.compile_cache); in-process CLI tests must
# not point every later compile of their worker at ~/.cache. test_compile_cache turns it on in subprocesses. (A cache
# shared by the workers for the whole run was tried: the suite took as long, 1229 s against 1183 s.)
os.environ["JAXSPEC_COMPILATION_CACHE"] = "off"

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from helpers import HELD_HIGH, RELEASE_HIGH, SMALL_DRAFT, VOCAB, tiny_config  # noqa: E402,F401  (tests import VOCAB/tiny_config from here)

from jaxspec.loop import executables  # noqa: E402
from jaxspec.models import llama  # noqa: E402


# A worker that dies of a fatal signal prints its stacks on its stderr, which xdist interleaves with the progress
# dots and CI logs keep only the tail of. Each worker writes them to a file instead, and the controller prints the
# crashing thread's stack at the end of the run, just above the short summary.
def _crash_dir(controller_pid: int) -> Path:
    return Path(tempfile.gettempdir()) / f"jaxspec-test-crashes-{controller_pid}"


@pytest.hookimpl(trylast=True)  # after pytest's faulthandler plugin, which points faulthandler at stderr
def pytest_configure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        directory = _crash_dir(os.getppid())
        directory.mkdir(exist_ok=True)
        config._jaxspec_crash_file = open(directory / f"{worker}-pid{os.getpid()}.txt", "w")  # noqa: SIM115
        faulthandler.enable(file=config._jaxspec_crash_file, all_threads=True)


def crash_report(text: str, max_lines: int = 50) -> str:
    """A faulthandler dump cut to what tells the cause: the error line and the crashing thread's frames first
    (pytest's, pluggy's, xdist's and execnet's left out), then the first frames of every other thread; the list of
    extension modules dropped."""
    harness = ("/pluggy/", "/_pytest/", "/xdist/", "/execnet/", '"<string>"')
    blocks = [b.strip("\n") for b in text.split("\n\n") if b.strip() and not b.startswith("Extension modules")]
    head = [b for b in blocks if b.startswith("Fatal Python error")]
    current = [
        "\n".join(x for x in b.splitlines() if not any(h in x for h in harness))
        for b in blocks
        if b.startswith("Current thread")
    ]
    others = [
        "\n".join(b.splitlines()[:4]) for b in blocks if not b.startswith(("Current thread", "Fatal Python error"))
    ]
    return "\n".join("\n".join([*head, *current, *others]).splitlines()[:max_lines])


def pytest_terminal_summary(terminalreporter):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    directory = _crash_dir(os.getpid())
    for path in sorted(directory.glob("*.txt")) if directory.is_dir() else []:
        text = path.read_text(errors="replace").strip()
        if text:
            terminalreporter.write_sep("=", f"fatal error in xdist worker {path.stem}")
            terminalreporter.write_line(crash_report(text))
    shutil.rmtree(directory, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    # pyproject's filterwarnings (third-party noise judged harmless there, each with its reason) also as a mark on
    # every test: pytest gives `-W` options precedence over the ini's filters but marks precedence over `-W`, so a
    # `pytest -W default` run, which shows every other warning, still leaves those out
    marks = [pytest.mark.filterwarnings(entry) for entry in config.getini("filterwarnings")]
    for item in items:
        for mark in marks:
            item.add_marker(mark)
    # the longest files first (the classic longest-first schedule): xdist hands out whole files (--dist loadfile,
    # pyproject.toml) in collection order, so a file taking a quarter of a worker's time, reached halfway, could run
    # on after the rest with the other worker idle
    rank = {name: n for n, name in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


LONGEST = (  # test files, longest first (pytest --durations on the 2-core machine, summed by file)
    "tests/integration/test_examples.py",  # every docs page, minutes
    "tests/generation/test_exactness.py",
    "tests/drafters/test_eagle.py",
    "tests/drafters/test_eagle3.py",
    "tests/formats/test_gguf.py",
    "tests/parallel/test_sharding.py",
)


@pytest.fixture(autouse=True)
def _bounded_memory_maps():
    """Before each test, what every Program does before it compiles: under memory-map pressure, release compiled
    programs (jaxspec.loop.executables). A worker compiles hundreds of programs, many through plain jax.jit, and on
    XLA:CPU each maps its kernels: past Linux's 65 530 maps per process, XLA's compiler crashes the worker.

    Within the test, a release waits until ``HELD_HIGH`` of the limit (near the crash it still acts). A release
    also clears jax's caches, so one that a worker's history brought on halfway through a test would compile again
    what the test compiled before it: tests that compile, then count what a later call compiles
    (``helpers.count_compiles``), failed that way in CI."""
    executables.make_room()
    executables.HIGH = HELD_HIGH
    yield
    executables.HIGH = RELEASE_HIGH


@pytest.fixture(scope="session")
def target():
    return llama.init(tiny_config(), seed=0, name="target")


@pytest.fixture(scope="session")
def unrelated_draft():
    return llama.init(tiny_config(), seed=1, name="unrelated")


@pytest.fixture(scope="session")
def small_draft():
    return llama.init(tiny_config(**SMALL_DRAFT), seed=2, name="small")


@pytest.fixture(scope="session")
def perturbed_draft(target):
    """The target plus noise: agrees often but not always (exercises ragged acceptance and rollback)."""
    leaves, treedef = jax.tree.flatten(target.params)
    rng = np.random.default_rng(3)
    noisy = [x + 0.008 * rng.standard_normal(x.shape).astype(x.dtype) for x in leaves]
    return target.replace(params=jax.tree.unflatten(treedef, noisy), name="perturbed")


@pytest.fixture(scope="session")
def mixed_prompts():
    rng = np.random.default_rng(0)
    return [rng.integers(0, VOCAB, size=int(rng.integers(1, 24))).tolist() for _ in range(21)]
