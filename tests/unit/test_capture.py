"""The capture-size chooser: vLLM's default list, the cost fit from real H200 start-up logs, the exact DP."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from graphmode.core.records import StepSizes
from graphmode.selector.capture import CaptureBudget, choose_capture_sizes, parse_keep
from graphmode.selector.capture_costs import (
    CaptureCosts,
    costs_from_dataset,
    default_capture_sizes,
    kv_bytes_per_token,
    measured_kv_bytes_per_token,
)
from graphmode.selector.capture_steps import step_distribution
from tests.support.logs import parse_startup_log_file

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "tests" / "fixtures" / "vllm-0.24-h200"
EDGES = [1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0]


def steps_of(counts: dict[int, float], running: dict[int, int] | None = None, above: float = 0.0) -> StepSizes:
    """A histogram with vLLM's fixed edges, steps put in the bucket of each token count."""
    per = [0.0] * len(EDGES)
    for tokens, n in counts.items():
        per[next(i for i, e in enumerate(EDGES) if tokens <= e)] += n
    return StepSizes(le=EDGES, steps=[*per, above], running=running or {})


def h200_costs(shape: str) -> CaptureCosts:
    return CaptureCosts.from_startups(parse_startup_log_file(p) for p in sorted(H200.glob(f"{shape}-*.log")))


def test_default_list_is_what_vllm_resolved_in_the_fixture_logs() -> None:
    for log in H200.glob("*.log"):
        st = parse_startup_log_file(log)
        if st.capture_sizes:  # NONE logs resolve an empty list
            assert st.capture_sizes == default_capture_sizes(256, st.max_num_batched_tokens), log.name
            assert st.max_capture_size == 512
    assert default_capture_sizes(8) == [1, 2, 4, 8, 16]
    assert default_capture_sizes(1024)[-1] == 512  # min(2 × max_num_seqs, 512)
    assert default_capture_sizes(256, max_num_batched_tokens=100)[-1] == 96  # clipped to the token budget
    assert default_capture_sizes(256, max_capture_size=1024)[-3:] == [992, 1008, 1024]


def test_costs_fit_from_real_logs_reproduce_the_measured_totals() -> None:
    costs = h200_costs("llama8b")
    assert costs.n_starts == 4 and "one size list" in costs.basis  # every start captured the default list
    default = default_capture_sizes()
    for mode, secs, gib in (("FULL", 3.0, 0.68), ("FULL_AND_PIECEWISE", 6.0, 0.98), ("PIECEWISE", 5.0, 0.35)):
        p_s, p_g = costs.predict(default, mode)
        assert p_s == pytest.approx(secs, abs=2.0) and p_g == pytest.approx(gib, abs=0.35), mode
    assert not costs.identified
    # With starts of different lists both terms are identified and recovered exactly.
    truth = (0.05, 0.0002, 0.004, 0.0003)
    lists = [[1, 2, 4, 8], [8, 64, 256, 512], list(range(8, 129, 8))]
    fit = CaptureCosts.fit((s, "FULL", truth[0] * len(s) + truth[1] * sum(s), truth[2] * len(s) + truth[3] * max(s))
                           for s in lists)
    assert (fit.s_per_graph, fit.s_per_token, fit.gib_per_graph, fit.gib_per_max_token) == pytest.approx(truth)
    assert fit.identified and "different size lists" in fit.basis
    assert CaptureCosts.fit([]).n_starts == 0


def test_graph_gib_has_a_base_no_list_saves_once_enough_starts_show_it() -> None:
    lists = [[1, 2, 4, 8], [8, 64, 256, 512], list(range(8, 129, 8)), list(range(8, 513, 8)), [1, 2, 1024]]
    base, per_graph, per_top = 0.2, 0.001, 0.0003
    starts = [(s, "FULL", 0.05 * len(s), base + per_graph * len(s) + per_top * max(s)) for s in lists]
    fit = CaptureCosts.fit(starts)
    assert (fit.gib_base, fit.gib_per_graph, fit.gib_per_max_token) == pytest.approx((base, per_graph, per_top))
    assert "base of 0.20" in fit.basis
    # three starts are a curve through three points: no base, the largest size carries it
    assert CaptureCosts.fit(starts[:3]).gib_base == 0.0
    # lists that all end at one size cannot tell the base from the largest size's term: it is all base, no
    # list ending lower is credited a smaller pool, and none ending higher gets a GiB
    same_top = CaptureCosts.fit([(s, m, c, g) for s, m, c, g in starts if max(s) == 512] * 2)
    assert same_top.gib_base == pytest.approx(base + per_top * 512) and same_top.gib_per_max_token == 0.0
    assert same_top.gib_per_graph == pytest.approx(per_graph) and not same_top.top_identified
    assert same_top.knows_gib([8, 256, 512]) and same_top.knows_gib([8, 64]) and not same_top.knows_gib([8, 1024])
    assert "all ending at 512" in same_top.basis
    assert same_top.predict([8, 64], "FULL")[1] == pytest.approx(base + per_top * 512 + 2 * per_graph)
    # the bundled H200 8B lone starts (vLLM 0.33): 7 sizes to 512 took 0.38 GiB, 41 to 2048 0.87
    costs = costs_from_dataset(ROOT / "models" / "profiles" / "cap-h200-llama-3.1-8b.sqlite")
    assert costs.gib_base > 0.1 and costs.n_starts >= 5
    assert costs.predict([1, 3, 4, 6, 256, 384, 512], "FULL_AND_PIECEWISE")[1] == pytest.approx(0.38, abs=0.04)
    assert costs.predict(default_capture_sizes(), "FULL_AND_PIECEWISE")[1] == pytest.approx(0.45, abs=0.04)
    assert costs.predict([], "FULL_AND_PIECEWISE") == (0.0, 0.0)
    tight = choose_capture_sizes(steps_of({1: 50, 16: 50}), costs=costs, budget=CaptureBudget(max_graph_gib=0.1))
    assert tight.sizes == default_capture_sizes() and "before their sizes count" in " ".join(tight.notes)


