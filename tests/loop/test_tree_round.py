"""Tree rounds in the compiled loop (``jaxspec.loop.tree``): greedy output equals plain greedy decoding for every
path the acceptance can take (an oracle writes the target's own continuation along a path of varying ranks, so
rounds accept 0 to depth tokens, down first and later siblings), in ``generate``, ``stream``, the ``Engine``, on a
mesh and at the cache's end; the target cache after tree rounds equals a from-scratch pass over the accepted
tokens; new temperatures and seeds compile nothing."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import count_compiles, tiny_config

import jaxspec
from jaxspec import loop
from jaxspec.drafters import branching, eagle
from jaxspec.models import eagle as eagle_model
from jaxspec.models import eagle3, llama

PROMPTS = [[5, 9, 11, 3, 7, 21, 40, 2, 8], [3], [60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73], [17, 4]]
NEW = 30
SIZE = 64
GREEDY = dict(max_new_tokens=NEW, temperature=0.0, eos_token_id=(), max_length=SIZE)


@dataclasses.dataclass(frozen=True)
class OracleHead(eagle.EagleDrafter):
    """The head's own tree, with the target's greedy continuation (``params["oracle"] [B, S]``, each row's plain
    greedy tokens) written along one path: at each level, the child of the path's node whose rank is the row's
    length plus the level, modulo its number of children. Earlier siblings may hold the same token (then the walk
    takes them and stops sooner), and deep levels may lack the path's node: acceptance is ragged."""

    def prefill(self, params, prompt, positions, state):
        return super().prefill(params["head"], prompt, positions, state)

    def draft_tree(self, params, state, tokens, length, sampling, keys, vocab_size, *, depth, branch, width):
        tree = super().draft_tree(
            params["head"], state, tokens, length, sampling, keys, vocab_size, depth=depth, branch=branch, width=width
        )
        oracle, rows = params["oracle"], jnp.arange(tokens.shape[0])
        node, out = jnp.zeros_like(length), tree.tokens
        for d in range(depth):
            kids = (tree.parent == node[:, None]) & (node[:, None] >= 0)
            many = jnp.sum(kids, axis=1)
            rank = (length + d) % jnp.maximum(many, 1)
            hit = kids & (tree.rank == rank[:, None])
            pick = jnp.where(many > 0, jnp.argmax(hit, axis=1), -1)
            want = oracle[rows, jnp.minimum(length + d, oracle.shape[1] - 1)]
            out = jnp.where((jnp.arange(out.shape[1])[None] == pick[:, None]) & (pick[:, None] > 0), want[:, None], out)
            node = pick
        return tree._replace(tokens=out)


@pytest.fixture(scope="module")
def target():
    return llama.init(tiny_config(num_layers=4), seed=0, eos_token_id=1)


@pytest.fixture(scope="module")
def plain(target):
    return jaxspec.generate(target, PROMPTS, **GREEDY)


def _heads(target):
    cfg1 = eagle_model.head_config(target.config, vocab_ids=tuple(range(0, 96, 3)))
    one = eagle.EagleDrafter.for_target(target, eagle_model.init_own(cfg1, seed=1), config=cfg1, name="e1")
    cfg3 = eagle3.head_config(target.config, tuple(range(0, target.vocab_size, 2)))
    own = {k: v for k, v in eagle3.init_own(cfg3, seed=2).items() if k != "lm_head"}
    return {"eagle1": one, "eagle3": eagle.EagleDrafter.for_target(target, own, config=cfg3, name="e3")}


@pytest.fixture(scope="module")
def heads(target):
    return _heads(target)


def oracle(head, plain):
    table = np.zeros((len(PROMPTS), SIZE), np.int32)
    for i, (p, o) in enumerate(zip(PROMPTS, plain.tokens)):
        table[i, : len(p) + len(o)] = p + o
    fields = {f.name: getattr(head, f.name) for f in dataclasses.fields(eagle.EagleDrafter)}
    return OracleHead(**{**fields, "params": {"head": head.params, "oracle": jnp.asarray(table)}})


@pytest.mark.parametrize("kind, shape", [("eagle1", (3, 2, 3)), ("eagle3", (3, 3, 4)), ("eagle1", (1, 3, 1))])
def test_greedy_tree_equals_plain_on_every_path(target, heads, plain, kind, shape):
    head = oracle(heads[kind], plain)
    out = jaxspec.generate(target, PROMPTS, draft=head, tree=shape, **GREEDY)
    assert out.tokens == plain.tokens
    hist = out.stats.accept_hist
    assert out.stats.gamma == shape[0] and len(hist) == shape[0] + 1
    assert hist[-1] > 0 and (shape[0] == 1 or sum(hist[:-1]) > 0), hist  # the whole depth, and shorter paths
    if kind != "eagle1" or shape[0] == 1:
        return
    # the head alone (no oracle): the same tokens, mostly from rounds that accepted nothing
    alone = jaxspec.generate(target, PROMPTS, draft=heads[kind], tree=shape, **GREEDY)
    assert alone.tokens == plain.tokens and alone.stats.accept_hist[0] > 0


def test_a_draft_model_drafts_trees(target, plain):
    """A draft model branches too: its trees give plain greedy's tokens; with the target itself as the draft, a tree
    of one branch accepts its whole depth every round, so the draft's cache is right after tree rounds (each round
    reads the tokens the last one accepted again, as its nodes' entries sit at other slots)."""
    other = llama.init(tiny_config(num_layers=2), seed=5, eos_token_id=1)
    out = jaxspec.generate(target, PROMPTS, draft=other, tree=(3, 2, 3), **GREEDY)
    assert out.tokens == plain.tokens and out.stats.gamma == 3
    line = jaxspec.generate(target, PROMPTS, draft=target, tree=(3, 1, 1), **GREEDY)
    assert line.tokens == plain.tokens
    hist = line.stats.accept_hist
    assert hist[-1] > 0 and sum(hist[:-1]) == 0, hist


