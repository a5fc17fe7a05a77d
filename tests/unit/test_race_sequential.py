"""The race's statistics and workload choice, on synthetic rounds (no server)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from graphmode.profiling.grid import LengthDist, Workload
from graphmode.profiling.race_design import next_workload, race_cell, spread_order
from graphmode.profiling.race_rounds import DEFAULT_ARM, RoundTable, arm_verdicts, table_from_rows
from graphmode.profiling.sequential import SequentialRule, decide, interval

RULE = SequentialRule(delta=0.03, confidence=0.95, min_rounds=3)


def logs(*ratios: float) -> list[float]:
    return [math.log(r) for r in ratios]


def test_clearly_worse_is_worse_after_min_rounds() -> None:
    d = decide(logs(1.30, 1.25, 1.35), RULE)
    assert d.verdict == "worse" and d.n == 3
    assert d.lo is not None and d.lo > 1.03 and d.ratio == pytest.approx(math.exp(np.mean(logs(1.30, 1.25, 1.35))))


def test_clearly_better_is_better() -> None:
    d = decide(logs(0.66, 0.70, 0.62, 0.68), RULE)
    assert d.verdict == "better" and d.hi is not None and d.hi < 0.97


def test_equivalent_needs_the_whole_interval_inside_the_band() -> None:
    tight = decide(logs(1.004, 0.998, 1.001, 0.999, 1.003), RULE)
    assert tight.verdict == "equivalent"
    assert tight.lo is not None and tight.hi is not None and tight.lo >= 1 / 1.03 and tight.hi <= 1.03
    wide = decide(logs(1.00, 1.05, 0.95), RULE)  # mean 1, but the interval reaches past both margins
    assert wide.verdict == "undecided" and "both margins" in wide.why


def test_no_verdict_before_min_rounds_however_clear() -> None:
    assert decide(logs(2.0, 2.0), RULE).verdict == "undecided"
    assert "2 of the 3 rounds" in decide(logs(2.0, 2.0), RULE).why
    assert decide([], RULE).verdict == "undecided"
    assert decide(logs(2.0, 2.1, 1.9), SequentialRule(min_rounds=4)).verdict == "undecided"


def test_undecided_when_the_interval_straddles_a_margin() -> None:
    d = decide(logs(1.04, 1.10, 0.99, 1.06), RULE)
    assert d.verdict == "undecided" and "1+δ" in d.why


def test_interval_is_scipys_t_interval() -> None:
    ys = [0.01, 0.05, -0.02, 0.03, 0.04]
    mean, lo, hi = interval(ys, 0.95)
    ref = stats.t.interval(0.95, len(ys) - 1, loc=np.mean(ys), scale=stats.sem(ys))
    assert (lo, hi) == pytest.approx(ref) and mean == pytest.approx(np.mean(ys))


def test_delta_and_confidence_are_settings() -> None:
    ys = logs(1.05, 1.06, 1.04, 1.05)
    assert decide(ys, SequentialRule(delta=0.03, start_margin=0.0)).verdict == "worse"
    # rounds of one start each: 5% is within what a start alone moves (the start margin)
    assert decide(ys, RULE).verdict == "undecided" and "not past the start margin (1.138)" in decide(ys, RULE).why
    assert decide(ys, SequentialRule(delta=0.10)).verdict == "equivalent"
    with pytest.raises(ValueError):
        SequentialRule(delta=0)
    with pytest.raises(ValueError):
        SequentialRule(min_rounds=1)


def test_false_positive_rate_of_an_aa_arm_is_small() -> None:
    """Null ratios with 5% noise: after 10 rounds a 95% rule seldom calls 'worse' or 'better'."""
    rng = np.random.default_rng(0)
    calls = [decide(list(rng.normal(0, 0.05, 10)), RULE).verdict for _ in range(2000)]
    wrong = sum(v in ("worse", "better") for v in calls) / len(calls)
    assert wrong < 0.03


def _w(name: str, rate: float, i: int, o: int, burst: float = 1.0, conc: int | None = None) -> Workload:
    return Workload(name=name, rate=rate, burstiness=burst, input=LengthDist(mean=i), output=LengthDist(mean=o),
                    max_concurrency=conc)


DESIGN = [_w("a-low-decode", 2, 64, 512), _w("b-low-decode2", 2.5, 64, 500), _w("c-high-prefill", 32, 1536, 32),
          _w("d-mid-bursty", 8, 256, 256, burst=0.25)]


def test_spread_order_visits_the_far_corner_before_the_near_twin() -> None:
    names = [w.name for w in spread_order(DESIGN)]
    assert names[0] == "a-low-decode"
    assert names.index("b-low-decode2") == 3  # the near twin of the first comes last
    assert sorted(names) == sorted(w.name for w in DESIGN)


def test_next_workload_cycles_and_skips_closed_ones() -> None:
    order = spread_order(DESIGN)
    names = {w.name for w in DESIGN}
    assert next_workload(order, {}, names) == order[0]
    seen = {order[0].name: 1}
    assert next_workload(order, seen, names) == order[1]
    assert next_workload(order, {w.name: 2 for w in order}, names - {order[0].name}) == order[1]
    assert next_workload(order, {}, set()) is None


def test_race_cell_is_short_and_fixed() -> None:
    cell = race_cell(_w("x", 8, 64, 64), cell_s=3, warmup_s=1.5)
    assert cell.duration_s == 3 and cell.warmup_s == 1.5 and cell.adaptive is not None
    assert cell.adaptive.min_s == cell.duration_s  # the window's minimum is its maximum
    # and so is the warm-up's: every arm of a round measures the same window of the same plan
    assert cell.adaptive.min_warmup_s == cell.warmup_s == 1.5
    assert race_cell(_w("y", 8, 64, 64), cell_s=3, warmup_s=0).adaptive.min_warmup_s == 0


def test_round_table_pairs_in_round_and_flags_workload_dependence() -> None:
    t = RoundTable()
    for r in range(6):
        w = "good" if r % 2 == 0 else "bad"
        t.add(DEFAULT_ARM, r, w, {"itl_p50": 1.0})
        t.add("FULL", r, w, {"itl_p50": 0.8 * (1 + 0.001 * r) if w == "good" else 1.25 * (1 + 0.001 * r)})
    t.add("FULL", 6, "good", {"itl_p50": 0.8})  # the default has no cell in round 6: unpaired
    assert len(t.pairs("FULL", "itl_p50")) == 6
    v = arm_verdicts(t, "FULL", ["itl_p50"], RULE)
    assert v.pooled["itl_p50"].verdict == "undecided"
    assert v.by_workload[("itl_p50", "good")].verdict == "better"
    assert v.by_workload[("itl_p50", "bad")].verdict == "worse"
    why = v.workload_dependent("itl_p50")
    assert why is not None and "better on good" in why and "worse on bad" in why


def test_table_from_rows_keeps_ok_race_rows_only() -> None:
    rows = [
        {"status": "ok", "race_round": 0, "race_arm": DEFAULT_ARM, "workload": "w", "itl_p50": 0.002},
        {"status": "ok", "race_round": 0, "race_arm": "NONE", "workload": "w", "itl_p50": 0.003},
        {"status": "failed", "race_round": 1, "race_arm": "NONE", "workload": "w", "itl_p50": None},
        {"status": "ok", "race_round": None, "race_arm": None, "workload": "w", "itl_p50": 0.001},
    ]
    t = table_from_rows(rows, ["itl_p50"])
    assert t.pairs("NONE", "itl_p50") == [(0, "w", pytest.approx(math.log(1.5)))]
    assert t.rounds == [0]


def test_a_verdict_stands_once_reached() -> None:
    from graphmode.profiling.sequential import sequential_decision

    ys = logs(0.70, 0.72, 0.71, 1.3, 1.4, 0.9)  # better after 3 rounds; later rounds would reopen it
    assert decide(ys, RULE).verdict == "undecided"
    first = sequential_decision(ys, RULE)
    assert first.verdict == "better" and first.n == 3
    assert sequential_decision(logs(1.1, 0.9), RULE).verdict == "undecided"


def test_per_workload_verdicts_are_bonferroni_corrected() -> None:
    from graphmode.profiling.race_rounds import workload_rule

    assert workload_rule(RULE, 1) == RULE
    assert workload_rule(RULE, 5).confidence == pytest.approx(0.99)
    t = RoundTable()
    ratios = [0.95, 0.955, 0.945]  # better at 95%, not at 99% per workload
    for r, x in enumerate(ratios):
        for w in ("a", "b", "c", "d", "e"):
            t.add(DEFAULT_ARM, r * 5 + ord(w), w, {"itl_p50": 1.0})
        t.add("FULL", r * 5 + ord("a"), "a", {"itl_p50": x})
    v = arm_verdicts(t, "FULL", ["itl_p50"], RULE, ["a", "b", "c", "d", "e"])
    assert decide(logs(*ratios), RULE).verdict == "better"
    assert v.by_workload[("itl_p50", "a")].verdict == "undecided"


def test_one_start_per_arm_takes_worse_only_past_the_start_margin() -> None:
    """With one start each the rounds' interval cannot hold the start effect: a steady 1.2× is "worse" on ITL
    (past ln 1.03 + 0.10) but not on TTFT (ln 1.03 + 0.20), where an A/A arm on the H200 read 1.228×; a 1.4×
    is "worse" on both."""
    def table(ratio: float) -> RoundTable:
        t = RoundTable()
        for rnd in range(8):
            wobble = 1 + 0.002 * (rnd % 3)
            t.add(DEFAULT_ARM, rnd, "w", {"itl_p50": 0.002, "ttft_p50": 0.02}, start="d1")
            t.add("FULL", rnd, "w", {"itl_p50": 0.002 * ratio * wobble, "ttft_p50": 0.02 * ratio * wobble},
                  start="f1")
        return t

    rule = SequentialRule(min_starts=1)
    mild = arm_verdicts(table(1.2), "FULL", ["itl_p50", "ttft_p50"], rule)
    assert mild.pooled["itl_p50"].verdict == "worse"
    assert mild.pooled["ttft_p50"].verdict == "undecided"
    clear = arm_verdicts(table(1.4), "FULL", ["itl_p50", "ttft_p50"], rule)
    assert clear.pooled["itl_p50"].verdict == clear.pooled["ttft_p50"].verdict == "worse"
    # a better from one start is still a verdict (the selector wants a second start before acting on it)
    assert arm_verdicts(table(0.8), "FULL", ["itl_p50"], rule).pooled["itl_p50"].verdict == "better"


def test_an_arm_worse_on_one_metric_and_not_better_on_the_others_is_settled() -> None:
    """PIECEWISE on the H200 lost 2–3× ITL in three rounds while TTFT stayed short of the start margin:
    the race stops such an arm instead of racing it to the end of the budget."""
    def table(ttft: list[float]) -> RoundTable:
        t = RoundTable()
        for rnd, tr in enumerate(ttft):
            t.add(DEFAULT_ARM, rnd, "w", {"itl_p50": 0.002, "ttft_p50": 0.02}, start="d1")
            t.add("PIECEWISE", rnd, "w", {"itl_p50": 0.006 * (1 + 0.01 * rnd), "ttft_p50": 0.02 * tr}, start="p1")
        return t

    rule = SequentialRule()
    slow = arm_verdicts(table([1.20, 1.25, 1.15, 1.22]), "PIECEWISE", ["itl_p50", "ttft_p50"], rule)
    assert slow.pooled["itl_p50"].verdict == "worse" and slow.pooled["ttft_p50"].verdict == "undecided"
    assert not slow.decided(["itl_p50", "ttft_p50"]) and slow.settled(["itl_p50", "ttft_p50"], rule.delta)
    # TTFT could still be better: keep racing
    open_ = arm_verdicts(table([0.8, 1.3, 0.9, 1.2]), "PIECEWISE", ["itl_p50", "ttft_p50"], rule)
    assert open_.pooled["itl_p50"].verdict == "worse" and not open_.settled(["itl_p50", "ttft_p50"], rule.delta)
    # nothing worse: an open metric keeps the arm in the race
    even = RoundTable()
    for rnd in range(4):
        even.add(DEFAULT_ARM, rnd, "w", {"itl_p50": 0.002}, start="d1")
        even.add("FULL", rnd, "w", {"itl_p50": 0.002 * (1.1 if rnd % 2 else 0.95)}, start="f1")
    assert not arm_verdicts(even, "FULL", ["itl_p50"], rule).settled(["itl_p50"], rule.delta)


def test_an_open_verdict_says_how_many_rounds_would_settle_it() -> None:
    from graphmode.profiling.sequential import needed_to_decide

    ys = [0.1, -0.12, 0.05, -0.03, 0.14, -0.11, 0.02, -0.04]  # sd ~0.09 of the paired ln ratio, mean ~0
    d = decide(ys, SequentialRule())
    assert d.verdict == "undecided" and not d.over_starts
    plan = needed_to_decide(d)
    assert plan is not None and "rounds in all would read equivalent" in plan
    n = int(plan.split("about ")[1].split(" ")[0])
    sd = float(np.std(ys, ddof=1))
    gap = math.log1p(0.03) - abs(float(np.mean(ys)))
    exact = next(k for k in range(2, 100_000) if stats.t.ppf(0.975, k - 1) * sd / math.sqrt(k) <= gap)
    assert exact <= n <= exact * 1.1 + 1, (n, exact)  # the search steps by 10%
    # far past 1+δ and noisy: "worse" is the boundary in reach
    wide = decide([0.3, 0.05, 0.6, -0.1], SequentialRule(start_margin=0.5))
    assert wide.verdict == "undecided" and "would read worse" in (needed_to_decide(wide) or "")
    # decided verdicts and too few rounds need no plan
    assert needed_to_decide(decide([0.0, 0.001, -0.001, 0.0005], SequentialRule())) is None
    assert needed_to_decide(decide([0.01], SequentialRule())) is None


def test_over_start_blocks_the_plan_counts_blocks() -> None:
    from graphmode.profiling.sequential import needed_to_decide

    blocks = [("a1", "d1"), ("a2", "d2"), ("a3", "d3")] * 3
    ys = [0.02, -0.05, 0.06, 0.03, -0.04, 0.05, 0.01, -0.06, 0.07]
    d = decide(ys, SequentialRule(min_starts=2), blocks)
    assert d.over_starts and d.blocks == 3 and d.verdict == "undecided", d
    plan = needed_to_decide(d, SequentialRule(min_starts=2))
    assert plan is not None and "start blocks in all" in plan and "per start block" in plan