def test_kv_cache_tokens_follow_what_vllm_reserved_for_the_graphs_not_what_they_took() -> None:
    lists = [list(range(8, 513, 8)), [1, 2, 4, 8, 512], list(range(16, 513, 16))]
    starts = [(s, "FULL", 0.1 * len(s), 0.1 + 0.001 * len(s), 0.2 + 0.004 * len(s)) for s in lists]
    costs = CaptureCosts.fit(starts)
    assert costs.reserved_n_starts == 3 and "graph-memory estimate in 3" in costs.basis
    assert costs.predict_reserved([8, 512], "FULL") == pytest.approx(0.2 + 0.008, abs=1e-6)
    ans = choose_capture_sizes(steps_of({1: 50, 4: 50}), costs=costs, kv_bytes_per_token=1 << 20, mode="FULL",
                               budget=CaptureBudget(always_keep=[], max_pad_ratio=0))
    reserved_saved = costs.predict_reserved(ans.default_sizes, "FULL") - costs.predict_reserved(ans.sizes, "FULL")
    assert ans.kv_tokens_gained == int(reserved_saved * 1024)  # GiB / (1 MiB a token)
    assert ans.graph_gib_saved is not None and ans.kv_tokens_gained > ans.graph_gib_saved * 1024 * 2
    # starts that never logged an estimate: KV tokens from the graphs' own GiB, as before
    plain = CaptureCosts.fit([t[:4] for t in starts])
    assert plain.reserved_n_starts == 0 and plain.predict_reserved([8], "FULL") is None
    # the bundled H200 lone starts (vLLM 0.33): the 1B's 6-size list gained 7,136 KV cache tokens, the
    # 0.5B's 21,584; from the graphs' own GiB the answer had said ~2,000 and ~4,300
    for shape, six, gained, bpt in (("llama-3.2-1b", [1, 2, 4, 8, 256, 512], 7136, 32768),
                                    ("qwen2.5-0.5b", [1, 2, 4, 8, 256, 512], 21584, 12288)):
        c = costs_from_dataset(ROOT / "models" / "profiles" / f"cap-h200-{shape}.sqlite")
        r_default, r_six = c.predict_reserved(default_capture_sizes(), "FULL_AND_PIECEWISE"), \
            c.predict_reserved(six, "FULL_AND_PIECEWISE")
        assert r_default is not None and r_six is not None
        assert (r_default - r_six) * (1 << 30) / bpt == pytest.approx(gained, rel=0.1), shape


def test_kv_bytes_per_token_from_what_the_engines_logged() -> None:
    from graphmode.core.dataset import ProfileStore

    for shape, bpt in (("llama-3.1-8b", 131072), ("llama-3.2-1b", 32768)):
        with ProfileStore(ROOT / "models" / "profiles" / f"cap-h200-{shape}.sqlite", readonly=True) as store:
            rows = store.rows(status="ok")
        assert measured_kv_bytes_per_token(rows) == pytest.approx(bpt, rel=0.002), shape  # GiB logged to 0.01
        assert measured_kv_bytes_per_token(rows, "another shape") is None
    assert measured_kv_bytes_per_token([{"kv_cache_gib": 1.0, "kv_cache_tokens": 0}, {"kv_cache_gib": None}]) is None
    assert measured_kv_bytes_per_token([{"kv_cache_gib": g, "kv_cache_tokens": 1024} for g in (1.0, 2.0, 9.0)]) \
        == 2 * 1024 * 1024  # the median


