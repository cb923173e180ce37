"""Shared training pieces (jaxspec.training, jaxspec.training.losses): one optimizer whether its schedule is given as
numbers or traced arrays, one checkpoint layout that resumes, masked means that ignore padding."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxspec.training import common as training
from jaxspec.training import losses


def _params():
    rng = np.random.default_rng(0)
    return {"w": jnp.asarray(rng.standard_normal((4, 3)), jnp.float32), "b": jnp.zeros((3,), jnp.float32)}


def _loss(params, x):
    return jnp.sum((x @ params["w"] + params["b"]) ** 2)


def test_optimizer_numbers_and_traced_arrays_agree_and_share_the_state_structure():
    params, x = _params(), jnp.ones((2, 4), jnp.float32)
    static = training.make_optimizer(1e-2, 3, 20, weight_decay=0.1, b2=0.95)
    schedule = jnp.asarray([1e-2, 3, 20], jnp.float32)

    @jax.jit
    def traced_step(params, opt_state, schedule):
        opt = training.make_optimizer(*schedule, weight_decay=0.1, b2=0.95)
        return training.optimizer_step(_loss, opt, params, opt_state, x)

    a = b = params
    sa = static.init(params)
    sb = training.make_optimizer(*schedule, weight_decay=0.1, b2=0.95).init(params)
    assert jax.tree.structure(sa) == jax.tree.structure(sb)  # the same checkpoint either way
    for _ in range(8):
        a, sa, _ = jax.jit(lambda p, s: training.optimizer_step(_loss, static, p, s, x))(a, sa)
        b, sb, _ = traced_step(b, sb, schedule)
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-7)
    assert not np.allclose(a["w"], params["w"])
    # the schedule itself is optax's warmup + cosine decay to a tenth
    reference = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 3, 20, 1e-3)
    for count in (0, 2, 3, 10, 20, 25):
        np.testing.assert_allclose(training.learning_rate_at(count, 1e-2, 3, 20), reference(count), rtol=1e-5)


def test_checkpoints_resume_the_latest_step_and_refuse_another_model(tmp_path):
    params = _params()
    opt = training.make_optimizer(1e-2, 0, 10)
    state = {"params": params, "opt_state": opt.init(params)}
    with training.Checkpoints(tmp_path / "run") as ckpt:
        template, step = ckpt.restore(state)
        assert template is state and step == 0  # nothing saved yet: the template, step 0
        for step in (2, 4, 6):
            ckpt.save(step, {**state, "params": jax.tree.map(lambda a, s=step: a + s, params)})
    assert sorted(int(p.name) for p in (tmp_path / "run").iterdir()) == [4, 6]  # max_to_keep=2
    with training.Checkpoints(tmp_path / "run") as ckpt:
        restored, step = ckpt.restore(state)
    assert step == 6 and set(restored) == {"params", "opt_state"}
    np.testing.assert_array_equal(restored["params"]["w"], params["w"] + 6)
    other = {"params": {"w": jnp.zeros((5, 3))}, "opt_state": state["opt_state"]}
    with training.Checkpoints(tmp_path / "run") as ckpt:
        with pytest.raises(
            ValueError, match=r"out_dir .* holds a checkpoint \(step 6\) that does not match this draft"
        ):
            ckpt.restore(other, name="out_dir", what="this draft")
    assert [training.due(d, 3, 7) for d in range(1, 8)] == [False, False, True, False, False, True, True]


def test_weighted_mean_and_token_nll():
    values = jnp.asarray([[1.0, 2.0, 100.0]])
    assert float(losses.weighted_mean(values, jnp.asarray([[1.0, 0.5, 0.0]]))) == pytest.approx(2.0 / 1.5)
    assert float(losses.weighted_mean(values, jnp.zeros((1, 3)))) == 0.0  # nothing trained on: 0, not NaN
    logits = jnp.log(jnp.asarray([[[0.5, 0.25, 0.25]]]))
    np.testing.assert_allclose(losses.token_nll(logits, jnp.asarray([[1]])), [[np.log(4)]], rtol=1e-6)
