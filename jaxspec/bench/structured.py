"""The ``--structured`` mode: structured output with speculation on a JSON-extraction workload.

Workload: functions of the standard library's *held-out* files (``jaxspec.training.corpus.stdlib_files``: never
trained on), each shown to SmolLM2-135M-Instruct with the request to describe it as a JSON object
``{"name", "args", "returns"}`` of ``SCHEMA`` (identifiers for the name and the arguments, at most 8 of them, and
at most 60 characters for what it returns).
Modes, interleaved prompt by prompt at batch 1 (greedy, the chat template): plain decoding without the constraint,
plain decoding with it, and speculative decoding with it, drafted by the shipped EAGLE head, by prompt lookup and by
``LookupFirst`` (prompt lookup's copies where the context matches, γ = 4, the head's two drafts elsewhere).
Reported per mode: schema-valid outputs (parsed and checked against the schema by hand, not by the automaton),
complete outputs, name/args equal to the function's own (read with ``ast``), tokens, tok/s, α, τ, the share of
forced tokens, the speed-up over constrained plain decoding (greedy outputs are the same in every constrained
mode: exact) and the cost per token against unconstrained plain decoding.
"""

from __future__ import annotations

import ast
import json
import re

import jaxspec
from jaxspec.bench.humaneval import HEAD, TARGET, bucket_cache
from jaxspec.generation.request import tokenize
from jaxspec.training import corpus

IDENT = "^[A-Za-z_][A-Za-z0-9_]*$"
RETURNS_MAX = 60  # characters of "returns"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": IDENT},
        "args": {"type": "array", "items": {"type": "string", "pattern": IDENT}, "maxItems": 8},
        # bounded: the prompt asks for a few words, and unbounded, 2 of 24 outputs looped inside this string until
        # max_new_tokens (a constraint's length bound multiplies its automaton's states: 97 -> 688 here)
        "returns": {"type": "string", "maxLength": RETURNS_MAX},
    },
    "required": ["name", "args", "returns"],
}
PROMPT = (
    "Describe this Python function as a JSON object with the keys name (the function's name), args (its "
    "parameter names) and returns (what it returns, in a few words).\n\n```python\n{source}\n```"
)
# plain-free: no constraint; plain-any: a constraint that allows every text (the masking's cost on the same tokens);
# the others constrained by SCHEMA
MODES = ("plain-free", "plain-any", "plain", "eagle", "lookup", "lookup+eagle")
SPECULATIVE = ("eagle", "lookup", "lookup+eagle")
ANY = r"[\s\S]*"


def functions(count: int, files=None) -> list[dict]:
    """The first ``count`` top-level functions of the held-out standard-library files (in file order; or of
    ``files``, ``(name, path)`` pairs, for training data) with a docstring, 1 to 6 parameters and at most 20 lines:
    ``{"name", "args", "source"}``."""
    out = []
    for _, path in corpus.stdlib_files("heldout") if files is None else files:
        text = corpus.read_text(path)
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines()
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or ast.get_docstring(node) is None:
                continue
            a = node.args
            args = [x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]]
            assert node.end_lineno is not None
            if not 1 <= len(args) <= 6 or node.end_lineno - node.lineno >= 20:
                continue
            source = "\n".join(lines[node.lineno - 1 : node.end_lineno])
            out.append({"name": node.name, "args": args, "source": source})
            if len(out) == count:
                return out
    return out


def valid(text: str) -> bool:
    """Whether ``text`` is a JSON object of ``SCHEMA``: exactly its keys, in order, of its types, patterns and
    lengths."""
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    if not isinstance(doc, dict) or list(doc) != ["name", "args", "returns"]:
        return False
    name, args, returns = doc["name"], doc["args"], doc["returns"]
    ident = re.compile(IDENT)
    return (
        isinstance(name, str)
        and bool(ident.match(name))
        and isinstance(args, list)
        and len(args) <= 8
        and all(isinstance(x, str) and ident.match(x) for x in args)
        and isinstance(returns, str)
        and len(returns) <= RETURNS_MAX
    )


