"""Arrival schedules have the advertised statistics; request plans are bounded and reproducible.

Every draw uses a fixed seed, so the statistical checks are deterministic; their tolerances are still
several standard errors wide so that a change of numpy's generator would not make them fail by chance.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphmode.profiling.arrivals import PlannedRequest, arrival_offsets, plan_requests
from graphmode.profiling.grid import LengthDist, Workload


def _workload(**kw: object) -> Workload:
    base: dict[str, object] = {"name": "w", "rate": 20, "duration_s": 10, "input": LengthDist(mean=100, spread=0.3),
                               "output": LengthDist(mean=40, spread=0.5)}
    base.update(kw)
    return Workload.model_validate(base)


def _gaps(times: np.ndarray) -> np.ndarray:
    return np.diff(np.concatenate([[0.0], times]))


@pytest.mark.parametrize("burstiness", [1.0, 0.25, 4.0])
def test_mean_rate(burstiness: float) -> None:
    rate, duration = 50.0, 200.0
    counts = [len(arrival_offsets(rate, burstiness, duration, np.random.default_rng(seed))) for seed in range(5)]
    for n in counts:
        # one draw: sd of the count is sqrt(rate·T)/sqrt(burstiness) = 200 for b=0.25, i.e. 2 %
        assert n == pytest.approx(rate * duration, rel=0.08)
    assert np.mean(counts) == pytest.approx(rate * duration, rel=0.03)


@pytest.mark.parametrize("burstiness", [1.0, 0.25, 4.0])
def test_interarrival_cv(burstiness: float) -> None:
    times = arrival_offsets(50.0, burstiness, 200.0, np.random.default_rng(1234))
    gaps = _gaps(times)
    cv = gaps.std() / gaps.mean()
    assert cv == pytest.approx(1 / np.sqrt(burstiness), rel=0.06)
    assert gaps.mean() == pytest.approx(1 / 50.0, rel=0.08)


def test_bursty_is_burstier_than_smooth() -> None:
    def cv(b: float) -> float:
        g = _gaps(arrival_offsets(20.0, b, 100.0, np.random.default_rng(7)))
        return float(g.std() / g.mean())

    assert cv(0.25) > cv(1.0) > cv(4.0)


def test_schedule_is_sorted_and_within_duration() -> None:
    for seed in range(20):
        times = arrival_offsets(30.0, 0.5, 3.0, np.random.default_rng(seed))
        assert np.all(times >= 0) and np.all(times < 3.0)
        assert np.all(np.diff(times) >= 0)


def test_schedule_fills_the_duration() -> None:
    # Enough gaps are drawn that the schedule does not stop short of the end, even when very bursty.
    for b in (0.05, 1.0, 10.0):
        times = arrival_offsets(100.0, b, 60.0, np.random.default_rng(3))
        assert times[-1] > 50.0, b


def test_max_requests_caps_the_prefix() -> None:
    full = arrival_offsets(50.0, 1.0, 10.0, np.random.default_rng(5))
    capped = arrival_offsets(50.0, 1.0, 10.0, np.random.default_rng(5), max_requests=17)
    assert len(capped) == 17
    np.testing.assert_array_equal(capped, full[:17])
    roomy = arrival_offsets(50.0, 1.0, 10.0, np.random.default_rng(5), max_requests=10**6)
    np.testing.assert_array_equal(roomy, full)


@pytest.mark.parametrize(("rate", "burstiness", "duration"), [(0, 1, 1), (-1, 1, 1), (1, 0, 1), (1, -0.5, 1),
                                                              (1, 1, 0), (1, 1, -3)])
def test_invalid_arguments(rate: float, burstiness: float, duration: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        arrival_offsets(rate, burstiness, duration, np.random.default_rng(0))


# ---------------------------------------------------------------- plan_requests


def test_plan_is_deterministic_per_seed_and_repeat() -> None:
    w = _workload()
    a, b = plan_requests(w, 32000, repeat=0), plan_requests(w, 32000, repeat=0)
    assert a == b and len(a) > 0
    assert all(isinstance(p, PlannedRequest) for p in a)
    other_repeat = plan_requests(w, 32000, repeat=1)
    assert [p.at_s for p in other_repeat] != [p.at_s for p in a]
    assert other_repeat[0].prompt != a[0].prompt
    other_seed = plan_requests(w.model_copy(update={"seed": 1}), 32000, repeat=0)
    assert [p.at_s for p in other_seed] != [p.at_s for p in a]
    # a repeat's schedule is independent of how many repeats there are
    assert plan_requests(w.model_copy(update={"repeats": 5}), 32000, repeat=1) == other_repeat


def test_plan_lengths_and_token_ids_in_bounds() -> None:
    w = _workload(rate=50, duration_s=20)
    vocab = 1000
    plans = plan_requests(w, vocab)
    assert len(plans) == pytest.approx(1000, rel=0.1)
    in_lo, in_hi = w.input.bounds()
    out_lo, out_hi = w.output.bounds()
    assert (in_lo, in_hi, out_lo, out_hi) == (70, 130, 20, 60)
    lens = [len(p.prompt) for p in plans]
    outs = [p.max_tokens for p in plans]
    assert min(lens) >= in_lo and max(lens) <= in_hi
    assert min(outs) >= out_lo and max(outs) <= out_hi
    # the draw really spreads over the whole range (inclusive of both ends)
    assert min(lens) == in_lo and max(lens) == in_hi
    assert min(outs) == out_lo and max(outs) == out_hi
    ids = np.concatenate([p.prompt for p in plans])
    assert ids.min() >= 10 and ids.max() < vocab
    assert ids.max() >= vocab - 5  # uniform over [10, vocab)
    assert all(isinstance(t, int) for t in plans[0].prompt)
    assert [p.at_s for p in plans] == sorted(p.at_s for p in plans)
    assert all(0 <= p.at_s < w.duration_s for p in plans)


def test_plan_exact_lengths_without_spread() -> None:
    w = _workload(input=LengthDist(mean=33), output=LengthDist(mean=7))
    plans = plan_requests(w, 500)
    assert {len(p.prompt) for p in plans} == {33}
    assert {p.max_tokens for p in plans} == {7}


def test_plan_tiny_vocab() -> None:
    plans = plan_requests(_workload(duration_s=1), 5)
    assert {t for p in plans for t in p.prompt} == {4}  # low id is capped at vocab - 1
    assert {t for p in plans for t in plan_requests(_workload(duration_s=1), 1)[0].prompt} == {0}


def test_plan_respects_max_requests() -> None:
    plans = plan_requests(_workload(rate=100, duration_s=10, max_requests=12), 1000)
    assert len(plans) == 12


def test_plan_invalid_vocab() -> None:
    with pytest.raises(ValueError, match="vocab"):
        plan_requests(_workload(), 0)
