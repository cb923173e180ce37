"""EAGLE-style drafting: a small head (``jaxspec.models.eagle``) drafts from the target's own hidden features.

    head = jaxspec.eagle.load("jaxspec/smollm2-eagle3", target)     # or EagleDrafter.for_target(target, own_params)
    result = jaxspec.generate(target, prompts, draft=head, gamma=4)

How it runs in the loop (``jaxspec.loop``; the ``Drafter`` protocol's feature hooks): every target pass (prefill
and verify) also returns the final-norm hidden states, which ``observe`` writes into the drafter's feature buffer
at their positions. With ``L`` tokens in a row, the target's features are known (and verified) for positions
``<= L-2`` (the newest token ``L-1`` is fed by the coming verify pass). A round's first head pass reads the window
of pairs ``(f_j, token j+1)`` for ``j = L-2-γ .. L-2``: it rewrites the head's cache over every position a
previous round drafted from its own predicted features, and its last output predicts token ``L`` (the first
draft). Each further step feeds back the head's predicted feature with the token just drafted. Features of
rejected drafts, written past the accepted prefix, are overwritten by the next verify pass before any read.

The draft distribution q is the head's warped softmax (restricted to its draft vocabulary: q = 0 elsewhere), so
the rejection sampler stays exact: output has the target's distribution whatever the head's quality. A head
samples at the call's temperature times its ``temperature_scale`` (1 unless set; greedy stays greedy): a head
trained by cross-entropy is flatter than the target where it is unsure, and a sharper q can accept more at
temperature 1. ``jaxspec.training.eagle.tune_temperature_scale`` picks it on held-out records; it is saved with the
head. A tree draws each node's children without replacement and tries them in turn, so the q that suits it may not
be a chain's: a head's trees draft at its ``tree_temperature_scale`` (its ``temperature_scale`` unless set).

A draft vocabulary leaves out rare ids, and a row's own context is where rare ids recur (a prompt's identifiers,
copied into the answer). An EAGLE-3 head whose LM head is the target's, over a target that ties it to its
embedding, also drafts the ids of the row's context (prompt and output so far) that its vocabulary lacks, up to
``context_vocab`` of them a round, their logits from the same LM head's columns; q is still a distribution, so
exactness does not depend on it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxspec.core.cache import KVCache
from jaxspec.core.model import CausalLM
from jaxspec.core.sampling import sample, warp
from jaxspec.drafters import branching
from jaxspec.drafters.base import Drafter, Proposal, TreeProposal, bad_logits
from jaxspec.drafters.branching import check_tree
from jaxspec.formats import eagle3 as eagle3_format
from jaxspec.formats import eagle_head, hub
from jaxspec.formats.paths import is_head, resolve
from jaxspec.models import eagle as eagle_model
from jaxspec.models import eagle3, families, llama, quant

__all__ = ["CONTEXT_VOCAB", "EagleDrafter", "EagleState", "is_head", "load", "save"]

CONTEXT_VOCAB = 128  # context ids outside the draft vocabulary an EAGLE-3 head drafts (EagleDrafter.context_vocab)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EagleState:
    """The drafter's state: the head's KV cache and the target's features ``[B, S, hidden]`` by position."""

    cache: KVCache
    feats: jax.Array


