"""The records of ``jaxspec generate --input``: one Spec-Bench style record per prompt, the per-category summary
table and the plot of acceptance by draft position."""

from __future__ import annotations

import sys

from jaxspec.cli.common import warn
from jaxspec.formats.jsonl import Row
from jaxspec.policy.cost import position_counts


def accept_lengths(hist, rounds: int | None = None) -> list[int]:
    """Accepted drafts + 1 per round, from a histogram (``hist[n]`` verify rounds accepted exactly n): ascending
    order. With ``rounds`` (all target passes), the rounds the histogram lacks (plain steps taken while the drafter
    abstained) count as 1 each."""
    skipped = 0 if rounds is None else max(int(rounds) - sum(int(c) for c in hist), 0)
    return [1] * skipped + [n + 1 for n, count in enumerate(hist) for _ in range(int(count))]


def make_record(row: Row, result, gamma: int, plain: tuple[float, int] | None = None) -> dict:
    """The record of one finished row: ``row`` its prompt, ``result`` its ``jaxspec.generation.engine.RowResult`` (its
    ``wall_time_s``: its share of the run's device time), ``gamma`` the run's γ; with ``--compare``, ``plain`` =
    (its plain run's time share, its plain new tokens). The fields are listed in ``jaxspec generate --help``;
    ``choices`` is the entry Spec-Bench's ``speed.py`` reads."""
    rs = result.stats
    lengths = accept_lengths(rs.accept_hist, rs.rounds)
    text = result.text
    wall = result.wall_time_s
    rec = {
        "id": row.id,
        "category": row.category,
        "prompt": row.prompt,
        "text": text,
        "token_ids": result.tokens,
        "finish_reason": result.finish_reason,
        "new_tokens": rs.generated_tokens,
        "wall_time": wall,
        "accept_lengths": lengths,
        "alpha": rs.acceptance_rate,
        "rounds": rs.rounds,
        "drafted": rs.drafted,
        "accepted": rs.accepted,
        "accept_hist": list(rs.accept_hist),
        "gamma": gamma,
    }
    if plain is not None:
        rec["plain_wall_time"], rec["plain_new_tokens"] = plain
    if rs.complete is not None:  # a constrained row: whether its output matches the constraint in full
        rec["complete"], rec["forced_tokens"] = rs.complete, rs.forced_tokens
    if row.question:
        rec["question_id"] = row.id
    rec["choices"] = [
        {
            "index": 0,
            "turns": [text],
            "new_tokens": [rs.generated_tokens],
            "wall_time": [wall],
            "accept_lengths": lengths,
        }
    ]
    return rec


def _category(record) -> str:
    return record.get("category") or "(none)"


def _by_category(records: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for rec in records:
        groups.setdefault(_category(rec), []).append(rec)
    return groups


def summary_table(records: list[dict]) -> str:
    """Per category (and in total): rows, tokens, α, τ, tokens/s, speed-up (measured: --compare; else "-")."""
    lines = [("category", "rows", "tokens", "α", "τ", "tok/s", "speed-up")]
    for name, recs in [*sorted(_by_category(records).items()), ("total", records)]:
        tokens = sum(r.get("new_tokens", 0) for r in recs)
        rounds = sum(r.get("rounds", 0) for r in recs)
        drafted = sum(r.get("drafted", 0) for r in recs)
        accepted = sum(r.get("accepted", 0) for r in recs)
        wall = sum(r.get("wall_time", 0.0) for r in recs)
        speed = "-"
        if recs and all("plain_wall_time" in r for r in recs):
            pw = sum(r["plain_wall_time"] for r in recs)
            pt = sum(r["plain_new_tokens"] for r in recs)
            if wall > 0 and pw > 0 and pt > 0:
                speed = f"{(tokens / wall) / (pt / pw):.2f}×"
        lines.append(
            (
                name,
                str(len(recs)),
                str(tokens),
                f"{accepted / drafted:.3f}" if drafted else "-",
                f"{tokens / rounds:.2f}" if rounds and drafted else "-",
                f"{tokens / wall:.1f}" if wall > 0 else "-",
                speed,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))) for line in lines
    )


def position_acceptance(records: list[dict]) -> list[float | None]:
    """P(draft i accepted | drafts before it accepted), i = 1..γ, pooled over rows (rows may differ in γ); None
    where no row reached position i."""
    reached: list[int] = []
    passed: list[int] = []
    for rec in records:
        row_reached, row_passed = position_counts(rec.get("accept_hist") or [])
        for i, (r, a) in enumerate(zip(row_reached, row_passed)):  # rows may differ in γ
            if i == len(reached):
                reached.append(0)
                passed.append(0)
            reached[i] += r
            passed[i] += a
    return [p / r if r else None for p, r in zip(passed, reached)]


def plot_acceptance(records: list[dict], path: str) -> None:
    """Write a PNG of ``position_acceptance`` per category to ``path`` (needs matplotlib); warns and writes nothing
    when no record drafted a token."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {name: position_acceptance(recs) for name, recs in sorted(_by_category(records).items())}
    curves = {k: v for k, v in curves.items() if any(x is not None for x in v)}
    if not curves:
        warn(f"no drafted tokens in these records (plain decoding?); {path} not written")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in curves.items():
        xs = [i + 1 for i, v in enumerate(values) if v is not None]
        ax.plot(xs, [v for v in values if v is not None], marker="o", label=name)
    ax.set_xticks(range(1, max(len(v) for v in curves.values()) + 1))
    ax.set_xlabel("draft position i")
    ax.set_ylabel("P(draft i accepted | drafts before it accepted)")
    ax.set_ylim(0, 1.02)
    ax.set_title("acceptance by draft position")
    ax.legend(title="category")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"jaxspec: wrote {path}", file=sys.stderr)