def test_every_step_of_size_one_needs_one_graph() -> None:
    ans = choose_capture_sizes(steps_of({1: 5000}), costs=h200_costs("llama8b"), kv_bytes_per_token=131072)
    assert ans.sizes == [1] and ans.max_capture_size == 1
    assert ans.chosen.graphed_share == 1.0 and ans.chosen.padded_tokens_per_step == 0.0
    assert ans.default.graphed_share == 1.0  # the default also graphs size 1, with 50 more sizes
    assert ans.capture_s_saved is not None and ans.capture_s_saved > 0
    assert ans.graph_gib_saved is not None and ans.kv_tokens_gained == int(ans.graph_gib_saved * 2**30 / 131072)
    assert ans.compilation_config() == {"cudagraph_capture_sizes": [1], "max_cudagraph_capture_size": 1}


def test_steps_above_any_allowed_size_are_never_graphed() -> None:
    # All steps in (8192, 16384] with max_num_batched_tokens 8192: nothing a graph could take.
    ans = choose_capture_sizes(steps_of({10000: 40}), max_num_batched_tokens=8192)
    assert ans.sizes == ans.default_sizes and ans.steps_above_limit == 40
    assert ans.chosen.graphed_share == 0.0 and "above 8192" in ans.notes[0]
    # Mixed: 1/5 of the steps above the +Inf edge, the rest at batch 12.
    mixed = choose_capture_sizes(steps_of({12: 80}, running={12: 30}, above=20.0))
    # The top is the bucket's edge (16): a batch of 13..16 the samples missed still replays a graph; 1, 2, 4, 8
    # are kept by default (no step of the window needs them, a quieter hour's will).
    assert mixed.sizes == [1, 2, 4, 8, 12, 16] and mixed.chosen.graphed_share == pytest.approx(0.8)
    # (the padding bound alone needs a size of at most 8: the window alone with it starts at 4)
    assert any(n.startswith("kept 1, 2, 8 so that small batches") for n in mixed.notes)
    assert choose_capture_sizes(steps_of({12: 80}, running={12: 30}, above=20.0), always_keep=(),
                                max_pad_ratio=0).sizes == [12, 16]
    assert any("20.0% of steps are above" in n for n in mixed.notes)


def test_an_empty_window_keeps_the_default() -> None:
    for steps in (None, steps_of({})):
        ans = choose_capture_sizes(steps)
        assert ans.sizes == default_capture_sizes() and ans.steps_observed == 0
        assert ans.chosen.graphed_share is None and "no step in the window" in ans.notes[0]


def test_default_too_short_a_larger_size_is_chosen() -> None:
    # --max-num-seqs 1024: decode batches of 700 run un-graphed under the default list (max 512).
    steps = steps_of({20: 100, 700: 400}, running={20: 10, 700: 40})
    ans = choose_capture_sizes(steps, max_num_seqs=1024, max_num_batched_tokens=8192, max_pad_ratio=0)
    assert ans.default.graphed_share == pytest.approx(0.2) and ans.chosen.graphed_share == 1.0
    assert ans.max_capture_size == 1024 and {20, 700} <= set(ans.sizes)
    assert any("above the default's 512" in n for n in ans.notes)
    # With the padding bound the top and the graphed share are the same, and 700 is still a size of its own.
    bounded = choose_capture_sizes(steps, max_num_seqs=1024, max_num_batched_tokens=8192)
    assert bounded.max_capture_size == 1024 and bounded.chosen.graphed_share == 1.0 and 700 in bounded.sizes


def _brute(weights: dict[int, float], cands: list[int], k: int, must: tuple[int, ...] = ()) -> float:
    top = max(cands)
    best = float("inf")
    for rest in itertools.combinations([c for c in cands if c < top], k - 1):
        if not set(must) <= {*rest, top}:
            continue
        sizes = sorted([*rest, top])
        pad = sum(w * (next(s for s in sizes if s >= t) - t) for t, w in weights.items())
        best = min(best, pad)
    return best


