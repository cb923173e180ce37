"""Generation on device meshes (8 simulated CPU devices, see conftest): same tokens as one device, really
sharded params and caches, loading straight into the layout, clear errors, and two processes on loopback."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import count_compiles
from jax.sharding import PartitionSpec as P
from multihost_prompts import PROMPTS, engine_requests

import jaxspec
from jaxspec import loop
from jaxspec.generation import generate as gen
from jaxspec.models import families
from jaxspec.parallel import sharding

MESHES = [{"data": 1, "model": 8}, {"data": 2, "model": 4}, {"data": 4, "model": 2}, {"data": 8, "model": 1}]


@pytest.fixture(scope="module")
def prompts(mixed_prompts):
    return mixed_prompts[:5]


@pytest.fixture(scope="module")
def reference(target, small_draft, prompts):
    kw = dict(draft=small_draft, max_new_tokens=[9, 14, 5, 12, 10], eos_token_id=7)
    return {
        "greedy": jaxspec.generate(target, prompts, temperature=0.0, **kw),
        "sampled": jaxspec.generate(target, prompts, temperature=1.0, top_k=40, seed=11, **kw),
    }


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: f"{m['data']}x{m['model']}")
def test_mesh_tokens_match_single_device(target, small_draft, prompts, reference, mesh):
    kw = dict(draft=small_draft, max_new_tokens=[9, 14, 5, 12, 10], eos_token_id=7, mesh=mesh)
    greedy = jaxspec.generate(target, prompts, temperature=0.0, **kw)
    sampled = jaxspec.generate(target, prompts, temperature=1.0, top_k=40, seed=11, **kw)
    assert greedy.tokens == reference["greedy"].tokens
    assert greedy.finish_reasons == reference["greedy"].finish_reasons
    assert greedy.stats.accepted == reference["greedy"].stats.accepted
    assert sampled.tokens == reference["sampled"].tokens
    assert greedy.stats.compiled_batch_size % mesh["data"] == 0
    for a, b in zip(greedy.logprobs, reference["greedy"].logprobs):
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_auto_gamma_on_a_mesh(target, small_draft, prompts, reference):
    """gamma="auto" on a 2x4 mesh returns the single-device greedy tokens, and learns the round cost of the loop it
    ran on the mesh (kept apart from one device's) from a call that did not compile (a first call records nothing).
    The pair's acceptance is set to 0, so both calls decode plainly (a pair never measured would be probed)."""
    from jaxspec import loop

    policy = jaxspec.policy.AutoGamma(gammas=(2,))
    policy.set_alpha(target, small_draft, True, 0.0)
    compiled = loop.rounds_program.compiles, loop.prefill_program.compiles
    kw = dict(draft=small_draft, gamma="auto", policy=policy, temperature=0.0, max_new_tokens=[9, 14, 5, 12, 10])
    res = jaxspec.generate(target, prompts, eos_token_id=7, mesh={"data": 2, "model": 4}, **kw)
    assert res.tokens == reference["greedy"].tokens
    assert res.stats.policy["round_cost"][2] > 0
    # its prefill and rounds programs were compiled together, the rounds one on the prefilled state's shapes and
    # shardings: had those differed from the real state's, the call would have compiled it a second time
    assert loop.rounds_program.compiles - compiled[0] <= 1 and loop.prefill_program.compiles - compiled[1] <= 1
    again = jaxspec.generate(target, prompts, eos_token_id=7, mesh={"data": 2, "model": 4}, **kw)
    assert again.tokens == reference["greedy"].tokens and res.stats.gamma == again.stats.gamma == 0
    batch, cache = res.stats.compiled_batch_size, res.stats.cache_length
    key = ((("data", 2), ("model", 4)), True)
    assert set(policy.observed_rounds(target, small_draft, batch, cache, key)) == {res.stats.gamma}
    assert policy.observed_rounds(target, small_draft, batch, cache) == {}


def test_prompt_lookup_abstaining_on_a_mesh(target, prompts):
    """Prompt lookup's choice between a verify round and a plain step is one decision for the whole batch: on a
    2x4 mesh (rows split over data) tokens and every counter equal one device's, and both kinds of round ran."""
    kw = dict(draft="prompt_lookup", gamma=3, max_new_tokens=[9, 14, 5, 12, 10], eos_token_id=7, temperature=0.0)
    one = jaxspec.generate(target, prompts, **kw)
    mesh = jaxspec.generate(target, prompts, mesh={"data": 2, "model": 4}, **kw)
    assert mesh.tokens == one.tokens
    assert [r.rounds for r in mesh.stats.rows] == [r.rounds for r in one.stats.rows]
    assert [r.accept_hist for r in mesh.stats.rows] == [r.accept_hist for r in one.stats.rows]
    assert 0 < sum(one.stats.accept_hist) < one.stats.rounds


def test_sharded_draft_plain_decoding_and_stream(target, small_draft, prompts, reference):
    mesh = {"data": 2, "model": 4}
    kw = dict(max_new_tokens=[9, 14, 5, 12, 10], eos_token_id=7, temperature=0.0, mesh=mesh)
    assert (
        jaxspec.generate(target, prompts, draft=small_draft, shard_draft=False, **kw).tokens
        == reference["greedy"].tokens
    )
    plain = jaxspec.generate(target, prompts, **{**kw, "mesh": None})
    assert jaxspec.generate(target, prompts, **kw).tokens == plain.tokens == reference["greedy"].tokens
    s = jaxspec.stream(target, prompts, draft=small_draft, **kw)
    pieces = [[] for _ in prompts]
    with count_compiles() as counts:
        for i, step in enumerate(s):
            for row, new in zip(pieces, step.tokens):
                row.extend(new)
            if i == 1:
                before = counts["compiles"]
    assert pieces == reference["greedy"].tokens == s.result.tokens
    assert counts["compiles"] == before  # no compile per round


def _per_device_bytes(x: jax.Array) -> int:
    sizes = {s.data.nbytes for s in x.addressable_shards}
    assert len(sizes) == 1
    return sizes.pop()


def test_params_and_caches_are_sharded(target, small_draft, prompts):
    mesh = sharding.make_mesh({"data": 2, "model": 4})
    placed = jaxspec.shard(target, mesh).params
    expect = {  # each layer's weights in their own arrays (``from_params`` splits the stack)
        ("attn", "q_proj", "kernel"): P(None, "model"),
        ("attn", "o_proj", "kernel"): P("model", None),
        ("mlp", "gate_proj", "kernel"): P(None, "model"),
        ("mlp", "down_proj", "kernel"): P("model", None),
        # 2 kv heads do not divide over model=4: replicated, and reported
        ("attn", "k_proj", "kernel"): P(None, None),
    }
    assert len(placed["layers"]) == target.config.num_layers
    for layer in placed["layers"]:
        for path, spec in expect.items():
            x = layer[path[0]][path[1]][path[2]]
            assert x.sharding.spec == spec, path
            shards = 4 if "model" in spec else 1
            assert _per_device_bytes(x) == x.nbytes // shards
    assert placed["embed"]["embedding"].sharding.spec == P("model", None)
    assert placed["lm_head"]["kernel"].sharding.spec == P(None, "model")
    fallbacks = {f.tensor for f in sharding.plan(target, mesh).fallbacks}
    layers = range(target.config.num_layers)
    assert fallbacks == {f"target/layers/[{i}]/attn/{p}_proj/kernel" for i in layers for p in "kv"}
    # the stacked layout (nn.scan) is planned with a leading, unsharded layers axis
    stacked = jaxspec.shard(target.replace(params=families.stack_layers(target.params)), mesh).params["layers"]
    assert stacked["attn"]["q_proj"]["kernel"].sharding.spec == P(None, None, "model")

    # caches and loop state, on a mesh where the 2 kv heads divide: [L, B/data, S, Hkv/model, D] per device
    mesh42 = {"data": 4, "model": 2}
    prep = gen.prepare(target, prompts, draft=small_draft, max_new_tokens=8, mesh=mesh42)
    tparams, dparams = prep.placed_params()
    state, _ = loop.prefill_program(prep.spec, tparams, dparams, prep.inputs)
    k = state.target_cache.k
    assert k.sharding.spec == P(None, "data", None, "model", None)
    assert _per_device_bytes(k) == k.nbytes // 8
    dk = state.draft_state.k  # the draft's single kv head stays whole; its rows still split over data
    assert dk.sharding.spec == P(None, "data", None, None, None)
    assert _per_device_bytes(dk) == dk.nbytes // 4
    assert state.tokens.sharding.spec == P("data", None)
    assert _per_device_bytes(state.tokens) == state.tokens.nbytes // 4
    assert dparams["layers"][0]["mlp"]["up_proj"]["kernel"].sharding.spec == P(None, "model")  # draft sharded
    prep = gen.prepare(target, prompts, draft=small_draft, max_new_tokens=8, mesh=mesh42, shard_draft=False)
    assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves(prep.placed_params()[1]))


