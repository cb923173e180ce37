"""Generate the Hugging Face parity fixtures under tests/fixtures/hf/ (tiny random models + reference logits).

Run with a separate venv that has torch (torch is never a jaxspec dependency):

    python -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch==2.13.0 transformers safetensors numpy
    /tmp/torchvenv/bin/python scripts/make_fixtures.py            # every fixture and the defaults file
    /tmp/torchvenv/bin/python scripts/make_fixtures.py NAME ... [--defaults]

Each fixture directory holds what ``save_pretrained(..., safe_serialization=True)`` writes plus ``expected.npz``
with ``ids [2, T]`` int32 and the float32 reference ``logits [2, T, V]`` (eager attention, float32 compute).
``--defaults`` (also written when no argument is given) writes tests/fixtures/multimodal_text_defaults.json:
published multimodal ``text_config`` entries next to what transformers fills in for them.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hf"
SEQ = 56
VOCAB = 64
WEIGHT_STD = 0.15

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    initializer_range=WEIGHT_STD,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

# Gemma 2/3 fixtures: 16-token window, attention scaled by query_pre_attn_scalar 24 (not head_dim 16)
GEMMA23 = dict(
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    tie_word_embeddings=True,
    hidden_activation="gelu_pytorch_tanh",
    rms_norm_eps=1e-6,
    sliding_window=16,
    query_pre_attn_scalar=24,
)
# for configs that name their shape otherwise (GPT-2, GPT-NeoX): only what every fixture shares
BARE_COMMON = dict(vocab_size=VOCAB, initializer_range=WEIGHT_STD, bos_token_id=1, eos_token_id=2, pad_token_id=0)

# Qwen-VL's image / video / vision start and end ids: outside the 64-token vocabulary, so never in ids
QWEN_VL_IDS = dict(
    image_token_id=VOCAB, video_token_id=VOCAB + 1, vision_start_token_id=VOCAB + 2, vision_end_token_id=VOCAB + 3
)

# name -> (config class, model class, config kwargs, options)
# Gemma 3's text settings (gemma3_text_swa, and the text model of gemma3_multimodal): q/k norm, sliding layers with
# their own RoPE base (100) and a full layer with linear scaling over another (1000), three layers
GEMMA3_TEXT = dict(
    **GEMMA23,
    num_hidden_layers=3,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
    },
)

FIXTURES = {
    # Llama 2 style: GQA, untied, default RoPE
    "llama_gqa": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
        {},
    ),
    # Llama 3.1/3.2 style: llama3 RoPE (bands straddle original_max_position_embeddings=64 for head_dim 8),
    # MQA, tied embeddings, attention_bias (q/k/v/o biases), a multi-id EOS in generation_config
    "llama3_rope_mqa_tied": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(
            num_attention_heads=4,
            num_key_value_heads=1,
            tie_word_embeddings=True,
            attention_bias=True,
            eos_token_id=[2, 3],
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
        {},
    ),
    # Llama 2 long-context style: linear RoPE, bf16 weights on disk, sharded with an index, a tokenizer
    "llama_linear_bf16_sharded": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(
            num_attention_heads=2,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0),
        ),
        dict(bf16=True, max_shard_size="20KB", tokenizer=True),
    ),
    # Mistral: GQA, explicit head_dim != hidden / heads, sliding window shorter than the sequence
    "mistral_swa": (
        transformers.MistralConfig,
        transformers.MistralForCausalLM,
        dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=16, tie_word_embeddings=False),
        {},
    ),
    # Qwen2/2.5: q/k/v biases, tied, GQA
    "qwen2_bias_tied": (
        transformers.Qwen2Config,
        transformers.Qwen2ForCausalLM,
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
        ),
        {},
    ),
    # Qwen3: q/k RMSNorm per head, explicit head_dim, untied, MQA
    "qwen3_qknorm": (
        transformers.Qwen3Config,
        transformers.Qwen3ForCausalLM,
        dict(
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
        ),
        {},
    ),
    # Gemma: (1 + w) RMSNorm, sqrt(hidden)-scaled embeddings, GeGLU (tanh), tied, GQA, explicit head_dim
    "gemma_gqa_tied": (
        transformers.GemmaConfig,
        transformers.GemmaForCausalLM,
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            tie_word_embeddings=True,
            hidden_act="gelu_pytorch_tanh",
            rms_norm_eps=1e-6,
        ),
        {},
    ),
    # GPT-2: learned positions, LayerNorm with bias, fused c_attn (Conv1D), gelu_new, tied, n_inner set
    "gpt2_tied": (
        transformers.GPT2Config,
        transformers.GPT2LMHeadModel,
        dict(
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_inner=64,
            n_positions=128,
            layer_norm_epsilon=1e-5,
            activation_function="gelu_new",
            tie_word_embeddings=True,
        ),
        {"common": BARE_COMMON},
    ),
    # Phi-3: the Llama math with fused qkv_proj / gate_up_proj tensors, GQA (so q, k, v take unequal rows of
    # qkv_proj), a sliding window shorter than the sequence, untied
    "phi3_fused_swa": (
        transformers.Phi3Config,
        transformers.Phi3ForCausalLM,
        dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=16, tie_word_embeddings=False),
        {},
    ),
    # YaRN (Qwen2.5/Qwen3 long-context settings): head_dim 16 and a small base so the blend between kept and
    # interpolated frequencies spans several dimensions at original_max_position_embeddings=32 < the sequence
    "qwen2_yarn": (
        transformers.Qwen2Config,
        transformers.Qwen2ForCausalLM,
        dict(
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=128,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="yarn", rope_theta=100.0, factor=4.0, original_max_position_embeddings=32),
        ),
        {},
    ),
    # YaRN with every option: its own beta bounds, not truncated, attention factor from mscale / mscale_all_dim
    "llama_yarn_mscale": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=256,
            tie_word_embeddings=False,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=100.0,
                factor=8.0,
                original_max_position_embeddings=32,
                beta_fast=8.0,
                beta_slow=0.5,
                mscale=1.0,
                mscale_all_dim=0.5,
                truncate=False,
            ),
        ),
        {},
    ),
    # LongRoPE (Phi-3 128k, Phi-3.5): short factors below original_max_position_embeddings (top-level, as Phi-3
    # writes it), long ones from there on. The reference decodes as transformers generates: a prompt within the
    # original length in one pass, then token by token (so each token's rotation follows its own position)
    "phi3_longrope": (
        transformers.Phi3Config,
        transformers.Phi3ForCausalLM,
        dict(
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=False,
            max_position_embeddings=96,
            original_max_position_embeddings=24,
            rope_parameters=dict(
                rope_type="longrope",
                rope_theta=100.0,
                short_factor=[1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 3.5],
                long_factor=[1.0, 1.5, 2.5, 4.0, 6.0, 8.0, 10.0, 12.0],
            ),
        ),
        {"incremental": 24},
    ),
    # Phi-4-mini style: RoPE on the first half of each head only (partial_rotary_factor), LongRoPE over those
    "phi3_partial_longrope": (
        transformers.Phi3Config,
        transformers.Phi3ForCausalLM,
        dict(
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=True,
            max_position_embeddings=96,
            original_max_position_embeddings=24,
            partial_rotary_factor=0.5,
            rope_parameters=dict(
                rope_type="longrope",
                rope_theta=100.0,
                short_factor=[1.0, 1.2, 1.8, 2.5],
                long_factor=[1.0, 2.0, 5.0, 9.0],
            ),
        ),
        {"incremental": 24},
    ),
    # Gemma 2: norms around each sub-block, a sliding-window layer then a full one (16-token window), attention
    # scaled by query_pre_attn_scalar (24, not head_dim 16), soft-capped scores and logits (caps small enough to bite)
    "gemma2_softcap_swa": (
        transformers.Gemma2Config,
        transformers.Gemma2ForCausalLM,
        dict(
            **GEMMA23,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
        ),
        {},
    ),
    # Gemma 3 (text): q/k norm, sliding layers with their own RoPE base (100) and a full layer with linear scaling
    # over another (1000), three layers, 16-token window, query_pre_attn_scalar 24
    "gemma3_text_swa": (
        transformers.Gemma3TextConfig,
        transformers.Gemma3ForCausalLM,
        GEMMA3_TEXT,
        {},
    ),
    # Multimodal wrappers (image-text-to-text checkpoints): save_pretrained writes the text model's tensors as
    # language_model.model.* and an untied head as language_model.lm_head.weight (the published layout; in memory
    # they are model.language_model.* and lm_head.weight); a tiny vision tower and projector ride along (vision_tower.*,
    # multi_modal_projector.*; jaxspec ignores them). Reference logits are the wrapper's forward on text-only ids
    # (no pixel_values); the image / boi / eoi token ids lie outside the 64-token vocabulary so never occur in ids.
    # Gemma 3 (4B and up): the gemma3_text_swa text settings inside a Gemma3Config with a SigLIP tower
    "gemma3_multimodal": (
        transformers.Gemma3TextConfig,
        transformers.Gemma3ForConditionalGeneration,
        GEMMA3_TEXT,
        {
            "wrapper": (
                transformers.Gemma3Config,
                dict(
                    vision_config=dict(
                        model_type="siglip_vision_model",
                        hidden_size=16,
                        intermediate_size=32,
                        num_hidden_layers=1,
                        num_attention_heads=2,
                        image_size=28,
                        patch_size=14,
                        vision_use_head=False,
                    ),
                    mm_tokens_per_image=4,  # 2x2 patches, pooled with kernel 1
                    boi_token_index=VOCAB,
                    eoi_token_index=VOCAB + 1,
                    image_token_index=VOCAB + 2,
                    tie_word_embeddings=True,
                ),
            )
        },
    ),
    # Mistral Small 3.1 style: the mistral_swa text settings inside a Mistral3Config with a Pixtral tower. The
    # wrapper's own tie_word_embeddings defaults to True (it decides the tying), so it is set False as in the text
    # config: lm_head.weight is its own tensor
    "mistral3_multimodal": (
        transformers.MistralConfig,
        transformers.Mistral3ForConditionalGeneration,
        dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=16, tie_word_embeddings=False),
        {
            "wrapper": (
                transformers.Mistral3Config,
                dict(
                    vision_config=dict(
                        model_type="pixtral",
                        hidden_size=16,
                        intermediate_size=32,
                        num_hidden_layers=1,
                        num_attention_heads=2,
                        head_dim=8,
                        image_size=28,
                        patch_size=14,
                    ),
                    image_token_index=VOCAB,
                    spatial_merge_size=2,
                    tie_word_embeddings=False,
                ),
            )
        },
    ),
    # LLaVA (1.5 style): the llama_gqa text settings inside a LlavaConfig with a CLIP tower
    "llava_llama": (
        transformers.LlamaConfig,
        transformers.LlavaForConditionalGeneration,
        dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
        {
            "wrapper": (
                transformers.LlavaConfig,
                dict(
                    vision_config=dict(
                        model_type="clip_vision_model",
                        hidden_size=16,
                        intermediate_size=32,
                        projection_dim=16,
                        num_hidden_layers=2,
                        num_attention_heads=2,
                        image_size=28,
                        patch_size=14,
                    ),
                    image_token_index=VOCAB,
                    image_seq_length=4,  # 2x2 patches, the CLS position dropped
                    tie_word_embeddings=False,
                ),
            )
        },
    ),
    # (new fixtures go last: a fixture's seed is its index here)
    # GPT-NeoX as Pythia: parallel residual, RoPE on a quarter of each head (4 of 16 dims), fused per-head q/k/v
    # with biases, exact GELU, untied embed_out
    "gpt_neox_parallel": (
        transformers.GPTNeoXConfig,
        transformers.GPTNeoXForCausalLM,
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=256,
            hidden_act="gelu",
            use_parallel_residual=True,
            attention_bias=True,
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
        ),
        {"common": BARE_COMMON},
    ),
    # GPT-NeoX's other switches: sequential residual, no attention biases, half the head rotated with linear
    # scaling over a small base, tanh GELU, a tied head
    "gpt_neox_sequential_linear": (
        transformers.GPTNeoXConfig,
        transformers.GPTNeoXForCausalLM,
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=48,
            max_position_embeddings=256,
            hidden_act="gelu_new",
            use_parallel_residual=False,
            attention_bias=False,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=1000.0, partial_rotary_factor=0.5),
        ),
        {"common": BARE_COMMON},
    ),
    # Granite 3: Llama with its four multipliers (embeddings, residual branches, attention scores, logits), GQA, tied
    "granite_multipliers": (
        transformers.GraniteConfig,
        transformers.GraniteForCausalLM,
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            embedding_multiplier=3.0,
            residual_multiplier=0.5,
            attention_multiplier=0.1,
            logits_scaling=2.5,
        ),
        {},
    ),
    # Qwen2-VL / Qwen2.5-VL: a Qwen2 text model (q/k/v biases) whose RoPE is M-RoPE (mrope_section splits each
    # head's frequencies between temporal, height and width positions; on text-only ids the three are equal, so it
    # is RoPE). Qwen2-VL untied (as 7B), Qwen2.5-VL tied (as 3B); tiny vision towers ride along (visual.*)
    "qwen2_vl_untied": (
        transformers.Qwen2VLTextConfig,
        transformers.Qwen2VLForConditionalGeneration,
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 1, 1]),
        ),
        {
            "wrapper": (
                transformers.Qwen2VLConfig,
                dict(
                    vision_config=dict(
                        depth=1,
                        embed_dim=16,
                        num_heads=2,
                        mlp_ratio=2,
                        hidden_size=32,
                        patch_size=2,
                        spatial_merge_size=2,
                        temporal_patch_size=2,
                    ),
                    **QWEN_VL_IDS,
                    tie_word_embeddings=False,
                ),
            )
        },
    ),
    "qwen2_5_vl_tied": (
        transformers.Qwen2_5_VLTextConfig,
        transformers.Qwen2_5_VLForConditionalGeneration,
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_parameters=dict(rope_type="default", rope_theta=1000.0, mrope_section=[2, 1, 1]),
        ),
        {
            "wrapper": (
                transformers.Qwen2_5_VLConfig,
                dict(
                    vision_config=dict(
                        depth=1,
                        hidden_size=16,
                        intermediate_size=32,
                        num_heads=2,
                        out_hidden_size=32,
                        patch_size=2,
                        spatial_merge_size=2,
                        temporal_patch_size=2,
                        window_size=8,
                        fullatt_block_indexes=[0],
                    ),
                    **QWEN_VL_IDS,
                    tie_word_embeddings=True,
                ),
            )
        },
    ),
}


def _perturb(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Random norm scales and biases (the default init makes them ones / zeros, which would hide mapping bugs)."""
    gemma = model.config.model_type.startswith("gemma")  # Gemma 1/2/3 all scale by (1 + w)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ("norm" in name or ".ln_" in name) and not name.endswith(
                ".bias"
            ):  # Gemma scales by (1 + w): centre its w on 0 so the effective scale is the same (not in a vision
                # tower: SigLIP's LayerNorms scale by w)
                offset = 1.0 if gemma and "vision_tower." not in name else 0.0
                p.copy_(0.5 + torch.rand(p.shape, generator=gen) - offset)
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(WEIGHT_STD * torch.randn(p.shape, generator=gen))


