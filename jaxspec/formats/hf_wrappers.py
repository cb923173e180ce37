"""The text model inside a multimodal (image-text-to-text) Hugging Face checkpoint.

Gemma 3 4B/12B/27B (``gemma3``: ``Gemma3ForConditionalGeneration``), Mistral Small 3.1/3.2 (``mistral3``), LLaVA
(``llava``), Qwen2-VL (``qwen2_vl``) and Qwen2.5-VL (``qwen2_5_vl``) are published as one checkpoint holding a
vision tower, a projector and a language model. Text generation needs the language model only, so ``jaxspec.load``
reads it alone: its config from ``text_config`` (the keys a published ``config.json`` leaves out take transformers'
defaults for that text model, below; Qwen-VL hub configs write the text model's keys at the top level instead,
which transformers reads as the text config) and its tensors from either layout transformers uses
(``language_model.model.*`` / ``language_model.lm_head.weight`` as published, ``model.language_model.*`` /
``lm_head.weight`` as kept in memory; Qwen-VL publishes ``model.*`` / ``lm_head.weight`` beside ``visual.*``),
renamed to the text model's own names. The vision tower and projector are not read. The head is tied exactly when
the checkpoint has no head tensor (Mistral 3's ``config.json`` leaves ``tie_word_embeddings`` out, whose wrapper
default is True, yet ships its own head, which transformers then uses).

Qwen-VL's text model is Qwen2's with M-RoPE: ``mrope_section`` splits each head's frequencies between a temporal,
a height and a width position. Text-only ids give a token the same position in all three (transformers'
``get_rope_index`` without images), so M-RoPE is then plain RoPE and the text model loads as ``qwen2``; jaxspec
takes token ids only, so images never reach it.
"""

from __future__ import annotations

from typing import Any

# wrapper model_type -> the model_type its text_config defaults to
WRAPPERS = {
    "gemma3": "gemma3_text",
    "mistral3": "mistral",
    "llava": "llama",
    "qwen2_vl": "qwen2_vl_text",
    "qwen2_5_vl": "qwen2_5_vl_text",
}
# text model_types that run as another family's model (M-RoPE on text-only ids is RoPE: module docstring)
_RUNS_AS = {"qwen2_vl_text": "qwen2", "qwen2_5_vl_text": "qwen2"}
# Qwen-VL wrappers: their hub config.json holds the text model's keys at its top level (no text_config), and their
# published tensors keep the text model's own names (_QWEN_PREFIXES)
_QWEN_VL = ("qwen2_vl", "qwen2_5_vl")

# transformers' defaults (Gemma3TextConfig, MistralConfig, LlamaConfig, Qwen2VLTextConfig, Qwen2_5_VLTextConfig) for
# the keys jaxspec reads; checked against transformers in tests/fixtures/multimodal_text_defaults.json
# (scripts/fixtures/make_hf_fixtures.py --defaults)
TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": dict(
        vocab_size=262_208,
        hidden_size=2304,
        intermediate_size=9216,
        num_hidden_layers=26,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=256,
        query_pre_attn_scalar=256,
        rms_norm_eps=1e-6,
        max_position_embeddings=131_072,
        rope_theta=1_000_000.0,
        rope_local_base_freq=10_000.0,
        sliding_window=4096,
        sliding_window_pattern=6,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
    ),
    "mistral": dict(
        vocab_size=32_000,
        hidden_size=4096,
        intermediate_size=14_336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        rms_norm_eps=1e-6,
        max_position_embeddings=131_072,
        rope_theta=10_000.0,
        sliding_window=4096,
        bos_token_id=1,
        eos_token_id=2,
    ),
    "llama": dict(
        vocab_size=32_000,
        hidden_size=4096,
        intermediate_size=11_008,
        num_hidden_layers=32,
        num_attention_heads=32,
        rms_norm_eps=1e-6,
        max_position_embeddings=2048,
        rope_theta=10_000.0,
        bos_token_id=1,
        eos_token_id=2,
    ),
    **{
        name: dict(
            vocab_size=152_064,
            hidden_size=8192,
            intermediate_size=29_568,
            num_hidden_layers=80,
            num_attention_heads=64,
            num_key_value_heads=8,
            rms_norm_eps=1e-5,
            max_position_embeddings=32_768,
            rope_theta=1_000_000.0,
            bos_token_id=151_643,
            eos_token_id=151_645,
        )
        for name in ("qwen2_vl_text", "qwen2_5_vl_text")
    },
}

