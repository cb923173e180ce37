"""The benchmark: the bound formulas against hand-computed values, flag handling, and one ``--quick`` run end to end."""

import dataclasses
import json
import math
import subprocess
import sys

import pytest

import jaxspec
from jaxspec.bench.bounds import bound_cpu, bound_issue, expected_tokens

# ------------------------------------------------------------------------------------------------- bounds


@pytest.mark.parametrize("gamma", [1, 4, 7])
def test_expected_tokens_endpoints(gamma):
    assert expected_tokens(0.0, gamma) == 1.0
    assert expected_tokens(1.0, gamma) == gamma + 1


@pytest.mark.parametrize("gamma, c", [(1, 0.0), (4, 0.05), (7, 0.3)])
def test_bound_a_at_alpha_zero_is_one_round_per_token(gamma, c):
    assert bound_issue(0.0, gamma, c) == pytest.approx(1.0 / (gamma * c + 1.0), rel=1e-12)


@pytest.mark.parametrize("gamma, c", [(1, 0.0), (4, 0.05), (7, 0.3)])
def test_bound_a_at_alpha_one_is_the_limit(gamma, c):
    limit = (gamma + 1) / (gamma * c + 1.0)
    assert bound_issue(1.0, gamma, c) == pytest.approx(limit, rel=1e-12)
    # approaching 1 from below, through the closed form (1 − α^(γ+1)) / ((1 − α)(γc + 1)), gives the same limit
    alpha = 1.0 - 1e-7
    closed = (1.0 - alpha ** (gamma + 1)) / ((1.0 - alpha) * (gamma * c + 1.0))
    assert closed == pytest.approx(limit, rel=1e-5)
    assert bound_issue(alpha, gamma, c) == pytest.approx(limit, rel=1e-5)


def test_bounds_mid_value_by_hand():
    alpha, gamma, c, v = 0.6, 4, 0.05, 1.3
    # 1 − 0.6^5 = 1 − 0.07776 = 0.92224; ÷ (1 − 0.6) = 2.3056 tokens per round
    assert expected_tokens(alpha, gamma) == pytest.approx(2.3056, rel=1e-12)
    # bound A: 2.3056 / (4·0.05 + 1) = 2.3056 / 1.2
    assert bound_issue(alpha, gamma, c) == pytest.approx(2.3056 / 1.2, rel=1e-12)
    assert bound_issue(alpha, gamma, c) == pytest.approx(1.921333333333, rel=1e-10)
    # bound B: 2.3056 / (4·0.05 + 1.3) = 2.3056 / 1.5
    assert bound_cpu(alpha, gamma, c, v) == pytest.approx(1.537066666667, rel=1e-10)


def test_bound_b_with_v_one_is_bound_a():
    for alpha in (0.0, 0.3, 0.9, 1.0):
        assert bound_cpu(alpha, 3, 0.1, 1.0) == pytest.approx(bound_issue(alpha, 3, 0.1), rel=1e-12)


# ------------------------------------------------------------------------------------------------- flags


def test_quick_sets_tiny_defaults_but_explicit_flags_win():
    from jaxspec.bench.__main__ import parse_args

    default, quick = parse_args([]), parse_args(["--quick"])
    assert (default.vocab, default.target_layers, default.pair) == (8192, 16, "both")
    assert (quick.vocab, quick.hidden, quick.target_layers, quick.max_new_tokens) == (256, 64, 2, 16)
    mixed = parse_args(["--quick", "--pair", "both", "--vocab", "512"])
    assert (mixed.pair, mixed.vocab, mixed.hidden) == ("both", 512, 64)