def test_dp_is_exact_against_brute_force() -> None:
    rng = np.random.default_rng(7)
    for _ in range(5):
        batch = {int(b): float(rng.integers(1, 50)) for b in rng.choice(np.arange(1, 60), size=8, replace=False)}
        steps = steps_of(batch, running={b: 1 for b in batch})
        for k in (2, 3, 4):
            # The brute force is over all lists: nothing kept (the kept-size DP is checked below).
            ans = choose_capture_sizes(steps, budget=CaptureBudget(max_sizes=k), padding_tolerance=0.0,
                                       always_keep=())
            # The chooser sees the histogram spread by the running samples (one each), not ``batch`` itself.
            dist = step_distribution(steps, 8192)
            seen = {int(t): float(w) for t, w in enumerate(dist.weight) if w > 0}
            top = ans.max_capture_size
            assert top == next(int(e) for e in EDGES if e >= max(batch))
            cands = sorted({1, 2, 4, *range(8, top + 1, 8), *dist.observed, top})
            got = sum(w * (next(s for s in ans.sizes if s >= t) - t) for t, w in seen.items())
            assert len(ans.sizes) <= k
            assert got == pytest.approx(_brute(seen, cands, min(k, len(cands))))
        for k in (4, 5, 6):  # with sizes kept, the DP is exact over the lists that hold them
            kept = choose_capture_sizes(steps, budget=CaptureBudget(max_sizes=k), padding_tolerance=0.0,
                                        always_keep=(2, 8))
            assert {2, 8} <= set(kept.sizes) and len(kept.sizes) <= k
            got = sum(w * (next(s for s in kept.sizes if s >= t) - t) for t, w in seen.items())
            assert got == pytest.approx(_brute(seen, cands, min(k, len(cands)), (2, 8)))


def test_budget_on_seconds_and_gib_is_respected() -> None:
    costs = h200_costs("llama8b")
    steps = steps_of({t: 10.0 for t in range(1, 257)}, running={t: 1 for t in range(1, 257)})
    for budget in (CaptureBudget(max_capture_s=1.0), CaptureBudget(max_graph_gib=0.1), CaptureBudget(max_sizes=3)):
        ans = choose_capture_sizes(steps, costs=costs, budget=budget)
        secs, gib = costs.predict(ans.sizes, "FULL_AND_PIECEWISE")
        assert budget.max_capture_s is None or secs <= budget.max_capture_s
        assert budget.max_graph_gib is None or gib <= budget.max_graph_gib
        assert budget.max_sizes is None or len(ans.sizes) <= budget.max_sizes
    with pytest.raises(ValueError):
        choose_capture_sizes(steps, coverage=0.0)


def test_kv_bytes_per_token_matches_the_measured_kv_cache() -> None:
    shapes = ROOT / "models" / "shapes"
    # H200 logs: KV cache GiB / tokens = 32 KiB (1B) and 128 KiB (8B) per token in bf16.
    assert kv_bytes_per_token(json.loads((shapes / "llama-3.2-1b.json").read_text())) == 32768
    assert kv_bytes_per_token(json.loads((shapes / "llama-3.1-8b.json").read_text())) == 131072
    assert kv_bytes_per_token({"model_type": "x"}) is None


def test_costs_from_the_bundled_dataset_pick_the_shape() -> None:
    datasets = sorted((ROOT / "models" / "profiles").glob("*h200-*.sqlite"))  # the bundled model's sources
    small, big = costs_from_dataset(*datasets, num_params_b=1.2), costs_from_dataset(*datasets, num_params_b=8.0)
    assert small.n_starts > 0 and big.n_starts > 0
    assert big.gib_per_graph > small.gib_per_graph  # 0.68 vs 0.27 GiB for 51 FULL graphs


def test_bad_step_sizes_are_refused_and_huge_limits_stay_fast() -> None:
    import time

    for bad in ({"le": [8.0, 1.0], "steps": [1.0, 1.0]}, {"le": [1.0], "steps": [-1.0]},
                {"le": [1.0], "steps": [1.0, 1.0, 1.0]}, {"le": [float("nan")], "steps": [1.0]},
                {"le": [1.0], "steps": [1.0], "running": {"-3": 1}}):
        with pytest.raises(ValueError):
            StepSizes.model_validate(bad)
    wide = StepSizes(le=[1.0, 1_000_000.0], steps=[10.0, 1000.0, 0.0])
    t0 = time.perf_counter()
    ans = choose_capture_sizes(wide, max_num_batched_tokens=10_000_000, budget=CaptureBudget(max_sizes=10_000))
    assert time.perf_counter() - t0 < 10 and ans.max_capture_size == 65536 and len(ans.sizes) <= 128


def test_decode_only_mode_says_mixed_steps_run_without_a_graph() -> None:
    steps = StepSizes(le=EDGES, steps=[0.0, 90.0, 0.0, 0.0, 10.0, *[0.0] * 9], running={6: 5},
                      decode_steps=90.0, mixed_steps=10.0)
    ans = choose_capture_sizes(steps, mode="FULL_DECODE_ONLY")
    assert any("the 10 steps that carry prefill" in n for n in ans.notes)
    assert not any("above 8192" in n for n in ans.notes) and ans.steps_above_limit == 10
    # The (32, 64] steps hold prefill: no graph for them in this mode, so the list stops at the decode bucket.
    assert ans.max_capture_size == 8 and ans.chosen.graphed_share == pytest.approx(0.9)
    assert ans.default.graphed_share == pytest.approx(0.9)
    both = choose_capture_sizes(steps)  # FULL_AND_PIECEWISE graphs the mixed steps too
    assert both.max_capture_size == 64 and not any("prefill" in n for n in both.notes)