def test_load_into_layout(tmp_path, target):
    mesh = {"data": 2, "model": 4}
    ids = np.asarray([[3, 1, 4, 1, 5, 9, 2, 6]])
    want = np.asarray(target.logits(ids))
    jaxspec.save(target, tmp_path / "orbax")
    jaxspec.export_hf(target, tmp_path / "hf")
    for path in (tmp_path / "orbax", tmp_path / "hf"):
        model = jaxspec.load(path, mesh=mesh)
        q = model.params["layers"][0]["attn"]["q_proj"]["kernel"]
        assert q.sharding.spec == P(None, "model") and _per_device_bytes(q) == q.nbytes // 4, path
        assert model.params["embed"]["embedding"].sharding.spec == P("model", None)
        for a, b in zip(jax.tree.leaves(model.params), jax.tree.leaves(target.params)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_allclose(np.asarray(model.logits(ids)), want, atol=1e-5)


def test_mesh_errors_before_compiling(target, small_draft):
    with count_compiles() as counts:
        with pytest.raises(ValueError, match="unknown axis name.*'tensor'"):
            jaxspec.generate(target, [[1, 2]], mesh={"tensor": 8})
        with pytest.raises(ValueError, match=r"mesh \{'data': 3, 'model': 2\} has 6 devices but there are 8"):
            jaxspec.generate(target, [[1, 2]], mesh={"data": 3, "model": 2})
        with pytest.raises(ValueError, match="mesh axis 'model' must have an int size"):
            jaxspec.generate(target, [[1, 2]], mesh={"data": 8, "model": 0})
        with pytest.raises(ValueError, match="mesh must be"):
            jaxspec.generate(target, [[1, 2]], mesh=[2, 4])
        with pytest.raises(ValueError, match="shard_draft must be True or False"):
            jaxspec.generate(target, [[1, 2]], draft=small_draft, shard_draft="yes", mesh={"data": 8})
        with pytest.raises(ValueError, match=r"kv_heads \(2\) is not divisible by mesh axis 'model' \(size 4\)"):
            sharding.plan(target, {"data": 2, "model": 4}, strict=True)
    assert counts["compiles"] == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one(tmp_path, target, small_draft):
    """Two processes x 2 simulated CPU devices form one 4-device mesh (gloo collectives on loopback); each feeds
    its own prompts; both get every row, identical to one process on one device."""
    port, here = _free_port(), Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parent), os.environ.get("PYTHONPATH", "")])}
    # the workers set their own device count; the suite's compile flags (conftest) pass through
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env["XLA_FLAGS"] = " ".join(flags)
    procs = [
        subprocess.Popen(
            [sys.executable, str(here / "multihost_worker.py"), str(i), "2", str(port), str(tmp_path / f"out{i}.json")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for i in range(2)
    ]
    logs = [p.communicate(timeout=300)[0].decode() for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    outs = [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(2)]
    prompts = PROMPTS[0::2] + PROMPTS[1::2]  # process order
    kw = dict(draft=small_draft, max_new_tokens=12)
    greedy = jaxspec.generate(target, prompts, temperature=0.0, **kw).tokens
    sampled = jaxspec.generate(target, prompts, temperature=1.0, seed=7, **kw).tokens
    engine = jaxspec.Engine(target, draft=small_draft, gamma=4, slots=2)
    rows = {r.index: r.tokens for r in engine.run(engine_requests(prompts))}
    for i, out in enumerate(outs):
        assert out["devices"] == 4 and out["local_devices"] == 2
        assert out["prompts"] == prompts
        assert out["mine"] == ([0, 3] if i == 0 else [3, 6])
        assert out["greedy"] == greedy
        assert out["sampled"] == sampled
        assert out["engine"] == [rows[i] for i in range(len(prompts))]  # continuous batching across processes
