"""RoundTable: which measured values a round pairs (profiling/race_rounds.py)."""

from __future__ import annotations

import math

from graphmode.core.records import ITL_FLOOR_S
from graphmode.profiling.race_rounds import DEFAULT_ARM, RoundTable


def test_an_itl_below_any_vllm_step_pairs_with_nothing() -> None:
    """Rows written before the load generator withheld burst-read quantiles (H200 lease 12: ITL p50 0.017 ms
    against a mean of 31 ms) keep them; a round reads such an ITL as not measured, its TPOT as measured."""
    t = RoundTable()
    t.add(DEFAULT_ARM, 0, "w", {"itl_p50": 0.050, "tpot_p50": 0.053})
    t.add("long", 0, "w", {"itl_p50": 1.7e-5, "tpot_p50": 0.031})
    t.add(DEFAULT_ARM, 1, "w", {"itl_p50": 0.040, "tpot_p50": 0.041})
    t.add("long", 1, "w", {"itl_p50": 0.030, "tpot_p50": 0.034})
    assert [r for r, _, _ in t.pairs("long", "itl_p50")] == [1]
    assert [r for r, _, _ in t.pairs("long", "tpot_p50")] == [0, 1]
    assert math.isclose(t.pairs("long", "tpot_p50")[0][2], math.log(0.031 / 0.053))
    # the floor is for ITL only: a TTFT that short is a TTFT (a cached prompt), and values at the floor pass
    t.add("long", 2, "w", {"itl_p50": ITL_FLOOR_S, "ttft_p50": 5e-5})
    t.add(DEFAULT_ARM, 2, "w", {"itl_p50": 0.02, "ttft_p50": 0.01})
    assert [r for r, _, _ in t.pairs("long", "itl_p50")] == [1, 2]
    assert [r for r, _, _ in t.pairs("long", "ttft_p50")] == [2]
