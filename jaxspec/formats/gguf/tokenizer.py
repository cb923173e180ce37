"""The tokenizer of a GGUF file, rebuilt with the ``tokenizers`` library from the file's vocabulary, and the ids that
end generation.

``tokenizer.ggml.model == "gpt2"`` (byte-level BPE) from its merges, with the pre-tokenizer named by
``tokenizer.ggml.pre``; ``"llama"`` (SentencePiece vocabularies: Llama 1/2, Mistral v0.1, TinyLlama, Phi-3, Gemma
1/2) from its scores, as llama.cpp tokenizes them (see ``jaxspec.formats.gguf.loader``). The chat template comes from
``tokenizer.chat_template``.
"""

from __future__ import annotations

from pathlib import Path

from jaxspec.formats.gguf.reader import GGUFError

# The pre-tokenizers of byte-level BPE vocabularies, by ``tokenizer.ggml.pre``: the regular expressions that split
# the text in turn (each match isolated, the text between matches kept), as the model's own tokenizer.json does and
# llama.cpp reproduces (llama-vocab.cpp; its case-insensitive groups written out there, kept as (?i:...) here),
# then GPT-2's byte-to-unicode mapping.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_LLAMA3_SPLIT = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35_SPLIT = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"  # CJK ideographs (and what lies below them), Hangul
_DEEPSEEK_LLM_LETTERS = (  # the letters DeepSeek LLM's tokenizer keeps together (Latin, Greek, Cyrillic, ...)
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
    "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
# case-aware words (an upper-case run then lower case), as tiktoken's o200k and Mistral's Tekken split them
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_TEKKEN_SPLIT = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*|\p{{N}}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SEED_CODER_SPLIT = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
_BLOOM_SPLIT = (
    " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"  # words up to a space or . , ! ? … 。 ， 、 । ۔ ،
)
_STARCODER = (r"\p{N}", _GPT2_SPLIT)  # digits one by one, then GPT-2's split
_PRE_TOKENIZERS = {
    "gpt2": (_GPT2_SPLIT,),
    "llama3": (_LLAMA3_SPLIT,),
    "qwen2": (_QWEN2_SPLIT,),
    "qwen35": (_QWEN35_SPLIT,),
    "starcoder": _STARCODER,
    "deepseek-llm": (
        r"[\r\n]",
        rf"\s?[{_DEEPSEEK_LLM_LETTERS}]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+$",
        _CJK,
        r"\p{N}+",
    ),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2_SPLIT, "[0-9][0-9][0-9]"),
    "tekken": (_TEKKEN_SPLIT,),
    "gpt-4o": (_GPT4O_SPLIT,),
    "seed-coder": (_SEED_CODER_SPLIT,),
    "bloom": (_BLOOM_SPLIT,),
    "viking": (_BLOOM_SPLIT, r"\p{N}"),
}
# llama.cpp's names for each (tokenizer.ggml.pre); the names in one entry share its splits exactly
_PRE_NAMES = {
    "gpt2": ("default", "gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "exaone4", "roberta-bpe"),
    "llama3": ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "dbrx", "smaug-bpe"),
    "qwen2": ("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"),
    "qwen35": ("qwen35",),
    "starcoder": ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"),
    "deepseek-llm": ("deepseek-llm",),
    "deepseek-coder": ("deepseek-coder",),
    "falcon": ("falcon",),
    "tekken": ("tekken",),  # Mistral NeMo, Ministral, Mistral Small 3, Pixtral 12B
    "gpt-4o": ("gpt-4o", "llama4"),
    "seed-coder": ("seed-coder",),
    "bloom": ("bloom", "poro-chat", "gpt3-finnish"),
    "viking": ("viking",),
}
_PRE_KIND = {name: kind for kind, names in _PRE_NAMES.items() for name in names}
# pre-tokenizers whose pre-token that is a token whole is taken before any merge (llama.cpp's ignore_merges):
# Llama 3's ' Việt' is one token there, not ' Vi' 'ệ' 't'
_IGNORE_MERGES = ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "tekken")


def _pre_tokenizer(pre: str | None, path: Path):
    from tokenizers import Regex
    from tokenizers import pre_tokenizers as pt

    kind = _PRE_KIND.get("default" if pre is None else pre)
    if kind is None:
        raise GGUFError(
            f"{path}: tokenizer pre-tokenizer {pre!r} is not supported (supported: {', '.join(sorted(_PRE_KIND))}); "
            "load with tokenizer=False and attach your own"
        )
    splits = [pt.Split(Regex(expr), behavior="isolated") for expr in _PRE_TOKENIZERS[kind]]
    return pt.Sequence([*splits, pt.ByteLevel(add_prefix_space=False, use_regex=False)])


def _bpe_model(meta: dict, tokens: list, types: list, path: Path):
    """(model, pre-tokenizer, normalizer, decoder) of a byte-level BPE vocabulary (``tokenizer.ggml.model`` gpt2)."""
    from tokenizers import decoders, models

    merges = meta.get("tokenizer.ggml.merges")
    if merges is None:
        raise GGUFError(f"{path}: tokenizer metadata lacks tokenizer.ggml.merges (needed by a 'gpt2' tokenizer)")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    pre = meta.get("tokenizer.ggml.pre")
    model = models.BPE(
        vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False, ignore_merges=pre in _IGNORE_MERGES
    )
    return model, _pre_tokenizer(pre, path), None, decoders.ByteLevel()


