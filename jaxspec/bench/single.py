"""The default mode: one γ, every requested pair, every requested temperature; then the in-loop breakdown of the
first pair and a summary."""

from __future__ import annotations

from jaxspec.bench.compare import bench_pair
from jaxspec.bench.measure import measure_breakdown
from jaxspec.bench.pairs import build_pairs
from jaxspec.bench.report import format_breakdown, format_pair, format_summary, to_json


def run(args) -> dict:
    """Prints the tables as it goes; returns the JSON document."""
    pairs = build_pairs(args)
    reports = []
    for pair in pairs:
        reports.append(bench_pair(pair, args))
        print(format_pair(reports[-1], args), flush=True)
    bd = None
    if args.breakdown_repeats > 0:
        bd = measure_breakdown(pairs[0], args, reports[0].cache_len, args.breakdown_repeats)
        print(format_breakdown(bd, reports[0], args), flush=True)
    print(format_summary(reports, args), flush=True)
    return to_json(reports, bd, args)