def test_a_budget_too_small_for_the_top_lowers_it_and_says_so() -> None:
    costs = CaptureCosts(s_per_graph=0.01, gib_per_graph=0.001, gib_per_max_token=0.001, n_starts=2,
                         identified=True, basis="test")
    steps = steps_of({4: 50.0, 20: 30.0, 200: 20.0}, running={4: 5, 20: 3, 200: 2})
    ans = choose_capture_sizes(steps, costs=costs, budget=CaptureBudget(max_graph_gib=0.1))
    # One FULL+PIECEWISE list up to 256 costs ≥ 0.256 GiB for the pool alone: the top drops to fit.
    assert ans.max_capture_size < 200 and ans.chosen.graph_gib is not None and ans.chosen.graph_gib <= 0.1
    assert ans.chosen.graphed_share == pytest.approx(0.8) and any("lowered" in n for n in ans.notes)
    none = choose_capture_sizes(steps, costs=costs, budget=CaptureBudget(max_graph_gib=0.0001))
    assert none.sizes == none.default_sizes and any("even one graph" in n for n in none.notes)
    unchecked = choose_capture_sizes(steps, budget=CaptureBudget(max_capture_s=0.1))
    assert any("not checked" in n for n in unchecked.notes)


def test_a_high_load_window_keeps_small_sizes() -> None:
    # H200, 32 req/s: no step under 63 tokens in the window, so the window alone starts its list at 63-64,
    # and a single-sequence step at a quieter hour pads to that (measured TPOT 1.056x the default's at 2 req/s).
    running = {n: 5 for n in range(63, 102)}
    steps = steps_of({n: 50.0 for n in running} | {1500: 30.0}, running=running)
    costs = h200_costs("llama8b")
    # (graph_long_prefill: the 1500-token mixed steps keep the top at 2048, as the measured list had it)
    # (max_pad_ratio 0: the padding bound, tested on its own below, would fill the gap under 63 as well)
    alone = choose_capture_sizes(steps, costs=costs, always_keep=(), graph_long_prefill=True, max_pad_ratio=0)
    assert min(alone.sizes) >= 63 and not any(n.startswith("kept") for n in alone.notes)
    ans = choose_capture_sizes(steps, costs=costs, graph_long_prefill=True,
                               max_pad_ratio=0)  # the default keeps 1, 2, 4, 8
    assert ans.sizes[:4] == [1, 2, 4, 8] and min(ans.sizes[4:]) >= 63 and ans.max_capture_size == 2048
    assert ans.chosen.graphed_share == alone.chosen.graphed_share == 1.0  # kept sizes take no step of the window
    assert any(n.startswith("kept 1, 2, 4, 8 so that small batches replay a graph") and "would pad to 64" in n
               and "GiB graphs against that list" in n for n in ans.notes)
    # Alone this window takes [1, 3, 8]; with 1, 2, 4, 8 kept a step of 3 pads to 4 (1/3 token per step, within
    # the tolerance), so the fewest sizes are 1, 2, 4, 8 and the note names only the sizes the window lacked.
    low = choose_capture_sizes(steps_of({1: 100.0, 3: 50.0}, running={1: 10, 3: 5}))
    assert choose_capture_sizes(steps_of({1: 100.0, 3: 50.0}, running={1: 10, 3: 5}), always_keep=()).sizes == \
        [1, 3, 8]
    assert low.sizes == [1, 2, 4, 8] and low.chosen.padded_tokens_per_step == pytest.approx(0.333)
    assert any(n.startswith("kept 2, 4 so that") for n in low.notes)
    # A window whose own list holds the kept sizes gets no note; kept sizes above the top are not captured.
    small = choose_capture_sizes(steps_of({1: 100.0, 2: 50.0, 4: 20.0, 8: 10.0}, running={1: 9, 2: 5, 4: 2, 8: 1}),
                                 padding_tolerance=0.0)
    assert small.sizes == [1, 2, 4, 8] and not any(n.startswith("kept") for n in small.notes)
    one = choose_capture_sizes(steps_of({1: 100.0}))
    assert one.sizes == [1]  # 2, 4, 8 are above the top


