"""Objectives, constraints and the ranking of modes (ties, feasibility, weights)."""

from __future__ import annotations

import math

import pytest

from graphmode.core.errors import ObjectiveError
from graphmode.selector.objective import (
    Constraint,
    Objective,
    make_objective,
    rank,
    regret,
    relative_gain,
    resolve_metric,
)

D = "FULL_AND_PIECEWISE"


def test_metric_aliases_and_unknown() -> None:
    assert resolve_metric("throughput") == "output_tok_s"
    assert resolve_metric("ITL") == "itl_p50"
    assert resolve_metric("ttft-p99") == "ttft_p99"
    with pytest.raises(ObjectiveError, match="unknown metric"):
        resolve_metric("latency_p42")


@pytest.mark.parametrize(
    ("text", "metric", "op", "value"),
    [
        ("ttft_p99<=0.2", "ttft_p99", "<=", 0.2),
        ("ttft_p99 <= 200ms", "ttft_p99", "<=", 0.2),
        ("graph_gib<512MiB", "graph_gib", "<", 0.5),
        ("startup_s =< 1min", "startup_s", "<=", 60.0),
        ("throughput>=1000", "output_tok_s", ">=", 1000.0),
    ],
)
def test_constraint_parse(text: str, metric: str, op: str, value: float) -> None:
    c = Constraint.parse(text)
    assert (c.metric, c.op) == (metric, op)
    assert math.isclose(c.value, value)


@pytest.mark.parametrize("text", ["ttft_p99", "ttft_p99 << 3", "ttft_p99<=2GiB", "nope<=1", "ttft_p99<=abc"])
def test_constraint_parse_rejects(text: str) -> None:
    with pytest.raises(ObjectiveError):
        Constraint.parse(text)


def test_constraint_holds_and_violation() -> None:
    c = Constraint(metric="ttft_p99", op="<=", value=0.2)
    assert c.holds(0.2) and not c.holds(0.3)
    assert c.violation(0.1) == 0.0
    assert math.isclose(c.violation(0.3), 0.5)


def test_objective_direction_and_describe() -> None:
    o = make_objective("throughput", ["ttft_p99<=200ms"], memory_weight=0.1, max_startup_s=60)
    assert o.direction == "max"
    assert o.required_metrics() == {"output_tok_s", "ttft_p99", "graph_gib", "startup_s"}
    assert "max output_tok_s" in o.describe() and "startup_s <= 60" in o.describe()
    with pytest.raises(ObjectiveError):
        make_objective("itl_p50", memory_weight=-1)


def _t(**modes: float) -> dict[str, dict[str, float | None]]:
    return {m: {"itl_p50": v} for m, v in modes.items()}


def test_rank_minimises_and_reports_margin() -> None:
    r = rank(_t(NONE=6.0, FULL=1.5, FULL_AND_PIECEWISE=2.0), {}, Objective(), D)
    assert r.best == "FULL" and r.order[0] == "FULL" and r.ties == ["FULL"]
    assert r.runner_up == D and r.margin_sigma == math.inf


def test_rank_maximises_throughput() -> None:
    table = {"A": {"output_tok_s": 100.0}, "B": {"output_tok_s": 120.0}}
    assert rank(table, {}, make_objective("throughput"), "A").best == "B"


def test_tie_within_noise_goes_to_default() -> None:
    table = _t(FULL=1.00, FULL_AND_PIECEWISE=1.02, NONE=2.0)
    noise = {"FULL": 0.01, "FULL_AND_PIECEWISE": 0.01, "NONE": 0.01}
    r = rank(table, noise, Objective(), D)
    assert r.top == "FULL" and r.best == D
    assert set(r.ties) == {"FULL", D}
    assert r.margin_sigma is not None and r.margin_sigma < 0  # the alternative is better, inside the noise
    r2 = rank(table, noise, Objective(prefer_default_on_tie=False), D)
    assert r2.best == "FULL"


def test_outside_noise_is_a_win() -> None:
    noise = {"FULL": 0.001, D: 0.001}
    r = rank(_t(FULL=1.00, FULL_AND_PIECEWISE=1.10), noise, Objective(), D)
    assert r.best == "FULL" and r.ties == ["FULL"]
    assert r.margin_sigma is not None and r.margin_sigma > 2


def test_constraints_filter_and_fallback() -> None:
    table = {
        "FULL": {"itl_p50": 1.0, "ttft_p99": 0.5},
        D: {"itl_p50": 1.2, "ttft_p99": 0.1},
        "NONE": {"itl_p50": 3.0, "ttft_p99": None},
    }
    o = make_objective("itl_p50", ["ttft_p99<=0.2"])
    r = rank(table, {}, o, D)
    assert r.best == D and r.constraints_met
    assert r.scores["FULL"].status == "violates" and r.scores["NONE"].status == "unverified"
    assert r.order == [D, "NONE", "FULL"]
    # nothing feasible: least violation wins, and it says so
    r2 = rank(table, {}, make_objective("itl_p50", ["ttft_p99<=0.01"]), D)
    assert not r2.constraints_met and r2.best == "NONE"  # unverified ranks above violating
    r3 = rank(
        {k: v for k, v in table.items() if k != "NONE"}, {}, make_objective("itl_p50", ["ttft_p99<=0.01"]), D
    )
    assert r3.best == D and not r3.constraints_met and any("violates them least" in n for n in r3.notes)


def test_memory_weight_can_change_the_answer() -> None:
    table = {"FULL": {"itl_p50": 1.0, "graph_gib": 2.0}, "NONE": {"itl_p50": 1.3, "graph_gib": 0.0}}
    assert rank(table, {}, Objective(), D).best == "FULL"
    assert rank(table, {}, make_objective("itl_p50", memory_weight=0.5), D).best == "NONE"


def test_unknown_objective_metric_everywhere_is_an_error() -> None:
    with pytest.raises(ObjectiveError, match="no mode has a value"):
        rank({"FULL": {"itl_p50": None}}, {}, Objective(), D)


def test_mode_without_value_ranks_last() -> None:
    r = rank({"FULL": {"itl_p50": 1.0}, "NONE": {"itl_p50": None}}, {}, Objective(), D)
    assert r.order == ["FULL", "NONE"] and r.scores["NONE"].status == "unknown"


def test_regret_and_gain() -> None:
    assert regret(1.1, 1.0, "itl_p50") == pytest.approx(10.0)
    assert regret(1.0, 1.0, "itl_p50") == 0.0
    assert regret(90.0, 100.0, "output_tok_s") == pytest.approx(10.0)
    assert relative_gain(0.9, 1.0, "itl_p50") == pytest.approx(10.0)
    assert relative_gain(None, 1.0, "itl_p50") is None