def _tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(VOCAB - 4)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.save_pretrained(directory)


def make(name: str, seed: int) -> None:
    config_cls, model_cls, kwargs, opts = FIXTURES[name]
    torch.manual_seed(seed)
    common = opts.get("common", COMMON)
    config = config_cls(**{**common, **kwargs})
    if opts.get("wrapper"):  # a multimodal wrapper around that text config
        wrapper_cls, wrapper_kwargs = opts["wrapper"]
        config = wrapper_cls(text_config=config, **wrapper_kwargs)
        for sub in (config, config.text_config, config.vision_config):
            sub._attn_implementation = "eager"
    config._attn_implementation = "eager"
    model = model_cls(config).eval().float()
    _perturb(model, torch.Generator().manual_seed(seed))
    if opts.get("bf16"):  # round to bf16 so the float32 reference equals what the bf16 file holds
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, size=(2, SEQ)).astype(np.int32)
    with torch.no_grad():
        if opts.get("incremental"):  # a prompt of that many tokens, then one token per pass through the cache
            n, full = opts["incremental"], torch.from_numpy(ids).long()
            out = model(full[:, :n], use_cache=True)
            parts, cache = [out.logits], out.past_key_values
            for t in range(n, SEQ):
                out = model(full[:, t : t + 1], past_key_values=cache, use_cache=True)
                parts.append(out.logits)
                cache = out.past_key_values
            logits = torch.cat(parts, dim=1).float().numpy()
            whole = model(full).logits.float().numpy()  # one pass over all: long factors everywhere
            print(f"{name}: one pass vs token by token differ by {np.abs(whole - logits).max():.3g}")
        else:
            logits = model(torch.from_numpy(ids).long()).logits.float().numpy()
    directory = OUT / name
    shutil.rmtree(directory, ignore_errors=True)
    save = model.to(torch.bfloat16) if opts.get("bf16") else model
    save.save_pretrained(directory, safe_serialization=True, max_shard_size=opts.get("max_shard_size", "50MB"))
    if opts.get("tokenizer"):
        _tokenizer(directory)
    np.savez_compressed(directory / "expected.npz", ids=ids, logits=logits.astype(np.float32))
    files = sorted(p.name for p in directory.iterdir())
    print(f"{name}: logits std {logits.std():.3f}, files {files}")