def test_budgets_count_the_kept_sizes_and_drop_the_largest_first() -> None:
    running = {n: 5 for n in range(63, 102)}
    steps = steps_of({n: 50.0 for n in running}, running=running)
    for k, want in ((1, [128]), (2, [1, 128]), (3, [1, 2, 128]), (5, [1, 2, 4, 8, 128])):
        ans = choose_capture_sizes(steps, budget=CaptureBudget(max_sizes=k))
        assert ans.sizes == want, k
        dropped = [n for n in ans.notes if "dropped (the largest go first)" in n]
        assert bool(dropped) == (k < 5)
    assert any("4, 8 dropped" in n for n in choose_capture_sizes(steps, budget=CaptureBudget(max_sizes=3)).notes)
    # Seconds and GiB are checked on the final list, kept sizes included.
    costs = CaptureCosts(s_per_graph=0.1, gib_per_graph=0.01, n_starts=2, identified=True, basis="test")
    ans = choose_capture_sizes(steps, costs=costs, budget=CaptureBudget(max_capture_s=0.65), mode="FULL")
    assert ans.sizes[:4] == [1, 2, 4, 8] and len(ans.sizes) == 6  # room for one size of the window's own
    tight = choose_capture_sizes(steps, costs=costs, budget=CaptureBudget(max_capture_s=0.35), mode="FULL")
    assert tight.sizes == [1, 2, 128] and any("4, 8 dropped" in n for n in tight.notes)
    assert tight.chosen.capture_s is not None and tight.chosen.capture_s <= 0.35
    # The budget's own always_keep is what the CLI and API set.
    assert choose_capture_sizes(steps, budget=CaptureBudget(always_keep=[])).sizes == \
        choose_capture_sizes(steps, always_keep=()).sizes


def test_padding_and_graphed_share_are_of_the_final_list() -> None:
    # 500 steps of 100 tokens, 5 of one token; two sizes allowed, the top is the bucket edge 128.
    steps = steps_of({1: 5.0, 100: 500.0}, running={1: 1, 100: 10})
    alone = choose_capture_sizes(steps, budget=CaptureBudget(max_sizes=2), always_keep=())
    assert alone.sizes == [100, 128]
    assert alone.chosen.padded_tokens_per_step == pytest.approx(round(5 * 99 / 505, 3))
    kept = choose_capture_sizes(steps, budget=CaptureBudget(max_sizes=2), always_keep=(1,))
    assert kept.sizes == [1, 128] and kept.chosen.graphed_share == 1.0
    assert kept.chosen.padded_tokens_per_step == pytest.approx(round(500 * 28 / 505, 3))  # kept costs padding here
    roomy = choose_capture_sizes(steps, budget=CaptureBudget(max_sizes=3), always_keep=(1,))
    assert roomy.sizes == [1, 100, 128] and roomy.chosen.padded_tokens_per_step == 0.0


def test_bad_sizes_to_keep_are_refused() -> None:
    steps = steps_of({12: 80}, running={12: 30})
    for bad in ((0,), (-1, 2), (1.5,), (True,), ("4",), "1,2", 4, (70000,)):
        with pytest.raises(ValueError):
            choose_capture_sizes(steps, always_keep=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="disagrees"):
        choose_capture_sizes(steps, always_keep=(1,), budget=CaptureBudget(always_keep=[2]))
    for bad_json in ({"always_keep": [0]}, {"always_keep": ["1"]}, {"always_keep": [1.5]}, {"always_keep": 3}):
        with pytest.raises(ValueError):
            CaptureBudget.model_validate(bad_json)
    assert parse_keep("8,1, 2,2") == (1, 2, 8) and parse_keep("none") == () and parse_keep("") == ()
    for text in ("1,x", "0", "1,,2", "-4"):
        with pytest.raises(ValueError, match="comma-separated"):
            parse_keep(text)


def test_long_mixed_steps_do_not_raise_the_top_above_the_defaults() -> None:
    # H200, 8B, 32 req/s: prefill chunks made steps of up to 2048 tokens with at most ~101 sequences running.
    # A list up to 2048 took 0.87 GiB of graphs against the default's 0.45 with no gain shown: by default the
    # top stays at the default's 512 and those steps run without a graph, as under vLLM's list.
    running = {n: 5 for n in range(63, 102)}
    steps = steps_of({n: 50.0 for n in running} | {300: 20.0, 1500: 30.0}, running=running)
    costs = h200_costs("llama8b")
    ans = choose_capture_sizes(steps, costs=costs)
    assert ans.max_capture_size == 512 and 300 <= max(s for s in ans.sizes if s < 512) < 512
    assert ans.chosen.graphed_share == pytest.approx(ans.default.graphed_share)  # the default's 512 too
    assert ans.chosen.graphed_share == pytest.approx(1 - 30 / (50 * 39 + 50))
    assert any(n.startswith("steps of 513-2048 tokens carry prefill") for n in ans.notes)
    wide = choose_capture_sizes(steps, costs=costs, graph_long_prefill=True)
    assert wide.max_capture_size == 2048 and wide.chosen.graphed_share == 1.0
    # the fixture logs all captured the default list: a top of 2048 is past what they can price
    assert ans.chosen.graph_gib is not None and wide.chosen.graph_gib is None
    assert any("graph GiB not predicted" in n and "(512)" in n for n in wide.notes)
    # Decode steps above 512 (1024 sequences allowed, ~700 running) still raise the top: to the bucket's edge.
    long = {n: 3 for n in range(690, 740)}
    decode = choose_capture_sizes(steps_of({n: 10.0 for n in long} | {3000: 5.0}, running=long), max_num_seqs=1024)
    assert decode.max_capture_size == 1024 and decode.default_sizes[-1] == 512
    assert any("carry prefill" in n for n in decode.notes) and any("above the default's 512" in n for n in decode.notes)


