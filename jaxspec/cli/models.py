"""The target and draft named on the command line (``--target``, ``--draft``, ``--dtype``, ``--chat``): checked
before anything is loaded, then loaded, and the keyword arguments of ``jaxspec.generate`` / ``jaxspec.stream``."""

from __future__ import annotations

import argparse

import jaxspec
from jaxspec.cli.common import CliError
from jaxspec.cli.progress import Progress
from jaxspec.drafters import eagle
from jaxspec.formats import eagle3 as eagle3_format
from jaxspec.formats import hub, named, paths

# a named model: SmolLM2-135M-Instruct (GGUF, fetched once; jaxspec.formats.named)
DEFAULT_TARGET = "smollm2-135m-instruct"
# The default --draft: the target's own shipped drafter (``NamedModel.drafter``: SmolLM2's EAGLE head, the fastest
# drafter on HumanEval), else prompt lookup, which needs no weights.
DEFAULT_DRAFT = "prompt_lookup"


def default_draft(target: str) -> str:
    """The ``--draft`` of a command line that names none: ``target``'s shipped drafter when it is a named model
    that has one (``jaxspec.formats.named``), else ``DEFAULT_DRAFT``."""
    own = named.MODELS[target].drafter if named.names_model(target) else ""
    return own or DEFAULT_DRAFT


def is_none(draft: str) -> bool:
    """Whether a ``--draft`` value means plain decoding (``none`` or ``plain``, any case)."""
    return draft.lower() in ("none", "plain")


def check_model_arg(value: str, flag: str) -> None:
    """Raise ``CliError`` (naming ``flag``) unless ``value`` is a named model, a model directory, a GGUF file, a
    shipped model name or a Hugging Face Hub id. Named models and Hub ids pass unchecked: they are installed,
    cached or fetched when loaded."""
    if named.names_model(value) or (hub.is_repo_id(value) and not value.startswith(paths.SHIPPED_PREFIX)):
        return  # a failed fetch says what to run
    try:
        path = paths.resolve(value)
    except FileNotFoundError as err:
        raise CliError(f"{flag}: {err}") from None
    if not path.is_dir() and not (path.is_file() and path.suffix == ".gguf"):
        raise CliError(
            f"{flag}: {value!r} is not a model directory, a GGUF file, a named model, a shipped model name or a "
            "Hugging Face Hub id"
        )


def check_models(args: argparse.Namespace) -> None:
    """Check ``--target``, ``--draft`` and ``--compare`` before any model is loaded."""
    if args.compare and is_none(args.draft):
        raise CliError("--compare needs a draft (it measures speculative against plain decoding); got --draft none")
    check_model_arg(args.target, "--target")
    if not is_none(args.draft) and args.draft != "prompt_lookup":
        check_model_arg(args.draft, "--draft")


def load_models(args: argparse.Namespace, progress: Progress | None = None):
    """(target ``CausalLM``, draft) from ``args``; the draft is a ``CausalLM``, an EAGLE head
    (``jaxspec.eagle.EagleDrafter``), ``"prompt_lookup"`` or None (plain decoding). Resolves ``args.chat`` when
    unset: on when the target's tokenizer has a chat template. ``progress`` says "loading" for each model loaded
    (a named model's first use fetches it too, which takes a while)."""
    progress = progress or Progress(False)

    def load(value, flag):
        try:
            fmt = getattr(args, "quantize", None)
            return jaxspec.load(value, args.dtype, **({"quantize": fmt} if fmt else {}))
        except (OSError, ValueError) as err:  # not found, gated (PermissionError), unsupported
            raise CliError(f"{flag}: cannot load {value!r}: {err}") from None

    progress.stage("loading", f"target {args.target}")
    target = load(args.target, "--target")
    if is_none(args.draft):
        draft = None
    elif args.draft == "prompt_lookup":
        draft = "prompt_lookup"
    else:
        progress.stage("loading", f"draft {args.draft}")
        draft = _load_draft(args.draft, target, load, getattr(args, "quantize", None))
    if target.tokenizer is None:
        raise CliError(f"--target: {args.target!r} has no tokenizer; the command line works with text prompts")
    if args.chat is None:
        args.chat = getattr(target.tokenizer, "chat_template", None) is not None
    elif args.chat and getattr(target.tokenizer, "chat_template", None) is None:
        raise CliError(f"--chat: {args.target!r}'s tokenizer has no chat template")
    return target, draft


def _load_draft(value: str, target, load, fmt: str | None = None):
    """A draft model, or an EAGLE head (``jaxspec.eagle``: saved, or a published EAGLE-3 checkpoint) made for
    ``target``; with ``fmt`` (``--quantize``) the head's own weights quantized too (a model's as ``load`` reads
    it)."""
    where = paths.resolve(value)
    if eagle.is_head(where) or eagle3_format.is_eagle3(where):
        try:
            head = eagle.load(value, target)
        except ValueError as err:
            raise CliError(f"--draft: cannot load {value!r}: {err}") from None
        return head if fmt is None else jaxspec.quantize(head, fmt)
    return load(value, "--draft")


def gen_kwargs(args: argparse.Namespace, draft, chat: bool = True) -> dict:
    """The decoding keyword arguments of ``jaxspec.generate`` (and ``jaxspec.Engine``) from ``args`` (``gamma``
    only with a draft; ``chat`` unless ``chat=False``)."""
    kw = dict(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
    )
    if chat:
        kw["chat"] = args.chat
    if draft is not None:
        kw["gamma"] = args.gamma
        if getattr(args, "tree", None) is not None:
            kw["tree"] = args.tree
    return kw