@dataclasses.dataclass(frozen=True)
class EagleDrafter(Drafter):
    """An EAGLE head for one target (static and hashable; its weights, ``params``, are not part of the key).

    Attributes:
      config: the head's config: a ``LlamaConfig`` for an EAGLE-1-style head (``jaxspec.models.eagle.head_config``:
        the target's final-norm feature in, features predicted), an ``Eagle3Config`` for an EAGLE-3 head
        (``jaxspec.models.eagle3``: the target's low/middle/high layers fused in, tokens predicted).
      target_config: the config of the target it was made for (``generate`` refuses another).
      params: the head's own parameters with the target's embedding and restricted LM head (``shared_params``).
      name: for messages and statistics.
      temperature_scale: the head drafts at the call's temperature times this (a finite number > 0; q changes,
        the output's distribution does not). Part of the compiled program: another value compiles anew.
      tree_temperature_scale: the same for the trees it drafts (None: ``temperature_scale``): a node's children
        are drawn without replacement and tried in turn, so the best q for a tree may not be a chain's
        (``jaxspec.training.eagle3.tune_tree_temperature_scale`` measures it on held-out records).
      catch_up: the first pass reads at least this many of the newest verified pairs (``catching_up``: for rounds
        that may have verified more than γ+1 tokens since the head last drafted, as under ``LookupFirst``).
      shared_lm_head: an EAGLE-3 head whose LM head is the target's at the draft vocabulary's columns (not
        trained, not stored: ``save`` leaves it out and ``load`` takes it from the target).
      context_vocab: an EAGLE-3 head drafts, besides its draft vocabulary, up to this many ids of each row's context
        that the vocabulary lacks (``eagle3.context``; 0: none). ``for_target`` sets ``CONTEXT_VOCAB`` where the
        LM head and the embedding are the target's and the target ties them (the extra ids' columns are then
        the LM head's), else 0. Part of the compiled program.
      tree: ``(depth, branch, width)``: each round drafts a tree (``draft_tree``) that one target pass verifies
        (``jaxspec.loop.tree``), its γ the tree's depth; None (the default): a chain of γ drafts. Set by
        ``with_tree`` or ``generate(..., tree=...)``.
    """

    config: llama.LlamaConfig | eagle3.Eagle3Config
    target_config: llama.LlamaConfig
    params: Any = dataclasses.field(default=None, compare=False, repr=False)
    name: str = "eagle"
    temperature_scale: float = 1.0
    tree_temperature_scale: float | None = None
    catch_up: int = 0
    shared_lm_head: bool = dataclasses.field(default=False, compare=False)
    context_vocab: int = 0
    tree: tuple[int, int, int] | None = None
    features = True

    @property
    def default_gamma(self) -> int:  # type: ignore[override]  # (a class attribute in Drafter)
        """The γ of a call that names none: 2 for an EAGLE-1-style head, whose acceptance falls along a draft (its
        later steps read its own features), 3 for an EAGLE-3 head, trained on its own outputs, whose acceptance
        holds (docs/history/eagle3.md: the best chain on HumanEval at temperature 0 and 1 alike)."""
        return 3 if isinstance(self.config, eagle3.Eagle3Config) else 2

    def __post_init__(self):
        for field in ("temperature_scale", "tree_temperature_scale"):
            scale = getattr(self, field)
            if scale is None and field == "tree_temperature_scale":
                continue
            if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < float("inf"):
                raise ValueError(f"{field} must be a finite number > 0, got {scale!r}")
            object.__setattr__(self, field, float(scale))
        context = self.context_vocab
        if isinstance(context, bool) or not isinstance(context, int) or context < 0:
            raise ValueError(f"context_vocab must be an int >= 0, got {context!r}")
        if context and not isinstance(self.config, eagle3.Eagle3Config):
            raise ValueError("context_vocab: only an EAGLE-3 head drafts context ids (this head is EAGLE-1-style)")
        if self.tree is not None:
            object.__setattr__(self, "tree", check_tree(self.tree))

    def with_tree(self, tree) -> EagleDrafter:
        """A copy drafting trees of shape ``tree = (depth, branch, width)`` each round (None: chains)."""
        return dataclasses.replace(self, tree=None if tree is None else check_tree(tree))

    @classmethod
    def for_target(
        cls, target: CausalLM, own, *, config=None, name: str = "eagle", temperature_scale: float = 1.0
    ) -> EagleDrafter:
        """The drafter of head weights ``own`` on ``target`` (a Llama-family ``CausalLM``). EAGLE-1-style (``config``
        a ``LlamaConfig``, default a one-layer head over the full vocabulary): ``own`` holds ``fc``, ``layers``
        (stacked or split), ``final_norm``. EAGLE-3 (``config`` an ``Eagle3Config``): ``fc``, ``layer``,
        ``final_norm``, ``lm_head`` (without it: the target's at the draft vocabulary's columns, ``shared_lm_head``),
        and ``embed`` when the head brings its own (else the target's is read)."""
        cfg = config or eagle_model.head_config(target.config)
        if isinstance(cfg, eagle3.Eagle3Config):
            check_eagle3(cfg, target)
            borrowed = [k for k in ("embed", "lm_head") if k not in own]  # read from the target
            if borrowed and cfg.hidden_size != target.config.hidden_size:
                raise ValueError(
                    f"the EAGLE-3 head is {cfg.hidden_size} wide and brings no {' or '.join(borrowed)}; target "
                    f"{target.name!r}'s are {target.config.hidden_size} wide"
                )
            params = {k: own[k] for k in eagle3.OWN if k not in borrowed}
            if "embed" in own:
                params["embed"] = own["embed"]
            else:  # the target's table, int8 with its row scales where the target is quantized
                params["embed"] = target.params["embed"]["embedding"]
                scale, suffix = quant.scale_of(target.params["embed"], "embedding")
                if scale is not None:
                    params["embed" + suffix] = scale
            if "lm_head" in borrowed:
                columns = eagle3.target_head_columns(cfg, target.config, target.params)
                params["lm_head"] = columns.astype(cfg.jnp_dtype)
            tied = not {"embed", "lm_head"} - set(borrowed) and target.config.tie_embeddings
            return cls(
                cfg,
                target.config,
                params,
                name,
                temperature_scale,
                shared_lm_head="lm_head" in borrowed,
                context_vocab=CONTEXT_VOCAB if tied else 0,
            )
        shared = eagle_model.shared_params(cfg, target.params)
        own = families.split_layers({k: own[k] for k in eagle_model.OWN})
        return cls(cfg, target.config, {**own, **shared}, name, temperature_scale)

    def catching_up(self, new: int) -> EagleDrafter:
        """A copy whose window pass reads (at least) the ``new`` newest verified pairs."""
        return dataclasses.replace(self, catch_up=max(self.catch_up, new))

    def _apply_fn(self, params, tokens, length) -> Callable:
        """The head's forward pass for a round's drafting: with the rows' context ids (``context_vocab``)."""
        apply_fn, _ = _head_fns(self.config)
        if not self.context_vocab:
            return apply_fn
        assert isinstance(self.config, eagle3.Eagle3Config)  # __post_init__ refuses context_vocab elsewhere
        return functools.partial(
            apply_fn, extra=eagle3.context(self.config, params, tokens, length, self.context_vocab)
        )

    def _sampling(self, sampling, scale: float):
        """The call's sampling parameters at the head's temperature (``temperature × scale``)."""
        if scale == 1.0:
            return sampling
        return dataclasses.replace(sampling, temperature=sampling.temperature * scale)

    @property
    def tree_scale(self) -> float:
        """The temperature scale its trees draft at: ``tree_temperature_scale``, else ``temperature_scale``."""
        return self.temperature_scale if self.tree_temperature_scale is None else self.tree_temperature_scale

    @property
    def eagle3(self) -> bool:
        """Whether this is an EAGLE-3 head."""
        return isinstance(self.config, eagle3.Eagle3Config)

    @property
    def target_features(self) -> Callable:
        """The target's forward pass that also returns the features the head reads: its final-norm hidden states
        (``llama.features_fn``), or for an EAGLE-3 head those entering its ``aux_layers`` (``llama.taps_fn``)."""
        if isinstance(self.config, eagle3.Eagle3Config):
            return llama.taps_fn(self.target_config, self.config.aux_layers)
        return llama.features_fn(self.target_config)

    def init_state(self, batch: int, cache_len: int) -> EagleState:
        """An empty head cache and feature buffer."""
        cfg = self.config
        _, init_cache = _head_fns(cfg)
        width = cfg.feature_size if isinstance(cfg, eagle3.Eagle3Config) else cfg.hidden_size
        return EagleState(init_cache(batch, cache_len), jnp.zeros((batch, cache_len, width), cfg.jnp_dtype))

    def observe(self, state: EagleState, feats, positions) -> EagleState:
        """The target's features ``[B, T, hidden]`` written at ``positions [B, T]`` (past the end: dropped)."""
        rows = jnp.arange(feats.shape[0])[:, None]
        return dataclasses.replace(
            state, feats=state.feats.at[rows, positions].set(feats.astype(state.feats.dtype), mode="drop")
        )

    def prefill(self, params, prompt, positions, state: EagleState) -> EagleState:
        """The head's cache over the pairs ``(f_{p-1}, token p)`` for the tokens ``prompt`` at ``positions``: each
        pair joins a token to the feature before it, written by ``observe`` for this part of the prompt or an
        earlier one, so the prompt may come in consecutive chunks. The pair of position -1 does not exist (its
        write is dropped); the pairs of a prompt's last positions are rewritten by the first round's window."""
        apply_fn, _ = _head_fns(self.config)
        size = state.feats.shape[1]
        rows = jnp.arange(prompt.shape[0])[:, None]
        before = positions - 1
        feats = state.feats[rows, jnp.maximum(before, 0)]
        _, _, cache = apply_fn(params, prompt, feats, jnp.where(before < 0, size, before), state.cache)
        return dataclasses.replace(state, cache=cache)

    def draft(self, params, state: EagleState, tokens, length, sampling, keys, vocab_size: int) -> Proposal:
        """A window pass over the γ+1 newest verified pairs (the ``catch_up`` newest, if more), then γ-1 steps on
        the head's own features."""
        apply_fn = self._apply_fn(params, tokens, length)
        sampling = self._sampling(sampling, self.temperature_scale)
        gamma = keys.shape[1]
        batch, size = tokens.shape
        rows = jnp.arange(batch)[:, None]
        reach = max(gamma, self.catch_up - 1)  # the window holds reach + 1 pairs
        window = jnp.maximum(length[:, None] - 2 - reach + jnp.arange(reach + 1, dtype=jnp.int32)[None], 0)
        following = tokens[rows, jnp.minimum(window + 1, size - 1)]
        logits, feats, cache = apply_fn(
            params, following, state.feats[rows, window], window, state.cache, last_only=True
        )
        q0 = warp(logits[:, -1], sampling)
        d1 = jax.vmap(sample)(keys[:, 0], q0)
        bad = bad_logits(logits[:, -1])

        def step(carry, xs):
            cache, tok, feat, bad, sampling = carry
            key, offset = xs
            pos = (length - 2 + offset)[:, None]
            logits, feats, cache = apply_fn(params, tok[:, None], feat[:, None], pos, cache)
            q = warp(logits[:, 0], sampling)
            nxt = jax.vmap(sample)(key, q)
            return (cache, nxt, feats[:, 0], bad | bad_logits(logits[:, 0]), sampling.advanced(nxt)), (nxt, q)

        (cache, _, _, bad, _), (rest, q_rest) = jax.lax.scan(
            step,
            (cache, d1, feats[:, -1], bad, sampling.advanced(d1)),
            (keys[:, 1:].T, jnp.arange(1, gamma, dtype=jnp.int32)),
        )
        drafts = jnp.concatenate([d1[:, None], rest.T], axis=1)
        q = jnp.concatenate([q0[:, None], jnp.swapaxes(q_rest, 0, 1)], axis=1)
        return Proposal(drafts, q, dataclasses.replace(state, cache=cache), bad)

    def draft_tree(
        self,
        params,
        state: EagleState,
        tokens,
        length,
        sampling,
        keys,
        vocab_size: int,
        *,
        depth: int,
        branch: int,
        width: int,
    ) -> TreeProposal:
        """A draft tree per row (``keys [B, depth]``, one per level and row; how it grows: ``branching.grow``). The
        window pass as ``draft``'s gives the root's distribution and features; a node's pass reads its token and its
        parent's features from the head's pass over the parent (the root's: the window's last)."""
        apply_fn = self._apply_fn(params, tokens, length)
        sampling = self._sampling(sampling, self.tree_scale)
        batch, size = tokens.shape
        rows = jnp.arange(batch)[:, None]
        reach = max(depth, self.catch_up - 1)
        window = jnp.maximum(length[:, None] - 2 - reach + jnp.arange(reach + 1, dtype=jnp.int32)[None], 0)
        following = tokens[rows, jnp.minimum(window + 1, size - 1)]
        logits, feats, cache = apply_fn(
            params, following, state.feats[rows, window], window, state.cache, last_only=True
        )
        nodes = branch + (depth - 1) * width
        hidden = jnp.zeros((batch, nodes + 1, feats.shape[-1]), feats.dtype).at[:, 0].set(feats[:, -1])

        def level_pass(carry, node_tokens, parent, first, positions):
            hidden, cache = carry
            out, own_feats, cache = apply_fn(
                params, node_tokens, hidden[rows, jnp.maximum(parent, 0)], positions, cache
            )
            hidden = jax.lax.dynamic_update_slice_in_dim(hidden, own_feats.astype(hidden.dtype), first, axis=1)
            return out, (hidden, cache)

        # node i at slot L-2+i: the head's verified pairs end at position L-2
        node_tok, parent, rank, q, (_, cache), bad = branching.grow(
            logits[:, -1],
            level_pass,
            (hidden, cache),
            sampling,
            keys,
            length - 1,
            depth=depth,
            branch=branch,
            width=width,
        )
        return TreeProposal(node_tok, parent, rank, q, dataclasses.replace(state, cache=cache), bad)

    def as_model(self) -> CausalLM:
        """The head as a ``CausalLM`` over tokens alone (zero features in place of the target's), for timing its
        steps (``jaxspec.bench``): the same shapes and work as a drafting step, meaningless outputs."""
        apply_fn, init_cache = _timing_fns(self.config)
        return CausalLM(apply_fn, self.params, init_cache, self.config.vocab_size, config=self.config, name=self.name)

    def check_target(self, target: CausalLM) -> None:
        """``ValueError`` unless ``target`` is the model this head was made for (same config)."""
        if target.config != self.target_config:
            raise ValueError(
                f"draft: the EAGLE head {self.name!r} was made for another target than {target.name!r} "
                "(configs differ); load it with jaxspec.eagle.load(path, target)"
            )


