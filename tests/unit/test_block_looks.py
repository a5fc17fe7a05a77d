"""The interval over start blocks counts its looks in complete blocks, not in rounds.

Counted per round, a race's thirtieth look at three start blocks ran at t ≈ 166 (2 df at 99.996%), and three
H100 starts that read FULL's TTFT 0.710×, 0.755× and 0.784× gave [0.006, 94.7]: no number of rounds could
settle it (Qwen2.5-0.5B, vLLM 0.33, 2026-12-06). Blocks whose engines still run are not complete.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from graphmode.profiling.race_rounds import DEFAULT_ARM, RoundTable, arm_verdicts
from graphmode.profiling.sequential import (
    BetweenStarts,
    Block,
    SequentialRule,
    look_confidence,
    needed_to_decide,
    sequential_decision,
)

SPEND = SequentialRule(spend=True)

# FULL / default TTFT p50 per round, the H100 race's three sessions (race-h100-vllm0.33-qwen2.5-0.5b.sqlite)
H100_FULL_TTFT = {
    "s1": [0.44, 0.70, 1.20, 0.63, 1.05, 0.53, 0.58, 0.85],
    "s2": [0.96, 0.64, 0.78, 0.79, 0.65, 0.62, 0.99, 0.61, 0.88, 0.95, 0.60],
    "s3": [0.54, 0.88, 0.56, 0.76, 1.25, 0.70, 0.81, 1.12, 0.71, 0.77, 0.87, 0.72],
}


def _h100() -> tuple[list[float], list[Block]]:
    ys, bs = [], []
    for s, ratios in H100_FULL_TTFT.items():
        ys += [math.log(r) for r in ratios]
        bs += [(f"FULL:{s}", f"DEFAULT:{s}")] * len(ratios)
    return ys, bs


def test_three_consistent_start_blocks_settle_after_thirty_rounds() -> None:
    ys, bs = _h100()
    d = sequential_decision(ys, SPEND, bs)
    assert d.verdict == "better" and d.over_starts and d.blocks == 3 and d.n == 31
    # look 1 of the block family (three blocks, no A/A arm), not look 29 of the rounds
    assert d.level == pytest.approx(look_confidence(0.95, 1))
    assert d.hi is not None and d.hi < 0.97 and d.lo is not None and d.lo > 0.5
    # the per-round count would have been look 29: its t quantile over 2 df is far past any interval that helps
    from scipy import stats

    assert stats.t.ppf((1 + look_confidence(0.95, 29)) / 2, 2) > 100


def test_the_look_is_the_same_however_many_rounds_a_block_holds() -> None:
    rng = np.random.default_rng(3)
    levels = set()
    for per_block in (4, 30):
        ys, bs = [], []
        for k, effect in enumerate((-0.30, -0.28, -0.25)):
            ys += list(effect + rng.normal(0, 0.01, per_block))
            bs += [(f"A{k}", f"D{k}")] * per_block
        d = sequential_decision(ys, SPEND, bs)
        assert d.over_starts and d.verdict == "better"
        levels.add(round(d.level or 0, 12))
    assert len(levels) == 1


def test_running_blocks_are_left_out_until_their_engines_stop() -> None:
    ys, bs = _h100()
    running = {bs[-1]}  # the third session's engines are still up
    live = sequential_decision(ys, SPEND, bs, open_blocks=running)
    done = sequential_decision(ys, SPEND, bs)
    # two complete blocks and no A/A arm: no interval over starts yet, so no "better"
    assert live.verdict == "undecided" and not live.over_starts and live.reads == "better"
    assert done.verdict == "better"
    # every block running: nothing complete
    assert not sequential_decision(ys, SPEND, bs, open_blocks=set(bs)).over_starts


def test_with_an_a_a_arm_two_complete_blocks_are_the_first_look() -> None:
    ys, bs = _h100()
    n12 = len(H100_FULL_TTFT["s1"]) + len(H100_FULL_TTFT["s2"])
    between = BetweenStarts(tau2=0.0002, blocks=3)
    d = sequential_decision(ys, SPEND, bs, between)
    # settled at the end of the second block, look 1 of the block family
    assert d.verdict == "better" and d.n == n12 and d.blocks == 2 and d.over_starts
    assert d.level == pytest.approx(look_confidence(0.95, 1))
    assert "A/A start variance" in d.why
    # its degrees of freedom come mostly from the rounds, and the plan for an open verdict reads them
    assert d.df is not None and d.df > 2
    # the third block is the second look
    three = sequential_decision(ys, SPEND, bs, between, open_blocks=set())
    assert three.since is None  # all rounds read better too


def test_the_plan_reads_the_interval_at_its_own_confidence() -> None:
    """needed_to_decide derives the sd per unit from the interval's width at the confidence it was taken at."""
    rng = np.random.default_rng(5)
    ys, bs = [], []
    for k in range(3):
        ys += list(0.02 + 0.05 * (k - 1) + rng.normal(0, 0.01, 6))
        bs += [(f"A{k}", f"D{k}")] * 6
    d = sequential_decision(ys, SPEND, bs)
    assert d.verdict == "undecided" and d.over_starts
    plan = needed_to_decide(d, SPEND) or ""
    sd = float(plan.split("sd ")[1].split(" ")[0])
    means = [float(np.mean(ys[i:i + 6])) for i in range(0, 18, 6)]
    assert sd == pytest.approx(float(np.std(means, ddof=1)), rel=0.05)


