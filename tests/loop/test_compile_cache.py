"""The persistent compilation cache (jaxspec.loop.compile_cache): a second process loads what the first compiled."""

import json
import os
import subprocess
import sys

import pytest

from jaxspec import cli
from jaxspec.loop import compile_cache

# Runs in a fresh process: turns the cache on at argv[1], counts JAX's cache hits, decodes greedily with the
# shipped pair and prints {"hits", "tokens"}.
SNIPPET = """
import json, sys
import jax
hits = []
jax.monitoring.register_event_listener(lambda event, **kw: hits.append(event))
import jaxspec
jaxspec.enable_compilation_cache(sys.argv[1])
target, draft = jaxspec.load("jaxspec/code-target"), jaxspec.load("jaxspec/code-draft")
out = jaxspec.generate(target, ["def add(a, b):"], draft=draft, gamma=2, max_new_tokens=8, temperature=0.0)
n = sum(e == "/jax/compilation_cache/cache_hits" for e in hits)
print(json.dumps({"hits": n, "tokens": [int(t) for t in out.tokens[0]]}))
"""


def _env():
    env = dict(os.environ)
    env.pop(compile_cache.ENV, None)
    return env


def _run(*args, env=None):
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, env=env or _env(), cwd=os.getcwd()
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_a_second_process_loads_what_the_first_compiled(tmp_path):
    cache = tmp_path / "xla"
    first = json.loads(_run("-c", SNIPPET, str(cache)).stdout.strip().splitlines()[-1])
    entries = sorted(p.name for p in cache.iterdir())
    assert first["hits"] == 0 and any("generate" in e for e in entries), entries
    second = json.loads(_run("-c", SNIPPET, str(cache)).stdout.strip().splitlines()[-1])
    assert second["hits"] >= 1  # the generation loop at least was loaded, not compiled
    assert second["tokens"] == first["tokens"] and len(first["tokens"]) == 8
    assert sorted(p.name for p in cache.iterdir()) == entries  # nothing new was compiled and written


# Runs in a fresh process with no cache chosen: one generate call on a tiny model (argv[1] "off": after
# enable_compilation_cache(False)), then, with argv[2], an explicit directory and a call of another shape; prints
# the directory in use after the first call.
DEFAULT_SNIPPET = """
import json, sys
import jaxspec
from jaxspec.loop import compile_cache
from jaxspec.models import llama
if sys.argv[1] == "off":
    jaxspec.enable_compilation_cache(False)
cfg = llama.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1)
target = llama.init(cfg, seed=0)
jaxspec.generate(target, [[1, 2, 3]], max_new_tokens=2)
where = compile_cache.use_default()
if len(sys.argv) > 2:
    assert jaxspec.enable_compilation_cache(sys.argv[2]) is not None
    jaxspec.generate(target, [[1, 2, 3]], max_new_tokens=2, max_length=128)
print(json.dumps({"dir": None if where is None else str(where)}))
"""


def test_the_python_api_turns_it_on_by_default(tmp_path):
    """generate turns the cache on at the default directory when the process chose nothing; an explicit
    directory then replaces that default; enable_compilation_cache(False) keeps it off."""
    env = {**_env(), "JAXSPEC_CACHE": str(tmp_path / "root")}
    mine = tmp_path / "mine"
    out = json.loads(_run("-c", DEFAULT_SNIPPET, "default", str(mine), env=env).stdout.strip().splitlines()[-1])
    assert out["dir"] == str(tmp_path / "root" / "xla") and any((tmp_path / "root" / "xla").iterdir())
    assert any(mine.iterdir())
    env = {**_env(), "JAXSPEC_CACHE": str(tmp_path / "root2")}
    out = json.loads(_run("-c", DEFAULT_SNIPPET, "off", env=env).stdout.strip().splitlines()[-1])
    assert out["dir"] is None and not (tmp_path / "root2" / "xla").exists()


def test_the_cli_turns_it_on_from_the_environment(tmp_path):
    cache = tmp_path / "cli-xla"
    env = {**_env(), compile_cache.ENV: str(cache)}
    argv = ["def f(x):", "--target", "jaxspec/code-target", "--draft", "none", "--max-new-tokens", "4"]
    _run("-m", "jaxspec.cli", "generate", *argv, "--temperature", "0", env=env)
    assert any(cache.iterdir())


def test_default_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXSPEC_CACHE", str(tmp_path / "root"))
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    assert compile_cache.default_directory() == tmp_path / "root" / "xla"
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "mine"))
    assert compile_cache.default_directory() == tmp_path / "mine"
    for off in ("off", "0", "False", " no ", ""):
        monkeypatch.setenv(compile_cache.ENV, off)
        assert compile_cache.default_directory() is None
        assert compile_cache.enable_compilation_cache() is None  # the default says off: nothing is turned on
        assert compile_cache.use_default() is None  # nor by default


def test_bad_arguments_are_clear_errors(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="directory .*file.* is not a directory"):
        compile_cache.enable_compilation_cache(a_file)
    with pytest.raises(ValueError, match="cannot be created"):
        compile_cache.enable_compilation_cache(a_file / "sub")
    for bad in (-1.0, "1", True, float("nan")):
        with pytest.raises(ValueError, match="min_compile_time_s must be a number >= 0"):
            compile_cache.enable_compilation_cache(tmp_path, min_compile_time_s=bad)


def test_the_cli_flag(monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr(compile_cache, "enable_compilation_cache", lambda value=None: calls.append(value))
    assert cli.generate.compilation_cache("off") is None and calls == []  # off: never turned on
    cli.generate.compilation_cache(None)
    cli.generate.compilation_cache(str(tmp_path))
    assert calls == [None, str(tmp_path)]  # None: the environment's default decides
    monkeypatch.undo()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    code = cli.main(["generate", "def f(x):", "--compilation-cache", str(a_file), "--draft", "none"])
    err = capsys.readouterr().err
    assert code == 2 and "--compilation-cache:" in err and "not a directory" in err