def _head_fns(cfg):
    """``(apply_fn, init_cache)`` of either kind of head config."""
    return eagle3.head_fns(cfg) if isinstance(cfg, eagle3.Eagle3Config) else eagle_model.head_fns(cfg)


@functools.cache
def _timing_fns(cfg):
    head_apply, init_cache = _head_fns(cfg)

    def apply_fn(params, tokens, positions, cache):
        feats = jnp.zeros((*tokens.shape, cfg.hidden_size), cfg.jnp_dtype)
        logits, _, cache = head_apply(params, tokens, feats, positions, cache)
        return logits, cache

    return apply_fn, init_cache


def check_eagle3(cfg: eagle3.Eagle3Config, target: CausalLM) -> None:
    """``ValueError`` unless an EAGLE-3 head of ``cfg`` fits ``target``: a Llama-family model whose vocabulary,
    width and depth match what the head reads."""
    tc = target.config
    if not isinstance(tc, llama.LlamaConfig):
        raise ValueError(f"an EAGLE-3 head needs a Llama-family target, {target.name!r} is {type(tc).__name__}")
    problems = []
    if tc.vocab_size != cfg.vocab_size:
        problems.append(f"vocabulary {cfg.vocab_size} (target {tc.vocab_size})")
    if tc.hidden_size != cfg.target_hidden:
        problems.append(f"target features {cfg.target_hidden} wide (target hidden_size {tc.hidden_size})")
    if max(cfg.aux_layers) > tc.num_layers:
        problems.append(f"aux_layers {cfg.aux_layers} (target has {tc.num_layers} layers)")
    if tc.vocab_ids:
        problems.append("a target with a reduced vocabulary")
    if problems:
        raise ValueError(f"the EAGLE-3 head does not fit target {target.name!r}: " + "; ".join(problems))