# ------------------------------------------------------------------------------------------------- --quick end to end


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    proc = subprocess.run(
        [sys.executable, "-m", "jaxspec.bench", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout, json.loads(out.read_text())


def test_quick_prints_the_tables(quick_run):
    stdout, doc = quick_run
    for pair in doc["pairs"]:
        assert f"pair: {pair['name']}" in stdout
    assert "summary" in stdout and "efficiency A" in stdout


def test_the_run_names_its_machine(quick_run):
    """The header and the JSON name the CPU and the features its products depend on (VNNI for w8a8's)."""
    from jaxspec.bench.measure import machine

    stdout, doc = quick_run
    assert doc["machine"]["backend"] == "cpu" and f"jax {doc['machine']['jax']}" in stdout
    if "cpu" in doc["machine"]:  # Linux: the model name is in the header too
        assert f"CPU {doc['machine']['cpu']}" in stdout
    cpuinfo = (  # two logical cores of a made-up CPU, in /proc/cpuinfo's layout
        "processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu avx2 avx512f avx512_vnni sse4_2\n\n"
        "processor\t: 1\nmodel name\t: Test CPU 9000\nflags\t\t: fpu avx2 avx512f avx512_vnni sse4_2\n"
    )
    found = machine(cpuinfo)
    assert found["cpu"] == "Test CPU 9000" and found["cpu_cores"] == 2
    assert found["cpu_features"] == ["avx2", "avx512f", "avx512_vnni"]  # in CPU_FEATURES' order, others left out
    assert machine("processor\t: 0\nflags\t\t: fpu sse2\n")["cpu_features"] == []


def test_quick_json_figures_are_consistent(quick_run):
    _, doc = quick_run
    args = doc["args"]
    gamma, max_new = args["gamma"], args["max_new_tokens"]
    assert args["quick"] and doc["pairs"]
    for pair in doc["pairs"]:
        steps, c, v = pair["steps_s"], pair["c"], pair["v"]
        assert all(s > 0 for s in steps.values())
        assert c == pytest.approx(steps["draft_1"] / steps["target_1"])
        assert v == pytest.approx(steps[f"target_{gamma + 1}"] / steps["target_1"])
        assert [t["temperature"] for t in pair["temps"]] == args["temperatures"]
        for t in pair["temps"]:
            alpha, tau = t["alpha"], t["tau"]
            assert 0.0 <= alpha <= 1.0
            assert 1.0 <= tau <= gamma + 1
            assert t["speedup"] > 0 and t["plain_tps"] > 0 and t["spec_tps"] > 0
            spec = t["spec"]
            assert alpha == pytest.approx(sum(r["accepted"] for r in spec) / sum(r["drafted"] for r in spec))
            assert tau == pytest.approx(sum(r["tokens"] for r in spec) / sum(r["rounds"] for r in spec))
            assert all(r["tokens"] == max_new for r in spec + t["plain"])  # no EOS: every run generates max_new
            # the reported bounds are the pure functions of the reported α, γ, c, v
            assert t["bound_issue"] == pytest.approx(bound_issue(alpha, gamma, c), rel=1e-9)
            assert t["bound_cpu"] == pytest.approx(bound_cpu(alpha, gamma, c, v), rel=1e-9)
            assert t["eff_issue"] == pytest.approx(t["speedup"] / t["bound_issue"], rel=1e-9)
            assert t["eff_cpu"] == pytest.approx(t["speedup"] / t["bound_cpu"], rel=1e-9)
            # decode-only: defined from the reported round times (wall minus a separately timed prefill, which
            # on calls this short can exceed a call: then it is NaN, not a negative speed-up)
            if t["plain_round_s"] > 0 and t["spec_round_s"] > 0:
                assert t["decode_speedup"] == pytest.approx(tau * t["plain_round_s"] / t["spec_round_s"], rel=1e-9)
                assert t["decode_speedup"] > 0
            else:
                assert math.isnan(t["decode_speedup"])
        comp = pair["compile_spec"]
        assert comp["lower_s"] > 0 and comp["compile_s"] > 0
        assert comp["total_s"] == pytest.approx(comp["lower_s"] + comp["compile_s"])
        mem = pair["memory"]
        both = mem["target_weights"] + mem["draft_weights"]
        if pair["name"] == "aligned":  # the draft shares the target's embed, final_norm and lm_head
            assert mem["weights_unique"] < both
        else:
            assert mem["weights_unique"] == both


def test_mesh_mode_end_to_end(tmp_path):
    """``--mesh`` on 4 simulated devices: per-device bytes shrink as the mesh splits them, tokens unchanged."""
    out = tmp_path / "mesh.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxspec.bench",
            "--quick",
            "--mesh",
            "2x2",
            "--devices",
            "4",
            "--repeats",
            "1",
            "--mesh-batch",
            "4",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["mode"] == "mesh" and doc["devices"] == 4
    single, mesh = doc["rows"]
    assert [r["mesh"] for r in doc["rows"]] == ["1 device", "2x2"]
    assert all(r["same_tokens"] for r in doc["rows"])
    # the model axis splits the weights (the embedding and LM head by vocabulary, heads, MLP) ...
    assert mesh["target_weights"] < 0.75 * single["target_weights"]
    # ... and the data axis the rows' caches (the quick target's one KV head stays whole over the model axis)
    assert mesh["target_cache"] == single["target_cache"] // 2
    assert "ms/round" in proc.stdout


def test_lookup_workloads_repeat_the_prompt():
    from jaxspec.bench.lookup import WORKLOADS, workload_prompt

    text = "\ndef f(x):\n    return x\n"
    assert workload_prompt(text, "as is") == text
    assert workload_prompt(text, "edit") == "\ndef f(x):\n    return x\n\ndef f(x):\n"
    assert workload_prompt(text, "repeat") == "\ndef f(x):\n    return x\n\n" * 2 + "def f(x):\n"
    assert WORKLOADS == ("as is", "edit", "repeat")
    with pytest.raises(ValueError, match="unknown workload"):
        workload_prompt(text, "summarize")


def test_sweep_gives_every_batch_size_the_same_prompts():
    from jaxspec.bench.sweep import batch_calls, prompt_pool

    ids = [[1], [2, 3], [4]]
    pool = prompt_pool(ids, 8)
    assert pool == [[1], [2, 3], [4], [1], [2, 3], [4], [1], [2, 3]]
    for batch in (1, 2, 4, 8):
        calls = batch_calls(pool, batch)
        assert all(len(c) == batch for c in calls) and [p for c in calls for p in c] == pool
    assert [len(c) for c in batch_calls(pool, 3)] == [3, 3, 2]


def test_sweep_pairs_ratios_by_pass():
    from jaxspec.bench.sweep import paired_ratio

    # the mode is 10 % faster than plain within passes 1 and 2; the machine halves its speed for passes 2 and 3,
    # and recovers in the middle of pass 3, after plain's call. The ratio of the medians would read 110 / 50 = 2.2.
    plain = [[100, 1.0], [100, 2.0], [100, 2.0]]
    mode = [[110, 1.0], [110, 2.0], [110, 1.0]]
    assert paired_ratio(mode, plain) == pytest.approx(1.1)
    assert paired_ratio(plain, plain) == 1.0
    with pytest.raises(ValueError):
        paired_ratio(mode, plain[:2])


def test_sweep_decomposes_speculative_time_against_plain():
    from types import SimpleNamespace

    from jaxspec.bench.sweep import CallRecord, decompose, record

    # Two plain calls: 0.8 s of decoding over 40 loop passes each (a step is 20 ms), 0.2 s of prefill each.
    plain = [CallRecord(wall_s=1.0, prefill_s=0.2, passes=40, row_rounds=80, tokens=80, longest=40)] * 2
    # Two γ=4 calls of the same 80 tokens: 11 passes where 10 would do at τ = 4 (a 50 ms round).
    spec = [CallRecord(wall_s=0.8, prefill_s=0.25, passes=11, row_rounds=20, tokens=80, longest=40)] * 2
    x = decompose(plain, spec, gamma=4, c=0.15, v=1.9)
    assert x["prefill_share"] == pytest.approx(0.2)
    assert x["round_cost"] == pytest.approx(0.05 / 0.02)
    assert x["tau"] == pytest.approx(4.0)
    assert x["straggler"] == pytest.approx(1.1)
    assert x["decode_speedup"] == pytest.approx((160 / 1.1) / (160 / 1.6))
    # Every draft accepted: ceil(40 / 5) = 8 rounds a call at 50 ms, plus the 0.25 s prefills.
    assert x["ceiling"] == pytest.approx((160 / (0.5 + 16 * 0.05)) / (160 / 2.0))
    assert x["bound"] == pytest.approx(4.0 / (4 * 0.15 + 1.9))
    assert decompose(plain, spec, gamma=4)["bound"] is None
    # The same ceiling at other round costs (in plain steps of 20 ms): γ=1 needs ceil(40 / 2) = 20 rounds a call.
    by_gamma = decompose(plain, spec, gamma=4, round_costs={1: 1.5, 4: 2.5})["ceiling_by_gamma"]
    assert by_gamma[1] == pytest.approx((160 / (0.5 + 40 * 1.5 * 0.02)) / 80)
    assert by_gamma[4] == pytest.approx(x["ceiling"])

    rows = [SimpleNamespace(rounds=7, generated_tokens=20), SimpleNamespace(rounds=9, generated_tokens=31)]
    stats = SimpleNamespace(rows=rows, wall_time_s=0.5, generated_tokens=51)
    assert record(stats, 0.1) == CallRecord(0.5, 0.1, passes=9, row_rounds=16, tokens=51, longest=31)


def test_continuous_quick_end_to_end(tmp_path):
    """``--quick --continuous`` at 4 slots (one slot count: the run is compile-bound, ~35 s per slot count): every
    mode; occupancy in (0, 1] and straggler factor >= 1 (its inverse); greedy, so every continuous run generates
    exactly the static runs' tokens (same outputs)."""
    from jaxspec.bench.continuous import BASELINES, DEFAULT_MODES

    out = tmp_path / "continuous.json"
    proc = subprocess.run(
        [sys.executable, "-m", "jaxspec.bench", "--quick", "--continuous", "--slots", "4", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["mode"] == "continuous" and doc["temperatures"] == [0.0] and doc["pool"] == 8
    assert set(BASELINES) <= set(doc["modes"]) and doc["modes"] == list(DEFAULT_MODES)
    assert [b["slots"] for b in doc["blocks"]] == [4]
    # mixed output lengths: each prompt has its own max_new_tokens in [max/8, max]
    budgets = doc["max_new_per_prompt"]
    assert len(budgets) == doc["pool"] and len(set(budgets)) > 1
    assert all(doc["max_new_tokens"] // 8 <= m <= doc["max_new_tokens"] for m in budgets)
    for block in doc["blocks"]:
        modes = block["modes"]
        assert set(modes) == set(doc["modes"])
        static = modes["static-plain"]
        assert 0 < static["tokens"] <= sum(budgets)
        for name, m in modes.items():
            assert m["tok_s"] > 0 and m["straggler"] >= 1.0 - 1e-9
            assert 0.0 < m["occupancy"] <= 1.0 and m["occupancy"] == pytest.approx(1.0 / m["straggler"])
            if name.startswith("cont-"):
                assert m["tokens"] == static["tokens"] and m["same_outputs"] == 1.0
                assert m["syncs_per_100"] >= m["refills_per_100"] > 0
                assert m["straggler_queued"] >= 1.0 - 1e-9  # 8 prompts on 4 slots: the first calls had a queue
            else:
                assert m["straggler_queued"] is None
        first = block["first_calls"]
        assert first["cont-plain"]["compile_s"] > 0 and first["cont-auto"]["setup_s"] > 0
        sync = block["sync"]["cont-plain"]
        assert sync["sync_ms"] > 0 and sync["round_ms"] > 0
        x, g = block["projection"], doc["gamma"]  # τ of the cont-fixed row, c and v measured at these slots
        assert x["tau"] == modes["cont-fixed"]["tau"] and x["c"] > 0 and x["v"] > 0
        assert x["here"] == pytest.approx(x["tau"] / (g * x["c"] + x["v"]))
        assert x["accelerator"] == pytest.approx(x["tau"] / (g * x["c"] + 1))
    assert "sync overhead" in proc.stdout and "projection on an accelerator" in proc.stdout and "summary" in proc.stdout


def test_continuous_flags_and_pool():
    from jaxspec.bench.__main__ import parse_args
    from jaxspec.bench.continuous import mixed_lengths, pool_size

    cont = parse_args(["--continuous"])
    assert (cont.pair, cont.slots, cont.temperatures, cont.repeats, cont.max_new_tokens) == (
        "shipped",
        [1, 4, 16, 64],
        [0.0],
        2,
        128,
    )
    assert pool_size(cont) == 256 and parse_args([]).temperatures == [0.0, 1.0]  # other modes keep theirs
    smol = parse_args(["--continuous", "--pair", "smollm2", "--max-new-tokens", "32"])
    assert (smol.slots, smol.pool, smol.max_new_tokens) == ([1, 4, 16], 32, 32)
    quick = parse_args(["--quick", "--continuous", "--temperatures", "0,1"])
    assert (quick.pair, quick.slots, quick.pool, quick.temperatures) == ("aligned", [1, 4], 8, [0.0, 1.0])
    sizing = parse_args(["--continuous", "--requests", "1,3,16,64"])  # the engine's sizing: 16 slots, 64 tokens
    assert (sizing.requests, sizing.slots, sizing.max_new_tokens) == ([1, 3, 16, 64], [16], 64)
    for bad in (
        ["--continuous", "--continuous-modes", "cont-magic"],
        ["--pair", "smollm2"],
        ["--continuous", "--requests", "0"],
    ):
        with pytest.raises(SystemExit):
            parse_args(bad)
    budgets = mixed_lengths(1000, 128, seed=0)
    assert min(budgets) == 16 and max(budgets) == 128 and budgets == mixed_lengths(1000, 128, seed=0)


def test_humaneval_flags_and_head_modes(small_draft):
    from jaxspec.bench.__main__ import parse_args
    from jaxspec.bench.humaneval import AUTO_MODES, _kwargs, tree_of, with_rules
    from jaxspec.core.acceptance import BlockVerifier, RejectionSampler

    args = parse_args(["--humaneval", "--humaneval-modes", "plain,eagle,eagle-auto", "--eagle-gamma", "2"])
    assert (args.mode, args.humaneval_modes, args.eagle_gamma, args.gamma) == (
        "humaneval",
        ["plain", "eagle", "eagle-auto"],
        [2],
        4,
    )
    assert parse_args(["--humaneval", "--eagle-gamma", "2,4"]).eagle_gamma == [2, 4]
    for bad in (
        ["--humaneval", "--eagle-gamma", "0"],
        ["--humaneval", "--eagle-gamma", "2,0"],
        ["--humaneval", "--humaneval-modes", "eagle-magic"],
    ):
        with pytest.raises(SystemExit):
            parse_args(bad)
    policies = {m: object() for m in AUTO_MODES}
    head = object()
    assert _kwargs("eagle", "draft", 4, policies, head, 2) == dict(draft=head, gamma=2)
    assert _kwargs("eagle", "draft", 4, policies, head) == dict(draft=head, gamma=4)  # default: --gamma
    assert _kwargs("eagle@3", "draft", 4, policies, head, 2) == dict(draft=head, gamma=3)  # one of several
    hybrid = _kwargs("lookup+eagle", "draft", 4, policies, small_draft, 2)  # any model-backed fallback
    assert hybrid == dict(draft=jaxspec.LookupFirst(small_draft, draft_gamma=2), gamma=4)
    auto_head = _kwargs("eagle-auto", "draft", 4, policies, head, 2)
    assert auto_head["gamma"] == "auto" and auto_head["policy"] is policies["eagle-auto"] is not policies["auto"]
    # an EAGLE-3 head beside the EAGLE head: one eagle3@G mode per γ
    args = parse_args(["--humaneval", "--eagle3-head", "h3", "--eagle3-gamma", "2,5"])
    assert (args.eagle3_head, args.eagle3_gamma) == ("h3", [2, 5])
    head3 = object()
    assert _kwargs("eagle3@5", "draft", 4, policies, head, 2, head3) == dict(draft=head3, gamma=5)
    with pytest.raises(SystemExit):
        parse_args(["--humaneval", "--eagle3-gamma", "2,0"])
    assert parse_args(["--humaneval", "--eagle3-context-vocab", "0"]).eagle3_context_vocab == 0
    with pytest.raises(SystemExit):
        parse_args(["--humaneval", "--eagle3-context-vocab", "-1"])
    # the head's trees: one tree:D,B,W mode per shape
    assert parse_args(["--humaneval", "--trees", "5,3,6 6,4,10"]).trees == [(5, 3, 6), (6, 4, 10)]
    assert parse_args(["--humaneval", "--draft-trees", "4,2,4"]).draft_trees == [(4, 2, 4)]
    with pytest.raises(SystemExit):
        parse_args(["--humaneval", "--trees", "5,3"])
    assert _kwargs("tree:5,3,6", "draft", 4, policies, head, 2) == dict(draft=head, tree=(5, 3, 6))
    assert _kwargs("draft-tree:4,2,4", "draft", 4, policies, head, 2) == dict(draft="draft", tree=(4, 2, 4))
    assert parse_args(["--humaneval", "--eagle-scale", "1,0.75"]).eagle_scale == [1.0, 0.75]
    for bad in (["--eagle-scale", "0"], ["--eagle-scale", "1,inf"], ["--eagle-scale", "1,0.7", "--eagle-gamma", "2,4"]):
        with pytest.raises(SystemExit):
            parse_args(["--humaneval", *bad])

    @dataclasses.dataclass(frozen=True)
    class Head:
        temperature_scale: float = 1.0

    scaled = _kwargs("eagle~0.75", "draft", 4, policies, Head(), 2)  # one of several scales, at the head's γ
    assert scaled == dict(draft=Head(0.75), gamma=2)
    # a tree at a tree temperature scale: tree:D,B,W~S
    assert parse_args(["--humaneval", "--tree-scale", "0.9,0.6"]).tree_scale == [0.9, 0.6]
    for bad in (["--tree-scale", "0"], ["--tree-scale", "0.5,nan"]):
        with pytest.raises(SystemExit):
            parse_args(["--humaneval", *bad])

    @dataclasses.dataclass(frozen=True)
    class TreeHead:
        tree_temperature_scale: float | None = None

    got = _kwargs("tree:6,4,10~0.6", "draft", 4, policies, TreeHead(), 2)
    assert got == dict(draft=TreeHead(0.6), tree=(6, 4, 10)) and tree_of("tree:6,4,10~0.6") == (6, 4, 10)
    # the acceptance rule: one for every mode, or MODE/RULE modes (chains and trees), one per rule
    assert parse_args(["--humaneval", "--acceptance", "token,block"]).acceptance == ["token", "block"]
    for bad in (["--acceptance", "greedy"], ["--acceptance", "token,"]):
        with pytest.raises(SystemExit):
            parse_args(["--humaneval", *bad])
    by_rule = _kwargs("eagle@3/token", "draft", 4, policies, head, 2)
    assert by_rule == dict(draft=head, gamma=3, acceptance=RejectionSampler())
    assert type(by_rule["acceptance"]) is RejectionSampler  # not the default, BlockVerifier (a subclass)
    assert _kwargs("fixed/block", "draft", 4, policies, head, 2)["acceptance"] == BlockVerifier()
    by_rule = _kwargs("tree:10,4,16/token", "draft", 4, policies, head, 2)  # a tree by recursive rejection sampling
    assert by_rule == dict(draft=head, tree=(10, 4, 16), acceptance=RejectionSampler())
    modes = ["plain", "eagle", "eagle-auto", "tree:10,4,16"]
    assert with_rules(modes, ["block"]) == modes
    assert with_rules(modes, ["token", "block"]) == [
        "plain",
        "eagle/token",
        "eagle/block",
        "eagle-auto",
        "tree:10,4,16/token",
        "tree:10,4,16/block",
    ]


def test_humaneval_ttft_splits_the_decode_phase_off():
    """--ttft: the decode phase's tokens/s is the tokens after the first round's over the time left after the
    1-token calls (a serving benchmark's time per output token), by hand; None without 1-token calls."""
    from jaxspec.bench.__main__ import parse_args
    from jaxspec.bench.humaneval import FIRST, decode_phase

    assert parse_args(["--humaneval", "--ttft"]).ttft and not parse_args(["--humaneval"]).ttft
    # 10 calls of 1 row, 64 tokens each in 30 s; their 1-token calls 6 s, whose first rounds made 25 tokens
    t = dict(tokens=640, seconds=30.0, first_seconds=6.0, first_tokens=25, first_calls=10)
    assert decode_phase(t) == pytest.approx(615 / 24)
    assert decode_phase(dict(t, **FIRST)) is None  # no --ttft
    assert decode_phase(dict(t, first_seconds=30.0)) is None  # nothing left to time


def test_structured_workload_is_held_out_and_validity_is_checked_by_hand():
    """--structured: its functions come from held-out standard-library files only, and ``valid`` accepts a JSON
    object of the schema and refuses each way of missing it (key order, a non-identifier, a missing key, bad JSON)."""
    from jaxspec.bench import structured
    from jaxspec.training import corpus

    funcs = structured.functions(3)
    held_out = {corpus.read_text(p) for _, p in corpus.stdlib_files("heldout")}
    assert len(funcs) == 3 and all(any(f["source"] in text for text in held_out) for f in funcs)
    good = '{"name": "f", "args": ["x", "y_1"], "returns": "a sum"}'
    assert structured.valid(good)
    for bad in (
        '{"args": [], "name": "f", "returns": ""}',
        '{"name": "f", "args": ["1x"], "returns": ""}',
        '{"name": "f", "args": []}',
        '{"name": "f", "args": [], "returns": "x"',
        '{"name": "f g", "args": [], "returns": ""}',
        '{"name": "f", "args": [], "returns": "' + "x" * 61 + '"}',
    ):
        assert not structured.valid(bad), bad


def test_humaneval_pools_acceptance_by_position_per_call():
    """An auto mode's calls run at different γ: a γ = 2 call accepting both drafts every round and a γ = 4 call
    accepting three of four. Per call, position 3 was reached only by the second and always accepted; read from the
    summed histogram, the first call's full rounds would count as misses there (the bug this guards)."""
    from jaxspec.bench.humaneval import pooled_positions
    from jaxspec.policy.cost import position_counts

    positions, total = pooled_positions([[0, 0, 5], [0, 0, 0, 5, 0]])
    assert positions == [1.0, 1.0, 1.0, 0.0] and total is None  # lengths differ: no summed histogram
    reached, passed = position_counts([0, 0, 5, 5, 0])  # the summed histogram's reading
    assert passed[2] / reached[2] == 0.5
    assert pooled_positions([[1, 2, 3], [0, 1, 1]]) == ([7 / 8, 4 / 7], [1, 3, 4])  # one γ: the sum is kept
    assert pooled_positions([[7]]) == ([], [7])  # plain decoding: no draft positions


def test_humaneval_keeps_every_call_of_a_mode():
    """The HumanEval run's per-call log (each mode's ``calls``), which lets modes be compared call by call: the
    call's seconds, tokens and accepted drafts as its stats give them, and its target passes the slowest row's
    rounds (not the rows' sum), in JSON."""
    from jaxspec.bench.humaneval import call_record
    from jaxspec.generation.results import RowStats, Stats

    rows = (RowStats(64, 20, 60, 44, (1, 5, 14)), RowStats(40, 26, 78, 14, (14, 10, 2)))
    stats = Stats(104, 46, 138, 58, (15, 15, 16), rows=rows, wall_time_s=1.23456, compile_time_s=0.5)
    record = call_record(stats, 3)
    assert record == {"call": 3, "seconds": 1.2346, "tokens": 104, "passes": 26, "accepted": 58, "compile_s": 0.5}
    assert json.loads(json.dumps(record)) == record


def test_humaneval_keeps_every_auto_decision(target, small_draft):
    """The HumanEval run's per-call log of an auto mode keeps what decided it: the chosen γ, the reason, and per
    candidate the round cost and expected speed-up, as the policy computed them."""
    from jaxspec.bench.humaneval import auto_choices, decision_record
    from jaxspec.policy import AutoGamma
    from jaxspec.policy.cost import Costs

    policy = AutoGamma(gammas=(1, 2), keep_costs=False)
    policy.set_costs(target, small_draft, 4, 64, Costs(c=0.1, v={1: 1.1, 2: 1.2}, prefill=0.0, step_s=0.01))
    policy.set_alpha(target, small_draft, True, 0.9)
    chosen = decision_record(policy.decide(target, small_draft, 4, 64, 32, True).as_dict(), 7)
    policy.set_alpha(target, small_draft, True, 0.05)
    plain = decision_record(policy.decide(target, small_draft, 4, 64, 32, True).as_dict(), 8, warm_up=True)
    assert json.loads(json.dumps([chosen, plain])) == [chosen, plain]
    assert (chosen["call"], chosen["warm_up"], chosen["gamma"], chosen["tree"]) == (7, False, 2, None)
    assert (plain["call"], plain["warm_up"], plain["gamma"]) == (8, True, 0)
    assert plain["reason"].startswith("plain") and "γ=2 expected" in chosen["reason"]
    # rounds of γc + v steps; 0.9 at every position blended with the prior (0.6 over 20 drafts): 9012 / 10020
    assert chosen["round_cost"] == {"1": 1.2, "2": 1.4} and chosen["positions"] == [0.899, 0.899]
    assert (chosen["c"], chosen["v"]) == (0.1, {"1": 1.1, "2": 1.2})
    assert chosen["expected_speedup"]["2"] > chosen["expected_speedup"]["1"] > 1 > plain["expected_speedup"]["2"]
    assert chosen["tau"] == {"1": 1.899, "2": 2.708}  # 1 + a, 1 + a + a²
    tree = dict(chosen, gamma=3, tree=[3, 2, 4])
    assert auto_choices([chosen, plain, chosen, tree]) == {"γ=2": 2, "plain": 1, "tree (3, 2, 4)": 1}