def test_engine_stream_and_mesh_with_a_tree_equal_plain(target, heads, plain):
    steps = jaxspec.stream(target, PROMPTS[0], draft=heads["eagle3"], tree=(3, 2, 3), **GREEDY)
    assert [t for step in steps for row in step.tokens for t in row] == plain.tokens[0]
    prompts = PROMPTS * 2
    want = plain.tokens * 2
    engine = jaxspec.Engine(target, draft=heads["eagle3"], tree=(3, 2, 3), slots=4, **GREEDY)
    rows = sorted(engine.run(prompts), key=lambda r: r.index)
    assert [r.tokens for r in rows] == want and sum(r.stats.drafted for r in rows) > 0
    meshed = jaxspec.generate(
        target, PROMPTS, draft=heads["eagle1"], tree=(3, 2, 3), mesh={"data": 4, "model": 2}, **GREEDY
    )
    assert meshed.tokens == plain.tokens


def test_a_tree_at_the_cache_end(target, heads):
    """Rows that run into the end of a short cache: tree nodes whose slots fall past it are left out, the output
    is still plain greedy's, cut where plain's is."""
    kwargs = dict(max_new_tokens=NEW, temperature=0.0, eos_token_id=(), max_length=24)
    want = jaxspec.generate(target, PROMPTS, **kwargs)
    got = jaxspec.generate(target, PROMPTS, draft=heads["eagle1"], tree=(4, 3, 5), **kwargs)
    assert got.tokens == want.tokens and got.finish_reasons == want.finish_reasons
    assert "cache" in got.finish_reasons


def test_target_cache_after_tree_rounds_equals_a_fresh_pass(target, heads, plain):
    """After each of several tree rounds, the target's cache over the verified prefix (positions 0 .. L-2) holds
    what one pass over the accepted tokens writes, and the head's feature buffer the target's features there."""
    head = oracle(heads["eagle3"], plain)
    kw = dict(draft=head, tree=(3, 2, 3), **GREEDY)
    from jaxspec.generation.generate import prepare

    prep = prepare(target, PROMPTS, **kw)
    spec, inputs = prep.spec, prep.inputs
    state = jax.jit(loop.prefill, static_argnums=0)(spec, target.params, head.params, inputs)
    step = jax.jit(loop.round_step, static_argnums=0)
    passes = jax.jit(head.target_features)
    for _ in range(3):
        state = step(spec, target.params, head.params, state)
        length = np.asarray(state.length)
        # one pass over every row's tokens (entries at positions < L-1 depend on the tokens before them only)
        positions = jnp.broadcast_to(jnp.arange(SIZE)[None], state.tokens.shape)
        _, feats, fresh = passes(target.params, state.tokens, positions, target.init_cache(len(PROMPTS), SIZE))
        for b in range(len(PROMPTS)):
            n = length[b] - 1
            for got, ref in ((state.target_cache.k, fresh.k), (state.target_cache.v, fresh.v)):
                np.testing.assert_allclose(np.asarray(got[:, b, :n]), np.asarray(ref[:, b, :n]), atol=2e-5)
            np.testing.assert_allclose(np.asarray(state.draft_state.feats[b, :n]), np.asarray(feats[b, :n]), atol=2e-5)
    assert int(np.sum(state.accepted)) > 2 * len(PROMPTS)  # the rounds did move down the trees


def test_temperatures_and_seeds_compile_nothing_new(target, heads):
    head = heads["eagle1"]
    kw = dict(draft=head, tree=(2, 2, 2), max_new_tokens=8, eos_token_id=(), max_length=SIZE)
    jaxspec.generate(target, PROMPTS, temperature=0.0, seed=0, **kw)
    with count_compiles() as c:
        for t, seed in ((1.0, 1), (0.7, 2), (0.0, 3)):
            jaxspec.generate(target, PROMPTS, temperature=t, seed=seed, top_k=[0, 3, 0, 5], **kw)
    assert c["compiles"] == 0, c


def test_tree_settings_are_checked(target, heads):
    head = heads["eagle1"]
    for bad in [(0, 2, 2), (2, 2), "3,2,2", (2, 2, 5), (2.0, 2, 2), (True, 2, 2)]:
        with pytest.raises(ValueError, match="tree"):
            jaxspec.generate(target, PROMPTS, draft=head, tree=bad, max_new_tokens=4)
    for bad in ["3,2", "3,2,x", "0,2,2", "2,2,5"]:  # the CLI's --tree and the bench's --trees
        with pytest.raises(ValueError, match="tree"):
            branching.parse_tree(bad)
    assert branching.parse_tree("5,3,6") == (5, 3, 6)
    with pytest.raises(ValueError, match="tree"):
        jaxspec.generate(target, PROMPTS, draft="prompt_lookup", tree=(2, 2, 2), max_new_tokens=4)
    with pytest.raises(ValueError, match="depth"):
        jaxspec.generate(target, PROMPTS, draft=head, tree=(2, 2, 2), gamma=3, max_new_tokens=4)
    with pytest.raises(ValueError, match="chooses among its policy.s trees"):
        jaxspec.generate(target, PROMPTS, draft=head, tree=(2, 2, 2), gamma="auto", max_new_tokens=4)
