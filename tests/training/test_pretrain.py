"""Training recipe of the shipped pair: loss goes down, a killed run resumes to the same parameters."""

import json

import jax
import numpy as np
import pytest

from jaxspec.core.model import full_logits
from jaxspec.models import families, llama
from jaxspec.training import corpus
from jaxspec.training import pretrain as train

TINY = llama.LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1)


@pytest.fixture
def run_dir(tmp_path):
    # a learnable stream: a repeating pattern with a little noise
    rng = np.random.default_rng(0)
    data = np.tile(np.arange(32, dtype=np.int32), 300)
    data[rng.random(data.shape) < 0.05] = 0
    np.save(tmp_path / "train.npy", data)
    np.save(tmp_path / "heldout.npy", data[:2000])
    return tmp_path


def _cfg(steps, **kw):
    return train.TrainConfig(
        steps=steps, batch_size=4, seq_len=32, learning_rate=1e-2, warmup=2, checkpoint_every=3, eval_every=6, **kw
    )


def test_loss_goes_down(run_dir):
    train.train(run_dir, "target", _cfg(12), TINY)
    log = [json.loads(line) for line in (run_dir / "target_log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 12 and log[-1]["heldout_loss"] < np.log(32) * 0.8


def test_resume_reproduces_uninterrupted_run(tmp_path, run_dir, capsys):
    straight = train.train(run_dir, "target", _cfg(9), TINY)["params"]
    other = tmp_path / "interrupted"
    other.mkdir()
    for f in ("train.npy", "heldout.npy"):
        (other / f).write_bytes((run_dir / f).read_bytes())
    _train_until(other, _cfg(9), stop_after=6)  # interrupted after the step-6 checkpoint
    capsys.readouterr()
    resumed = train.train(other, "target", _cfg(9), TINY)["params"]  # the same command again resumes
    assert "resumed target at step 6" in capsys.readouterr().out
    for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _train_until(run, cfg, stop_after):
    """Run the real training loop and interrupt it (as a kill would) once ``stop_after`` steps are saved."""
    original = train.batch_at

    def batch_then_die(data, c, step):
        if step == stop_after:
            raise KeyboardInterrupt
        return original(data, c, step)

    train.batch_at = batch_then_die
    try:
        with pytest.raises(KeyboardInterrupt):
            train.train(run, "target", cfg, TINY)
    finally:
        train.batch_at = original


def test_heldout_split_is_stable_and_disjoint():
    names = [f"stdlib/mod{i}.py" for i in range(2000)]
    held = [n for n in names if corpus.is_heldout(n)]
    assert 20 < len(held) < 120  # about 3 %
    assert held == [n for n in names if corpus.is_heldout(n)]


def test_missing_docs_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(corpus, "DOC_GLOB", "/nonexistent/python3*/html/_sources")
    with pytest.raises(FileNotFoundError, match="apt-get install python3-doc"):
        corpus.corpus_files("train")


def test_distillation_and_export(run_dir):
    """A draft distilled from a trained teacher ends closer to it than before; the export loads and generates."""
    from helpers import tiny_hf_tokenizer

    import jaxspec

    train.train(run_dir, "target", _cfg(12), TINY)
    (run_dir / "target_config.json").write_text(json.dumps(__import__("dataclasses").asdict(TINY)))
    teacher, _, _ = train.latest_params(run_dir, "target")
    student_cfg = llama.LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_layers=1,
        num_heads=1,
        num_kv_heads=1,
        tie_embeddings=True,
    )
    batch = train.batch_at(np.load(run_dir / "heldout.npy"), _cfg(1), 0)
    t_logits = full_logits(*llama.model_fns(TINY), teacher, batch[:, :-1])

    def kl(params):
        s_logits = full_logits(*llama.model_fns(student_cfg), params, batch[:, :-1])
        p = jax.nn.softmax(t_logits)
        return float((p * (jax.nn.log_softmax(t_logits) - jax.nn.log_softmax(s_logits))).sum(-1).mean())

    before = kl(llama.init_params(student_cfg, 0))
    out = train.train(run_dir, "draft", _cfg(30), student_cfg, teacher="target")
    after = kl(out["params"])
    print(f"KL(teacher || student): {before:.4f} -> {after:.4f}")
    assert after < 0.5 * before

    tiny_hf_tokenizer(vocab_size=32).save_pretrained(run_dir / "tokenizer")
    path = train.export(run_dir, "target", run_dir / "export")
    model = jaxspec.load(path)
    loaded = families.stack_layers(model.params)  # loaded split per layer; the teacher was trained stacked
    assert jax.tree.structure(loaded) == jax.tree.structure(teacher)
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(teacher), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert model.tokenizer is not None and model.eos_token_id == model.tokenizer.eos_token_id
    assert len(jaxspec.generate(model, "def f", max_new_tokens=5, temperature=0).tokens[0]) >= 1