def save(drafter: EagleDrafter, path) -> Path:
    """Write the head's own weights and metadata to directory ``path`` (``jaxspec.formats.eagle_head``); the
    target's embedding (and for an EAGLE-1-style head, or an EAGLE-3 head with ``shared_lm_head``, its LM head)
    is not stored."""
    if isinstance(drafter.config, eagle3.Eagle3Config):
        cfg = drafter.config
        lc = cfg.layer
        meta = {
            "name": drafter.name,
            "architecture": "eagle3",
            "aux_layers": list(cfg.aux_layers),
            "target_hidden": cfg.target_hidden,
            "vocab_ids": list(cfg.vocab_ids),
            "hidden_size": lc.hidden_size,
            "intermediate_size": lc.intermediate_size,
            "norm_before_residual": cfg.norm_before_residual,
            "temperature_scale": drafter.temperature_scale,
            "lm_head": "target" if drafter.shared_lm_head else "own",
        }
        if drafter.tree_temperature_scale is not None:
            meta["tree_temperature_scale"] = drafter.tree_temperature_scale
        keep = [k for k in eagle3.OWN if k != "lm_head" or not drafter.shared_lm_head]
        return eagle_head.write(path, {k: drafter.params[k] for k in keep}, meta)
    own = families.stack_layers({k: drafter.params[k] for k in eagle_model.OWN})
    meta = {
        "name": drafter.name,
        "num_layers": drafter.config.num_layers,
        "vocab_ids": list(drafter.config.vocab_ids),
        "hidden_size": drafter.config.hidden_size,
        "temperature_scale": drafter.temperature_scale,
    }
    if drafter.tree_temperature_scale is not None:
        meta["tree_temperature_scale"] = drafter.tree_temperature_scale
    return eagle_head.write(path, own, meta)


