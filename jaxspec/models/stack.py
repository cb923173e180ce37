"""The layer stack every built-in family shares, in both parameter layouts (``jaxspec.families.split_layers``).

Stacked: one ``nn.scan`` over ``layer_cls`` (params ``layers``, each weight with a leading ``[layers]`` axis), so
compile time does not grow with depth. The whole KV cache rides in the scan carry and each layer scatters its new
entries into it in place: passing it as scanned inputs/outputs would make XLA build a second full cache every step.
Split: one ``layer_cls`` module per layer (params ``layers_0`` ...), each weight in its own array, which decodes
faster where XLA copies each layer's slice out of a stack (XLA:CPU does).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp


def apply_layers(layer_cls, cfg, carry, positions, split: bool):
    """Run ``cfg.num_layers`` of ``layer_cls(cfg)`` (called as ``(carry, layer, positions) -> (carry, None)``) over
    ``carry``, inside the calling module's ``nn.compact`` method; returns the final carry."""
    if split:
        for i in range(cfg.num_layers):
            carry, _ = layer_cls(cfg, name=f"layers_{i}")(carry, i, positions)
        return carry
    layers = nn.scan(
        layer_cls,
        variable_axes={"params": 0},
        split_rngs={"params": True},
        in_axes=(0, nn.broadcast),
        out_axes=0,
        length=cfg.num_layers,
    )(cfg, name="layers")
    carry, _ = layers(carry, jnp.arange(cfg.num_layers), positions)
    return carry


def bind(module_cls, cfg, params) -> tuple[nn.Module, dict]:
    """``(module, variables)`` for ``params`` in either layout: a tuple under ``"layers"`` (split) becomes the
    ``layers_i`` entries of ``module_cls(cfg, split=True)``; a stacked tree goes to ``module_cls(cfg)`` as is."""
    layers = params.get("layers")
    if isinstance(layers, tuple):
        named = {k: v for k, v in params.items() if k != "layers"}
        named.update({f"layers_{i}": p for i, p in enumerate(layers)})
        return module_cls(cfg, split=True), {"params": named}
    return module_cls(cfg), {"params": params}
