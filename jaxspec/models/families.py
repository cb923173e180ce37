"""The model-family registry: one ``ModelFamily`` record per family, declared in its model file.

A record says everything the loaders, the exporter, the checkpointer and the sharding rules need about an
architecture: its config class, how to build and initialize the model, which Hugging Face ``model_type``s it reads
(and their architecture class names), how a ``config.json`` becomes its config and back, and one ``Weight`` per
leaf of its params tree. A weight is declared once, with its path, logical axes, Hugging Face name and transform;
that one table serves ``jaxspec.formats.hf.load`` (and the GGUF loader), ``jaxspec.export_hf`` and ``jaxspec.sharding``.

Built-in records (``FAMILY`` in each module of ``jaxspec/models/``, all imported on the first lookup):
``models.llama`` (llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, granite), ``models.phi3`` (the Llama
module with fused q/k/v and gate/up tensors), ``models.gpt2`` and ``models.gpt_neox``. A new family is one record
passed to ``register`` (in a new module of ``jaxspec/models/`` for a built-in one), which makes ``jaxspec.load``
read its ``model_type``s, ``jaxspec.save`` checkpoint it and ``jaxspec.export_hf`` write it when it has
``config_to_hf``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxspec.core.model import CausalLM
from jaxspec.parallel import sharding


@dataclasses.dataclass(frozen=True)
class Weight:
    """One leaf of a family's params tree and the Hugging Face tensor behind it.

    Attributes:
      path: keys into the params tree; a leading ``"layers"`` marks a weight stacked over layers (leading
        ``[layers]`` axis), whose Hugging Face name holds ``{i}`` for the layer index.
      axes: logical axes of one layer's slice, from ``jaxspec.sharding.RULES`` (None: replicated).
      hf: the Hugging Face tensor name.
      transpose: the Hugging Face tensor is the transpose (torch ``Linear`` [out, in] vs Flax ``Dense`` [in, out]).
      rows: ``(start, stop)``: this weight is those rows (axis 0, in Hugging Face layout) of a fused tensor whose
        other rows are other weights (e.g. Phi-3's ``qkv_proj``); import slices it, export concatenates the parts.
    """

    path: tuple[str, ...]
    axes: tuple[str | None, ...]
    hf: str
    transpose: bool = False
    rows: tuple[int, int] | None = None

    def __post_init__(self):
        if self.stacked != ("{i}" in self.hf):
            raise ValueError(f"Weight {self.path}: a weight under 'layers' (only) has '{{i}}' in its name: {self.hf!r}")

    @property
    def stacked(self) -> bool:
        """Whether this is a per-layer weight stacked along a leading ``[layers]`` axis (its path starts ``layers``)."""
        return self.path[0] == "layers"

    def names(self, num_layers: int) -> tuple[str, ...]:
        """The Hugging Face tensor names: one per layer for a stacked weight."""
        return tuple(self.hf.format(i=i) for i in range(num_layers)) if self.stacked else (self.hf,)

    def from_hf(self, tensor):
        """A Hugging Face tensor -> this weight's value in our layout (a view: memory maps stay lazy)."""
        if self.rows is not None:
            tensor = tensor[self.rows[0] : self.rows[1]]
        return tensor.T if self.transpose else tensor

    def to_hf(self, value):
        """This weight's value (one layer's) -> its Hugging Face tensor, or its rows of a fused tensor."""
        return value.T if self.transpose else value

    def get(self, tree):
        """The leaf at ``path`` in ``tree`` (params, shapes or shardings), or None when the tree has none there."""
        for key in self.path:
            if not isinstance(tree, dict) or key not in tree:
                return None
            tree = tree[key]
        return tree


def axes_table(weights: list[Weight]) -> dict[tuple[str, ...], tuple]:
    """``CausalLM.param_axes`` from a weight table: path (without a leading ``"layers"``) -> logical axes."""
    return {w.path[1:] if w.stacked else w.path: w.axes for w in weights}


def split_layers(params, *, consume: bool = False):
    """``params`` with its ``"layers"`` entry (every weight stacked over a leading ``[layers]`` axis) as a tuple of
    per-layer trees, each weight in its own array: the layout a family's ``apply_fn`` decodes from when it supports
    it (``models.llama``). A loop over stacked weights makes XLA slice each layer's weights out of the stack on
    every step, which XLA:CPU does by copying them (``scripts/studies/xla_cpu_step.py``). Other trees are returned
    as they are. ``consume``: the stacked device arrays are deleted as soon as they are split, one weight at a time,
    so a loader that owns them never holds both layouts in device memory (the caller must not use them again)."""
    layers = params.get("layers") if isinstance(params, dict) else None
    if layers is None or isinstance(layers, tuple):
        return params
    leaves, treedef = jax.tree.flatten(layers)
    count = leaves[0].shape[0]
    parts = []
    for a in leaves:
        if isinstance(a, jax.ShapeDtypeStruct):  # abstract params split into abstract layers
            parts.append([jax.ShapeDtypeStruct(a.shape[1:], a.dtype)] * count)
            continue
        parts.append(jax.block_until_ready([a[i] for i in range(count)]))
        if consume and isinstance(a, jax.Array):
            a.delete()
    layer_trees = tuple(jax.tree.unflatten(treedef, [p[i] for p in parts]) for i in range(count))
    return {**params, "layers": layer_trees}


def stack_layers(params):
    """The inverse of ``split_layers``: the per-layer trees stacked back into one tree over a leading ``[layers]``
    axis (the layout of checkpoints, the weight tables, sharding rules and training); other trees as they are."""
    layers = params.get("layers") if isinstance(params, dict) else None
    if not isinstance(layers, tuple):
        return params

    def stack(*xs):
        if isinstance(xs[0], jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct((len(xs), *xs[0].shape), xs[0].dtype)
        return jnp.stack(xs)

    return {**params, "layers": jax.tree.map(stack, *layers)}


def check_min_rows(value, arg: str = "min_rows") -> int:
    """``value`` if it is a positive int: a family config's ``min_rows`` (every weight product computed over at
    least that many rows, ``jaxspec.models.quant.project``); ``ValueError`` naming ``arg`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{arg} must be an int >= 1, got {value!r}")
    return value


def default_min_rows() -> int:
    """The ``min_rows`` a loaded model gets: 2 on a GPU, where XLA's one-row weight products are slower than
    two-row ones (an H200's plain step 12 % faster at SmolLM2's shape, 21 % at Llama-3.1-8B's), 1 elsewhere (on
    XLA:CPU two rows cost a third more than one). Measurements: docs/guides/benchmarks.md."""
    return 2 if jax.default_backend() == "gpu" else 1


def with_min_rows(model: CausalLM, min_rows: int | None = None) -> CausalLM:
    """``model`` with every weight product over fewer than ``min_rows`` rows computed over that many (zero rows
    appended; the same weights, the same outputs); None: ``default_min_rows()``. A model whose config has no
    ``min_rows`` (not a built-in family's), or whose ``apply_fn`` is not the one its family builds, is returned as
    it is for None and is a ``ValueError`` otherwise."""
    rows = default_min_rows() if min_rows is None else check_min_rows(min_rows)
    cfg = model.config
    if getattr(cfg, "min_rows", None) == rows:
        return model
    rebuilt = _rebuilt(model, {"min_rows": rows}) if hasattr(cfg, "min_rows") else None
    if rebuilt is None and min_rows is not None:
        raise ValueError(f"min_rows: {model.name!r} is not a built-in family's model, so its products cannot be padded")
    return model if rebuilt is None else rebuilt


def _rebuilt(model: CausalLM, changes: dict, name: str | None = None, params=None) -> CausalLM | None:
    """``model``'s family rebuilding it with its config ``changes`` (and ``params``, default its own); None when
    ``model`` is not a registered family's model or its ``apply_fn`` is not the one the family builds."""
    cfg = model.config
    try:
        family = family_of_config(cfg)
    except ValueError:
        return None
    layers = model.params.get("layers") if isinstance(model.params, dict) else None
    layout = {"split_layers": isinstance(layers, tuple)} if family.splits_layers else {}
    own = {"tokenizer": None, "eos_token_id": None, **layout}
    if family.from_params(cfg, model.params, name=model.name, **own).apply_fn is not model.apply_fn:  # wrapped
        return None
    rebuilt = family.from_params(
        dataclasses.replace(cfg, **changes), model.params if params is None else params, name=name or model.name, **own
    )
    return rebuilt.replace(tokenizer=model.tokenizer, eos_token_id=model.eos_token_id)


def first_layers(model: CausalLM, num_layers: int) -> CausalLM | None:
    """A copy of ``model`` that keeps its first ``num_layers`` decoder layers (the same weight arrays: a split
    model's per-layer trees, or slices of a stacked one), its embedding, final norm and LM head: what
    ``gamma="auto"`` times to estimate a deep model's passes without compiling all its layers
    (``jaxspec.policy.timing``). None when it cannot be built: ``model`` is not a registered family's model (its
    config is not a family config, or its ``apply_fn`` is not the one the family builds for that config), its
    params have no ``"layers"``, or ``num_layers`` is not between 1 and its depth, exclusive."""
    cfg, params = model.config, model.params
    layers = params.get("layers") if isinstance(params, dict) else None
    if layers is None or not 0 < num_layers < getattr(cfg, "num_layers", 0):
        return None
    kept = layers[:num_layers] if isinstance(layers, tuple) else jax.tree.map(lambda a: a[:num_layers], layers)
    changes = {"num_layers": num_layers}
    if getattr(cfg, "layer_types", ()):  # per-layer attention types (Gemma 2/3): the kept layers'
        changes["layer_types"] = cfg.layer_types[:num_layers]
    return _rebuilt(model, changes, f"{model.name} (first {num_layers} layers)", {**params, "layers": kept})


LAYERS_ENV = "JAXSPEC_LAYERS"


def loads_split() -> bool:
    """Whether the loaders hold a model's layers split (the default) or stacked: ``$JAXSPEC_LAYERS``, ``split`` or
    ``stacked``. Stacked layers compile once for all layers (about 5× less compile time for SmolLM2's 30), and
    decode more slowly where XLA copies each layer's slice out of the stack (XLA:CPU: docs/history/cpu-costs.md);
    the test suite, which compiles far more than it decodes, loads them stacked."""
    value = os.environ.get(LAYERS_ENV, "split").strip().lower() or "split"
    if value not in ("split", "stacked"):
        raise ValueError(f"${LAYERS_ENV} must be 'split' or 'stacked', got {value!r}")
    return value == "split"


def loaded_params(family: ModelFamily, params):
    """What a loader hands ``family.from_params``: ``params`` it read (and owns), split for a family that
    ``splits_layers`` with the stacked arrays consumed (device memory holds one copy of the weights), unless
    ``loads_split()`` says stacked."""
    return split_layers(params, consume=True) if family.splits_layers and loads_split() else params


def loaded_layout(family: ModelFamily) -> dict:
    """The layout keyword a loader gives ``family.from_params`` for ``loaded_params``' params."""
    return {"split_layers": loads_split()} if family.splits_layers else {}


def layout_like(params, reference):
    """``params`` (stacked, e.g. after training) in ``reference``'s layout: split when ``reference`` is split."""
    split = isinstance(reference, dict) and isinstance(reference.get("layers"), tuple)
    return split_layers(params) if split else params


def _nothing(cfg, name: str) -> bool:
    return False


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """Everything jaxspec knows about one model family (see the module docstring).

    Attributes:
      name: the family's name, written into ``jaxspec.save`` checkpoints (``"llama"``, ``"gpt2"``).
      config_class: its frozen config dataclass (with ``vocab_size``, ``num_layers``, ``dtype``, ``jnp_dtype``).
      from_params: ``(cfg, params, *, tokenizer, eos_token_id, name) -> CausalLM``.
      init_params: ``(cfg, seed) -> params``, random; its shapes are the restore and load targets.
      weights: ``cfg -> [Weight]``, covering every leaf of the params tree for that config.
      architectures: Hugging Face ``model_type`` -> architecture class name (``"LlamaForCausalLM"``): the
        ``config.json`` types this family loads.
      config_from_hf: ``(config.json dict, model_type, dtype name) -> cfg``; ``ValueError`` naming what is not
        supported.
      config_to_hf: ``(cfg, model_type or None) -> config.json dict`` for ``export_hf`` (None: the family has no
        export); with None it picks the ``model_type`` that describes ``cfg``.
      ignored: ``(cfg, tensor name) -> bool``: checkpoint tensors that are not weights (buffers, a tied LM head).
      layout_of: for a record that is only another checkpoint layout of a family's model (``phi3`` of ``llama``):
        that family's name. ``family_of_config`` (so ``jaxspec.save`` and ``export_hf`` without a ``model_type``)
        skips such records.
      splits_layers: ``from_params`` holds the layers split (``split_layers``); the loaders then split what they
        read themselves, consuming the stacked arrays, before calling it.
    """

    name: str
    config_class: type
    from_params: Callable[..., CausalLM]
    init_params: Callable[[Any, int], Any]
    weights: Callable[[Any], list[Weight]]
    architectures: Mapping[str, str]
    config_from_hf: Callable[[dict, str, str], Any]
    config_to_hf: Callable[[Any, str | None], dict] | None = None
    ignored: Callable[[Any, str], bool] = _nothing
    layout_of: str | None = None
    splits_layers: bool = False

    def abstract_params(self, cfg):
        """The params tree of ``cfg`` as ``jax.ShapeDtypeStruct``s (nothing is computed)."""
        return jax.eval_shape(lambda: self.init_params(cfg, 0))

    def param_axes(self, cfg) -> dict:
        """Logical axes of every weight of ``cfg``'s params, keyed by param path (a stacked
        weight without its leading ``"layers"``), as ``CausalLM.param_axes`` holds them."""
        return axes_table(self.weights(cfg))

    def shardings(self, cfg, mesh, *, name: str = "model"):
        """A pytree of ``NamedSharding`` for ``cfg``'s params on ``mesh`` (a ``Mesh`` or ``{"data", "model"}``), by
        the weights' logical axes and ``jaxspec.sharding.RULES``."""
        abstract, mesh = self.abstract_params(cfg), sharding.make_mesh(mesh)
        return sharding.plan_params(abstract, self.param_axes(cfg), cfg, mesh, name=name).shardings


_FAMILIES: dict[str, ModelFamily] = {}  # by name, in registration order
_MODEL_TYPES: dict[str, ModelFamily] = {}


def register(family: ModelFamily) -> ModelFamily:
    """Make ``family`` known to ``jaxspec.load`` (its ``model_type``s), ``save``/``load`` of checkpoints (its
    name) and ``export_hf``; returns it. Registering a name again replaces that record."""
    taken = {t: f.name for t, f in _MODEL_TYPES.items() if t in family.architectures and f.name != family.name}
    if taken:
        raise ValueError(f"model_type(s) {sorted(taken)} already belong to family {sorted(set(taken.values()))}")
    old = _FAMILIES.get(family.name)
    for t in old.architectures if old is not None else ():
        _MODEL_TYPES.pop(t, None)
    _FAMILIES[family.name] = family  # a replaced record keeps its place in the order
    _MODEL_TYPES.update({t: family for t in family.architectures})
    return family


@functools.cache
def _load_builtins() -> None:
    """Import every module of ``jaxspec.models``: each built-in family registers itself there."""
    package = importlib.import_module(__package__)  # jaxspec.models: this registry's own package
    for module in pkgutil.iter_modules(package.__path__, f"{__package__}."):
        importlib.import_module(module.name)


def registered() -> list[ModelFamily]:
    """Every registered family, in registration order."""
    _load_builtins()
    return list(_FAMILIES.values())


def family_for_model_type(model_type) -> ModelFamily:
    """The family that loads a ``config.json`` of this ``model_type``; ``ValueError`` listing the supported ones."""
    _load_builtins()
    if model_type not in _MODEL_TYPES:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {sorted(_MODEL_TYPES)}")
    return _MODEL_TYPES[model_type]


def family_of_config(cfg) -> ModelFamily:
    """The family of a config object: the (first registered) record of its ``config_class`` that is not only
    another's layout; ``ValueError`` for any other config."""
    _load_builtins()
    for family in _FAMILIES.values():
        if isinstance(cfg, family.config_class) and family.layout_of is None:
            return family
    raise ValueError(
        f"{type(cfg).__name__} is not the config of a registered model family "
        f"({', '.join(f'{f.name}: {f.config_class.__name__}' for f in _FAMILIES.values())})"
    )