# (prefix in the checkpoint, prefix of the text model's own name), both layouts
_PREFIXES = (
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("model.language_model.", "model."),
    ("lm_head.", "lm_head."),
)
# Qwen-VL's published layout: the text model under its own names, the vision tower under visual.* (model.visual.*
# in memory, which the catch-all must not take)
_QWEN_PREFIXES = (*_PREFIXES, ("model.visual.", None), ("model.", "model."))


def is_wrapper(config: dict) -> bool:
    """Whether ``config`` (a ``config.json``) describes a multimodal checkpoint jaxspec reads the text model of."""
    return config.get("model_type") in WRAPPERS


def text_config(config: dict) -> dict:
    """The text model's ``config.json`` inside a wrapper's: ``text_config`` (Qwen-VL without one: the top-level
    keys) over transformers' defaults for its ``model_type`` (a key written as null stays null, as in
    transformers). EOS/BOS ids the wrapper sets at its top level win over the text model's defaults. Qwen-VL's text
    model comes back as ``qwen2``, its M-RoPE as RoPE (module docstring)."""
    text = config.get("text_config")
    if text is None and config["model_type"] in _QWEN_VL:
        text = {k: v for k, v in config.items() if k not in ("model_type", "vision_config", "architectures")}
    text = text or {}
    if not isinstance(text, dict):
        raise ValueError(f"config.json ({config['model_type']}): text_config must be an object, got {text!r}")
    model_type = text.get("model_type") or WRAPPERS[config["model_type"]]
    out = {**TEXT_DEFAULTS.get(model_type, {}), **text, "model_type": _RUNS_AS.get(model_type, model_type)}
    for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
        if config.get(key) is not None:
            out[key] = config[key]
    if model_type in _RUNS_AS:  # M-RoPE -> RoPE: transformers 4's "type": "mrope" is its "default"
        for key in ("rope_scaling", "rope_parameters"):
            rope = out.get(key)
            if isinstance(rope, dict) and "mrope_section" in rope:
                rope = {k: v for k, v in rope.items() if k != "mrope_section"}
                if rope.get("type") == "mrope":
                    rope["type"] = "default"
                out[key] = rope
    return out


class _Renamed:
    """A checkpoint tensor read under another name (``get`` takes the text model's name)."""

    def __init__(self, source, name: str):
        self.source, self.name = source, name

    def get(self, _name: str):
        return self.source.get(self.name)


def text_tensors(tensors, root, wrapper: str = "") -> dict[str, _Renamed]:
    """The text model's tensors of a wrapper checkpoint (name -> source, as ``safetensors_file.open_dir``), under
    the text model's own names; vision and projector tensors are left out. ``wrapper`` is the checkpoint's
    ``model_type`` (Qwen-VL's published layout has names of its own). Raises ``ValueError`` when a name comes from
    two layouts at once or no text tensor is found."""
    out: dict[str, _Renamed] = {}
    prefixes = _QWEN_PREFIXES if wrapper in _QWEN_VL else _PREFIXES
    for name in tensors:
        for prefix, own in prefixes:
            if name.startswith(prefix):
                if own is None:
                    break
                key = own + name[len(prefix) :]
                if key in out:
                    raise ValueError(f"checkpoint in {root} holds {key!r} twice ({out[key].name!r} and {name!r})")
                out[key] = _Renamed(tensors[name], name)
                break
    if not out:
        raise ValueError(
            f"checkpoint in {root} has no language-model tensors (expected names under "
            f"{' / '.join(p for p, _ in _PREFIXES[:3])})"
        )
    return out