def test_one_lists_costs_predict_no_gib_for_a_larger_top() -> None:
    # Fit on starts of one list (to 512), the per-graph term would call a list to 1024 cheaper; its pool is
    # larger (H200, 8B, 2026-12-03: predicted 0.25 GiB, measured 0.60 against the default's 0.45).
    default = default_capture_sizes(512)
    costs = CaptureCosts.fit([(default, "FULL_AND_PIECEWISE", 8.0, 0.45)] * 2)
    assert not costs.identified and costs.max_top == 512
    steps = steps_of({20: 100, 700: 400}, running={20: 10, 700: 40})
    ans = choose_capture_sizes(steps, max_num_seqs=1024, max_num_batched_tokens=8192, costs=costs)
    assert ans.max_capture_size == 1024
    assert ans.chosen.graph_gib is None and ans.graph_gib_saved is None and ans.kv_tokens_gained is None
    assert ans.default.graph_gib == pytest.approx(0.45, rel=1e-3) and ans.capture_s_saved is not None
    assert any("graph GiB not predicted" in n and "(512)" in n for n in ans.notes)
    low = choose_capture_sizes(steps_of({2: 50, 20: 100}, running={2: 10, 20: 10}), costs=costs)
    assert low.chosen.graph_gib is not None and low.graph_gib_saved is not None and low.graph_gib_saved > 0
    assert not any("graph GiB not predicted" in n for n in low.notes)


def _max_gap_ok(sizes: list[int], ratio: float, slack: int = 8) -> bool:
    """Every step up to the top pads by at most ``ratio`` (or ``slack`` tokens), seen in a window or not."""
    lower = 0
    for s in sorted(sizes):
        if s > max(int(ratio * (lower + 1) + 1e-9), lower + slack):
            return False
        lower = s
    return True


def _brute_bounded(weights: dict[int, float], cands: list[int], k: int, ratio: float,
                   must: tuple[int, ...] = ()) -> float:
    top = max(cands)
    best = float("inf")
    for n in range(1, k + 1):
        for rest in itertools.combinations([c for c in cands if c < top], n - 1):
            sizes = sorted([*rest, top])
            if set(must) <= set(sizes) and _max_gap_ok(sizes, ratio):
                best = min(best, sum(w * (next(s for s in sizes if s >= t) - t) for t, w in weights.items()))
    return best


def test_padding_is_bounded_for_steps_the_window_did_not_see() -> None:
    # H200, Llama-3.1-8B, 2 req/s: 1-6 running, one long prefill bucket; unbounded, the list jumped 6 -> 256
    # and 48 running read ITL 1.47x the default list's (2026-12-04).
    running = {1: 500, 2: 100, 3: 200, 4: 100, 6: 50}
    steps = steps_of({1: 500.0, 3: 200.0, 4: 100.0, 6: 50.0, 300: 5.0}, running=running)
    loose = choose_capture_sizes(steps, max_pad_ratio=0)
    assert not _max_gap_ok(loose.sizes, 1.25)
    for ratio in (1.25, 1.5, 2.0):
        ans = choose_capture_sizes(steps, max_pad_ratio=ratio)
        assert ans.max_capture_size == loose.max_capture_size and _max_gap_ok(ans.sizes, ratio), ratio
        assert next(s for s in ans.sizes if s >= 48) <= max(int(ratio * 48), 48 + 8)
        assert any(n.startswith(f"{len(ans.sizes) - len(loose.sizes)} sizes more than the window alone needed")
                   and f"{ratio:g}x" in n for n in ans.notes), ratio
        # the bound costs some padding on the window itself, never graphed steps
        assert ans.chosen.graphed_share == loose.chosen.graphed_share
    default = choose_capture_sizes(steps)
    assert _max_gap_ok(default.sizes, 1.25) and len(default.sizes) < len(default.default_sizes)
    # Every step of size one: the top is 1 and nothing is added.
    one = choose_capture_sizes(steps_of({1: 100.0}))
    assert one.sizes == [1] and not any("sizes more than" in n for n in one.notes)
    # A window already inside the bound gets no note.
    dense = choose_capture_sizes(steps_of({t: 10.0 for t in range(1, 129)}, running={t: 1 for t in range(1, 129)}),
                                 padding_tolerance=0.0)
    assert _max_gap_ok(dense.sizes, 1.25) and not any("sizes more than" in n for n in dense.notes)