def test_a_live_race_leaves_its_running_engines_blocks_open() -> None:
    table = RoundTable()
    r = 0
    for s, ratios in H100_FULL_TTFT.items():
        for ratio in ratios:
            table.add(DEFAULT_ARM, r, "w", {"ttft_p50": 0.1}, start=f"D:{s}")
            table.add("FULL", r, "w", {"ttft_p50": 0.1 * ratio}, start=f"F:{s}")
            r += 1
    running = arm_verdicts(table, "FULL", ["ttft_p50"], SPEND, running={"F:s3", "D:s3"}).pooled["ttft_p50"]
    stopped = arm_verdicts(table, "FULL", ["ttft_p50"], SPEND).pooled["ttft_p50"]
    assert running.verdict == "undecided" and stopped.verdict == "better" and stopped.over_starts


def test_a_staggered_restart_completes_the_blocks_of_the_engine_it_stopped() -> None:
    """(A1,D1), (A1,D2), (A2,D2), (A2,D3) with A2 and D3 up: only (A2,D3) can still gain rounds."""
    table = RoundTable()
    rng = np.random.default_rng(11)
    r = 0
    for a, d in (("A1", "D1"), ("A1", "D2"), ("A2", "D2"), ("A2", "D3")):
        for _ in range(5):
            table.add(DEFAULT_ARM, r, "w", {"ttft_p50": 0.1}, start=d)
            table.add("FULL", r, "w", {"ttft_p50": 0.1 * math.exp(-0.3 + rng.normal(0, 0.02))}, start=a)
            r += 1
    live = arm_verdicts(table, "FULL", ["ttft_p50"], SPEND, running={"A2", "D3"}).pooled["ttft_p50"]
    assert live.over_starts and live.verdict == "better"  # three complete blocks, not two
    assert live.n == 15 and live.blocks == 3  # settled when (A2,D2) completed, at round 15


def test_the_a_a_model_at_three_blocks_keeps_the_false_better_rate() -> None:
    """Races whose mode equals the default (ratio 1), a start effect of 10% per start, 10% round noise, three
    sessions of ten rounds, an A/A arm beside it: "better" over start blocks stays under the one-sided 2.5%."""
    from graphmode.profiling.sequential import between_from_aa

    rng = np.random.default_rng(1)
    rule = SequentialRule(spend=True, min_starts=2)
    races, better = 300, 0
    for _ in range(races):
        a, c, d = (rng.normal(0, 0.1, 3) for _ in range(3))
        ys, bs, yc, bc = [], [], [], []
        for k in range(3):
            for _ in range(10):
                ys.append(a[k] - d[k] + rng.normal(0, 0.1))
                bs.append((f"A{k}", f"D{k}"))
                yc.append(c[k] - d[k] + rng.normal(0, 0.1))
                bc.append((f"C{k}", f"D{k}"))
        better += sequential_decision(ys, rule, bs, between_from_aa(yc, bc)).verdict == "better"
    assert better / races < 0.025