def load(
    path,
    target: CausalLM,
    *,
    temperature_scale: float | None = None,
    tree_temperature_scale: float | None = None,
    revision: str | None = None,
) -> EagleDrafter:
    """The head at ``path`` on ``target``: a directory saved by ``save`` (or ``jaxspec/<name>`` in the shipped
    checkpoints), drafting at its saved ``temperature_scale`` and ``tree_temperature_scale`` unless given (1 and
    the chains' scale for heads saved without them);
    or a published EAGLE-3 checkpoint as it is (``jaxspec.formats.eagle3``: the speculators layout or the EAGLE
    authors'), a directory or a Hugging Face id (``owner/name``, fetched once into the Hugging Face cache,
    ``revision`` a branch, tag or commit). ``ValueError`` for a directory that is neither, or a head that does not
    fit ``target``."""
    local = resolve(path)
    if not local.exists() and hub.is_repo_id(str(path)):
        local = hub.snapshot(str(path), revision=revision)
    if eagle3_format.is_eagle3(local) and not is_head(local):
        cfg3, own3 = eagle3_format.read(local, target.config)
        dtype = target.config.jnp_dtype
        own3 = jax.tree.map(lambda x: jnp.asarray(x, dtype), own3)
        layer = dataclasses.replace(cfg3.layer, dtype=target.config.dtype)
        cfg3 = dataclasses.replace(cfg3, layer=layer)
        name = str(path).rstrip("/").split("/")[-1]
        scale = 1.0 if temperature_scale is None else temperature_scale
        head = EagleDrafter.for_target(target, own3, config=cfg3, name=name, temperature_scale=scale)
        return dataclasses.replace(head, tree_temperature_scale=tree_temperature_scale)
    path, meta, own = eagle_head.read(path)
    if meta["hidden_size"] != getattr(target.config, "hidden_size", None):
        raise ValueError(
            f"the EAGLE head at {path} has hidden_size {meta['hidden_size']}, target {target.name!r} has "
            f"{getattr(target.config, 'hidden_size', None)}: it was made for another target"
        )
    cfg: llama.LlamaConfig | eagle3.Eagle3Config
    if meta.get("architecture") == "eagle3":
        cfg = eagle3.head_config(
            target.config,
            meta["vocab_ids"],
            aux_layers=tuple(meta["aux_layers"]),
            intermediate_size=meta["intermediate_size"],
            norm_before_residual=meta["norm_before_residual"],
        )
    else:
        cfg = eagle_model.head_config(target.config, num_layers=meta["num_layers"], vocab_ids=meta["vocab_ids"])
    own = jax.tree.map(lambda x: jnp.asarray(x, cfg.jnp_dtype), own)
    if isinstance(cfg, eagle3.Eagle3Config) and ("lm_head" in own) != (meta.get("lm_head", "own") == "own"):
        raise ValueError(
            f"the EAGLE-3 head at {path}: its metadata says lm_head {meta.get('lm_head', 'own')!r} but the weights "
            f"{'hold' if 'lm_head' in own else 'lack'} one"
        )
    if temperature_scale is None:
        temperature_scale = meta.get("temperature_scale", 1.0)
    if tree_temperature_scale is None:
        tree_temperature_scale = meta.get("tree_temperature_scale")
    name = meta.get("name", "eagle")
    head = EagleDrafter.for_target(target, own, config=cfg, name=name, temperature_scale=temperature_scale)
    return dataclasses.replace(head, tree_temperature_scale=tree_temperature_scale)