def test_bounded_dp_is_exact_against_brute_force() -> None:
    rng = np.random.default_rng(11)
    for _ in range(4):
        batch = {int(b): float(rng.integers(1, 50)) for b in rng.choice(np.arange(1, 60), size=6, replace=False)}
        steps = steps_of(batch, running={b: 1 for b in batch})
        dist = step_distribution(steps, 8192)
        seen = {int(t): float(w) for t, w in enumerate(dist.weight) if w > 0}
        for ratio in (1.5, 2.0):
            for k in (6, 8):
                ans = choose_capture_sizes(steps, budget=CaptureBudget(max_sizes=k), padding_tolerance=0.0,
                                           always_keep=(), max_pad_ratio=ratio)
                top = ans.max_capture_size
                cands = sorted({1, 2, 4, *range(8, top + 1, 8), *dist.observed, top})
                want = _brute_bounded(seen, cands, k, ratio)
                if want == float("inf"):  # k sizes cannot hold the bound: it is dropped, and the answer says so
                    assert any("that bound is dropped" in n for n in ans.notes)
                    continue
                assert _max_gap_ok(ans.sizes, ratio) and len(ans.sizes) <= k
                got = sum(w * (next(s for s in ans.sizes if s >= t) - t) for t, w in seen.items())
                assert got == pytest.approx(want), (ratio, k, ans.sizes)


def test_a_budget_too_small_for_the_bound_drops_it_before_kept_sizes() -> None:
    steps = steps_of({1: 500.0, 3: 200.0, 300: 5.0}, running={1: 500, 3: 200})
    ans = choose_capture_sizes(steps, budget=CaptureBudget(max_sizes=6))
    assert len(ans.sizes) <= 6 and ans.sizes[:4] == [1, 2, 4, 8]
    assert any("that bound is dropped" in n for n in ans.notes)
    assert not any("dropped (the largest go first)" in n for n in ans.notes)
    # The budget's max_pad_ratio is what the CLI and API set; 0 turns the bound off.
    assert choose_capture_sizes(steps, budget=CaptureBudget(max_pad_ratio=0)).sizes == \
        choose_capture_sizes(steps, max_pad_ratio=0).sizes
    assert choose_capture_sizes(steps, budget=CaptureBudget(max_pad_ratio=2)).sizes == \
        choose_capture_sizes(steps, max_pad_ratio=2).sizes


def test_bad_pad_ratios_are_refused() -> None:
    steps = steps_of({12: 80}, running={12: 30})
    for bad in (0.5, 1.0, -2, float("nan"), float("inf"), 100, True, "2"):
        with pytest.raises(ValueError, match="max_pad_ratio"):
            choose_capture_sizes(steps, max_pad_ratio=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="disagrees"):
        choose_capture_sizes(steps, max_pad_ratio=2, budget=CaptureBudget(max_pad_ratio=1.5))
    for bad_json in ({"max_pad_ratio": 1.0}, {"max_pad_ratio": 0.9}, {"max_pad_ratio": -1}, {"max_pad_ratio": 65},
                     {"max_pad_ratio": "x"}):
        with pytest.raises(ValueError):
            CaptureBudget.model_validate(bad_json)


def test_bench_capture_costs_prints_leave_one_out_tables(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.bench import load_bench

    mod = load_bench("capture_costs")
    profiles = ROOT / "models" / "profiles"
    assert mod.main([str(profiles / "cap-h200-llama-3.1-8b.sqlite")]) == 0
    out = capsys.readouterr().out
    assert "5 lone starts, KV bytes per token 131,072" in out
    # the list to 2048 from four lists to 512: no GiB (through the origin it was 1.55 against 0.87)
    assert "| 41 | 2048 | 5 |" in out and "| 0.87 | not predicted | 1.55 (ex) |" in out
    assert "| 7 | 512 | 2 | 1.0 | 0.38 | 0.39 | 0.20 |" in out  # held out: with the base 0.39, without 0.20
    assert mod.main(["--pool", str(profiles / "cap-h200-llama-3.1-8b.sqlite"),
                     str(profiles / "cap-h200-llama-3.1-8b-long.sqlite")]) == 0
    assert "| 0.87 | 0.99 (ex) | 1.28 (ex) |" in capsys.readouterr().out
    assert mod.main([str(profiles / "missing.sqlite")]) == 2