_MERGEABLE = (1, 2, 4, 5)  # token types a SentencePiece merge may produce: normal, unknown, user-defined, unused


def _spm_merges(tokens: list, scores: list, types: list, ids: dict) -> list[tuple[str, str]]:
    """BPE merges equivalent to llama.cpp's SentencePiece tokenization: every split of a token into two tokens
    (``ids``: token -> id) is a merge, ranked by the score of the token it makes (highest first; ties by that
    token's id). Applying the lowest-ranked adjacent pair first is then merging the highest-scoring pair first, as
    llama.cpp does."""
    ranked = []
    for i, piece in enumerate(tokens):
        if types[i] not in _MERGEABLE or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-float(scores[i]), i, ids[left], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _spm_model(meta: dict, tokens: list, types: list, path: Path):
    """(model, pre-tokenizer, normalizer, decoder) of a SentencePiece vocabulary (``tokenizer.ggml.model`` llama)."""
    from tokenizers import decoders, models, normalizers

    scores = meta.get("tokenizer.ggml.scores")
    if scores is None or len(scores) != len(tokens):
        raise GGUFError(
            f"{path}: a 'llama' (SentencePiece) tokenizer needs tokenizer.ggml.scores, one per token "
            f"({len(tokens)} tokens, {'no' if scores is None else len(scores)} scores)"
        )
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)  # a duplicated piece keeps its first id, as llama.cpp's lookup does
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    model = models.BPE(
        vocab=vocab, merges=_spm_merges(tokens, scores, types, vocab), unk_token=unk, fuse_unk=True, byte_fallback=True
    )
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    space = [normalizers.Replace(" ", "\u2581")]
    normalizer = normalizers.Sequence(([normalizers.Prepend("\u2581")] if prefix else []) + space)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    return model, None, normalizer, decoders.Sequence(steps)


_TOKENIZER_MODELS = {"gpt2": _bpe_model, "llama": _spm_model}


def build_tokenizer(meta: dict, path: Path):
    """A ``transformers`` fast tokenizer (tokenizers backend, no torch) from the GGUF tokenizer metadata."""
    from tokenizers import AddedToken, Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    kind = meta.get("tokenizer.ggml.model")
    if kind not in _TOKENIZER_MODELS:
        raise GGUFError(
            f"{path}: tokenizer model {kind!r} is not supported (supported: 'gpt2', byte-level BPE; 'llama', "
            "SentencePiece); load with tokenizer=False and attach your own"
        )
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise GGUFError(f"{path}: tokenizer metadata lacks tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    model, pre_tokenizer, normalizer, decoder = _TOKENIZER_MODELS[kind](meta, tokens, types, path)
    tok = Tokenizer(model)
    if pre_tokenizer is not None:
        tok.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.decoder = decoder
    post: list[processors.PostProcessor] = [processors.ByteLevel(trim_offsets=False)] if kind == "gpt2" else []
    # llama.cpp adds BOS (and EOS) to every encoded text where the file asks: encode(..., add_special_tokens=True)
    # does the same
    ends = {}
    for key in ("bos", "eos"):
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        if meta.get(f"tokenizer.ggml.add_{key}_token") and i is not None and 0 <= i < len(tokens):
            ends[key] = (tokens[i], i)
    if ends:
        bos = f"{ends['bos'][0]} " if "bos" in ends else ""
        eos = f" {ends['eos'][0]}" if "eos" in ends else ""
        post.append(
            processors.TemplateProcessing(
                single=f"{bos}$A{eos}", pair=f"{bos}$A{eos} {bos}$B{eos}", special_tokens=list(set(ends.values()))
            )
        )
    if post:
        tok.post_processor = processors.Sequence(post) if len(post) > 1 else post[0]
    control = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == 3]
    user = [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == 4]
    tok.add_special_tokens(control)
    if user:
        tok.add_tokens(user)

    def token(key):
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=token("bos"),
        eos_token=token("eos"),
        unk_token=token("unknown"),
        pad_token=token("padding"),
    )
    template = meta.get("tokenizer.chat_template")
    if template:
        fast.chat_template = template
    return fast


# tokens that end a chat turn or a text, by their text, whatever id a vocabulary gives them (the subset of llama.cpp's
# end-of-generation list for the families jaxspec loads: Llama 3, ChatML, Phi-3, Gemma, DeepSeek, CodeLlama, ...)
_END_TOKENS = (
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",  # DeepSeek's, written with full-width bars and ▁
)


def end_of_generation_ids(meta: dict) -> tuple[int, ...]:
    """The ids that end a row, as llama.cpp decides them: ``tokenizer.ggml.eos_token_id`` first, then the
    ``eot_token_id`` / ``eom_token_id`` the file names, then every token whose text is a known end-of-turn marker
    (``<|im_end|>``, ``<|eot_id|>``, ``<|end|>``, ``<end_of_turn>``, ...). A chat model's turn often ends in a token
    other than its EOS (Phi-3: ``<|end|>`` with EOS ``<|endoftext|>``; Gemma: ``<end_of_turn>`` with ``<eos>``), so
    its replies stop where its chat template ends them."""
    ids = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        value = meta.get(f"tokenizer.ggml.{key}")
        if value is not None and int(value) >= 0 and int(value) not in ids:
            ids.append(int(value))
    tokens = meta.get("tokenizer.ggml.tokens") or []
    wanted = set(_END_TOKENS)
    ids += [i for i, tok in enumerate(tokens) if tok in wanted and i not in ids]
    return tuple(ids)