# Real multimodal text_config entries (as sparse as the published config.json files write them), to record what
# transformers fills in for the keys they leave out: google/gemma-3-4b-it,
# mistralai/Mistral-Small-3.1-24B-Instruct-2503 and llava-hf/llava-1.5-7b-hf
DEFAULTS = {
    "llava": (
        transformers.LlavaConfig,
        {"max_position_embeddings": 4096, "model_type": "llama", "rms_norm_eps": 1e-05, "vocab_size": 32064},
    ),
    "gemma3": (
        transformers.Gemma3Config,
        {
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "model_type": "gemma3_text",
            "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
    ),
    "mistral3": (
        transformers.Mistral3Config,
        {
            "head_dim": 128,
            "hidden_size": 5120,
            "intermediate_size": 32768,
            "max_position_embeddings": 131072,
            "model_type": "mistral",
            "num_attention_heads": 32,
            "num_hidden_layers": 40,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-05,
            "rope_theta": 1000000000.0,
            "sliding_window": None,
            "vocab_size": 131072,
        },
    ),
}


# and every default at once: a text_config with nothing but its model_type
DEFAULTS.update(
    {
        f"{family}-empty": (config_cls, {"model_type": sparse["model_type"]})
        for family, (config_cls, sparse) in list(DEFAULTS.items())
    }
)


# Qwen-VL: empty text_configs, and a hub config.json as Qwen/Qwen2.5-VL-7B-Instruct publishes it (the text model's
# keys at the top level, transformers 4's "mrope" rope_scaling; its vision_config left out), which transformers reads
# as the text config ("-hub": passed as the whole config)
DEFAULTS.update(
    {
        "qwen2_vl-empty": (transformers.Qwen2VLConfig, {"model_type": "qwen2_vl_text"}),
        "qwen2_5_vl-empty": (transformers.Qwen2_5_VLConfig, {"model_type": "qwen2_5_vl_text"}),
        "qwen2_5_vl-hub": (
            transformers.Qwen2_5_VLConfig,
            {
                "architectures": ["Qwen2_5_VLForConditionalGeneration"],
                "attention_dropout": 0.0,
                "bos_token_id": 151643,
                "eos_token_id": 151645,
                "vision_start_token_id": 151652,
                "vision_end_token_id": 151653,
                "vision_token_id": 151654,
                "image_token_id": 151655,
                "video_token_id": 151656,
                "hidden_act": "silu",
                "hidden_size": 3584,
                "initializer_range": 0.02,
                "intermediate_size": 18944,
                "max_position_embeddings": 128000,
                "max_window_layers": 28,
                "model_type": "qwen2_5_vl",
                "num_attention_heads": 28,
                "num_hidden_layers": 28,
                "num_key_value_heads": 4,
                "rms_norm_eps": 1e-06,
                "rope_theta": 1000000.0,
                "sliding_window": 32768,
                "tie_word_embeddings": False,
                "torch_dtype": "bfloat16",
                "use_cache": True,
                "use_sliding_window": False,
                "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
                "vocab_size": 152064,
            },
        ),
    }
)


def make_defaults() -> None:
    """Write multimodal_text_defaults.json: {family: {"sparse": published text_config (a "-hub" case: the whole
    config.json), "full": transformers' fill}}."""
    import copy
    import json

    out = {}
    for family, (config_cls, sparse) in DEFAULTS.items():
        if family.endswith("-hub"):
            full = config_cls(**copy.deepcopy(sparse)).text_config.to_dict()
        else:
            full = config_cls(text_config=copy.deepcopy(sparse)).text_config.to_dict()
        kept = {}
        for k, v in full.items():
            try:
                json.dumps(v)
            except TypeError:
                print(f"defaults: {family}: dropped non-JSON entry {k}={v!r}")
                continue
            kept[k] = v
        out[family] = {"sparse": sparse, "full": kept}
    path = OUT.parent / "multimodal_text_defaults.json"
    path.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(f"defaults: wrote {path}")


if __name__ == "__main__":
    args = sys.argv[1:]
    defaults = "--defaults" in args or not args
    names = [a for a in args if a != "--defaults"] or ([] if args else list(FIXTURES))
    unknown = [n for n in names if n not in FIXTURES]
    if unknown:
        sys.exit(f"unknown fixtures: {unknown}")
    if defaults:
        make_defaults()
    for i, n in enumerate(FIXTURES):
        if n in names:
            make(n, seed=i)
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"total {total / 1024:.0f} KiB in {OUT}")
