"""Sequential looks keep their error rate: with ``spend`` a race that looks after every round and stops at the
first crossing says "better" of a mode at the δ boundary no more often than the rule's one-sided rate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from graphmode.profiling.sequential import SequentialRule, look_confidence, sequential_decision
from graphmode.selector.verdicts import SPENDING_RULE


def _false_better_rate(rule: SequentialRule, races: int = 300, rounds: int = 30) -> float:
    rng = np.random.default_rng(7)
    truth = math.log1p(-rule.delta)  # exactly at the margin: "better" (past 1-δ) is false
    wrong = 0
    for _ in range(races):
        ys = list(truth + rng.normal(0.0, 0.1, rounds))
        wrong += sequential_decision(ys, rule).verdict == "better"
    return wrong / races


def test_spent_looks_hold_the_rate_that_per_look_intervals_do_not() -> None:
    nominal = _false_better_rate(SequentialRule())
    spent = _false_better_rate(SequentialRule(spend=True))
    assert nominal > 0.06  # a look every round: several times the 2.5% each look promises
    assert spent <= 0.025 + 0.02  # the rule's one-sided 2.5%, within the simulation's error (300 races)


def test_the_spending_sums_to_the_rule_and_starts_above_it() -> None:
    alpha = sum(1 - look_confidence(0.95, j) for j in range(1, 100_000))
    assert alpha == pytest.approx(0.05, rel=1e-3) and alpha < 0.05
    assert look_confidence(0.95, 1) == pytest.approx(1 - 0.05 * 6 / math.pi**2)
    assert look_confidence(0.95, 5) > look_confidence(0.95, 1) > 0.95


def test_the_selectors_verdicts_spend() -> None:
    """Training takes the spending rule for the verdicts the selector acts on (build_training_set)."""
    import inspect

    from graphmode.selector import aggregate

    assert SPENDING_RULE.spend and SPENDING_RULE.confidence == SequentialRule().confidence
    assert "race_verdicts(usable, SPENDING_RULE" in inspect.getsource(aggregate)