def run(args) -> dict:
    """Loads the pair, runs every mode on every prompt (one warm-up call per mode first, so compiles are not timed),
    prints the table and returns the JSON document."""
    target = jaxspec.load(TARGET, quantize=args.quantize)
    head = jaxspec.eagle.load(HEAD, target)
    funcs = functions(args.structured_prompts)
    prompts = [PROMPT.format(source=f["source"]) for f in funcs]
    rule = jaxspec.JsonSchema(SCHEMA)
    settings: dict[str, dict] = {
        "plain-free": dict(draft=None),
        "plain-any": dict(draft=None, constraint=jaxspec.Regex(ANY)),
        "plain": dict(draft=None, constraint=rule),
        "eagle": dict(draft=head, constraint=rule),
        "lookup": dict(draft="prompt_lookup", constraint=rule),
        "lookup+eagle": dict(draft=jaxspec.LookupFirst(head), gamma=4, constraint=rule),
    }
    # one cache length for every call (the longest prompt's bucket), so each mode compiles once, in its warm-up
    lengths = [len(ids) for ids in tokenize(target, prompts, chat=True)]
    longest = prompts[lengths.index(max(lengths))]
    max_length = bucket_cache(max(lengths) + args.max_new_tokens)
    common: dict = dict(max_new_tokens=args.max_new_tokens, temperature=0.0, chat=True, max_length=max_length)
    compile_s = {}
    for mode, kw in settings.items():  # warm-up: compiles every program the timed calls run
        compile_s[mode] = jaxspec.generate(target, [longest], **kw, **common).stats.compile_time_s
    rows: dict[str, list] = {m: [] for m in MODES}
    for i, prompt in enumerate(prompts):
        for mode, kw in settings.items():
            res = jaxspec.generate(target, [prompt], **kw, **common)
            stats = res.stats
            text = res.texts[0] if res.texts else ""
            ok = valid(text)
            doc = json.loads(text) if ok else {}
            rows[mode].append(
                {
                    "tokens": stats.generated_tokens,
                    "wall_s": stats.wall_time_s,
                    "compile_s": stats.compile_time_s,
                    "rounds": stats.rounds,
                    "drafted": stats.drafted,
                    "accepted": stats.accepted,
                    "forced": stats.forced_tokens,
                    "valid": ok,
                    "complete": stats.rows[0].complete,
                    "same_function": ok and doc["name"] == funcs[i]["name"] and doc["args"] == funcs[i]["args"],
                    "token_ids": res.tokens[0],
                    "text": text,
                }
            )
    summary = {}
    for mode in MODES:
        r = rows[mode]
        tokens, wall = sum(x["tokens"] for x in r), sum(x["wall_s"] for x in r)
        drafted, accepted, rounds = (sum(x[k] for x in r) for k in ("drafted", "accepted", "rounds"))
        summary[mode] = {
            "prompts": len(r),
            "tokens": tokens,
            "wall_s": wall,
            "tok_s": tokens / wall if wall else None,
            "s_per_token": wall / tokens if tokens else None,
            "alpha": accepted / drafted if drafted else None,
            "tau": tokens / rounds if rounds else None,
            "forced_share": sum(x["forced"] for x in r) / tokens if tokens else None,
            "valid": sum(x["valid"] for x in r) / len(r),
            "complete": None if mode == "plain-free" else sum(bool(x["complete"]) for x in r) / len(r),
            "same_function": sum(x["same_function"] for x in r) / len(r),
            "compile_s_first_call": compile_s[mode],
            "compile_s_later_calls": sum(x["compile_s"] for x in r),
        }
    base = summary["plain"]["wall_s"]
    for mode in MODES:
        free = mode in ("plain-free", "plain-any")
        summary[mode]["speedup_vs_constrained_plain"] = None if free else base / summary[mode]["wall_s"]
    same = all(
        rows[m][i]["token_ids"] == rows["plain"][i]["token_ids"] for m in SPECULATIVE for i in range(len(prompts))
    )
    # the masking's cost: the permissive constraint against none, over the same prompts (the same tokens, unless the
    # model picks a special token that the constraint never allows)
    same_free = sum(
        rows["plain-any"][i]["token_ids"] == rows["plain-free"][i]["token_ids"] for i in range(len(prompts))
    )
    overhead = summary["plain-any"]["s_per_token"] / summary["plain-free"]["s_per_token"] - 1
    print(
        f"\nstructured output: {len(prompts)} held-out stdlib functions -> JSON {{name, args, returns}}, "
        "batch 1, greedy"
    )
    print(
        f"{'mode':12s} {'valid':>6s} {'complete':>8s} {'same fn':>7s} {'tokens':>6s} {'tok/s':>6s} {'α':>6s} "
        f"{'τ':>5s} {'forced':>6s} {'vs plain':>8s}"
    )
    for mode in MODES:
        s = summary[mode]

        def f(x, fmt):
            return "-" if x is None else format(x, fmt)

        print(
            f"{mode:12s} {s['valid']:6.0%} {f(s['complete'], '8.0%')} {s['same_function']:7.0%} {s['tokens']:6d} "
            f"{f(s['tok_s'], '6.1f')} {f(s['alpha'], '6.3f')} {f(s['tau'], '5.2f')} {f(s['forced_share'], '6.1%')} "
            f"{f(s['speedup_vs_constrained_plain'], '8.2f')}"
        )
    print(
        f"constrained outputs equal across constrained modes (greedy, exact): {same}; the masking costs "
        f"{overhead:+.1%} per token (plain-any against plain-free, {same_free}/{len(prompts)} outputs the same); "
        f"compiles after the warm-up: {sum(summary[m]['compile_s_later_calls'] for m in MODES):.1f} s"
    )
    for r in rows.values():
        for x in r:
            x.pop("token_ids")
    return {
        "mode": "structured",
        "target": TARGET,
        "head": HEAD,
        "schema": SCHEMA,
        "summary": summary,
        "constrained_outputs_equal": same,
        "quantize": args.quantize,
        "max_length": max_length,
        "same_outputs_any_vs_free": same_free,
        "overhead_per_token": overhead,
        "rows": rows,
    }
