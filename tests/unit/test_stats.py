"""Percentile math (linear interpolation, by hand) and the aggregation of request results."""

from __future__ import annotations

import pytest

from graphmode.core.records import LatencyStats
from graphmode.profiling.stats import RequestResult, aggregate, percentile


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1, 2, 3, 4], 50, 2.5),
        ([1, 2, 3, 4], 90, 3.7),  # rank 0.9·3 = 2.7 → 3 + 0.7·(4 - 3)
        ([1, 2, 3, 4], 99, 3.97),  # rank 2.97
        ([1, 2, 3, 4], 0, 1.0),
        ([1, 2, 3, 4], 100, 4.0),
        ([1, 2, 3, 4], 25, 1.75),  # rank 0.75
        ([4, 1, 3, 2], 50, 2.5),  # order does not matter
        ([10, 20], 10, 11.0),
        ([0.5, 1.5, 2.5], 50, 1.5),
        ([7.0], 0, 7.0),
        ([7.0], 50, 7.0),
        ([7.0], 99, 7.0),
        ([3, 3, 3, 3], 90, 3.0),
    ],
)
def test_percentile_linear_interpolation(values: list[float], q: float, expected: float) -> None:
    got = percentile(values, q)
    assert isinstance(got, float)
    assert got == pytest.approx(expected, abs=1e-12)


def test_percentile_of_nothing_is_none() -> None:
    assert percentile([], 50) is None
    assert percentile((), 0) is None


@pytest.mark.parametrize("q", [-0.1, 100.01, 150, -50])
def test_percentile_out_of_range(q: float) -> None:
    with pytest.raises(ValueError, match="outside"):
        percentile([1, 2, 3], q)
    with pytest.raises(ValueError):
        percentile([], q)  # checked before the data


def _ok(ttft: float, itls: list[float], out: int, sent_at: float = 0.0, inp: int = 10, mx: int | None = None
        ) -> RequestResult:
    e2e = ttft + sum(itls)
    return RequestResult(sent_at=sent_at, input_tokens=inp, max_tokens=mx if mx is not None else out, ok=True,
                         ttft=ttft, itls=list(itls), e2e=e2e, output_tokens=out)


@pytest.fixture
def results() -> list[RequestResult]:
    return [
        _ok(0.1, [0.01, 0.02], 3, inp=10),  # tpot (0.13 - 0.1)/2 = 0.015, mean itl 0.015
        _ok(0.2, [0.03], 2, inp=20),  # tpot 0.03
        _ok(0.3, [], 1, inp=30),  # one token: no tpot, no itl
        RequestResult(sent_at=1.0, input_tokens=40, max_tokens=5, ok=False, ttft=0.05, itls=[9.0],
                      error="HTTP 500: boom"),
        RequestResult(sent_at=1.5, input_tokens=50, max_tokens=5, ok=False, error="ReadTimeout: later"),
    ]


def test_aggregate_counts_and_latencies(results: list[RequestResult]) -> None:
    s = aggregate(results, 2.0)
    assert isinstance(s, LatencyStats)
    assert (s.n_sent, s.n_ok, s.n_err) == (5, 3, 2)
    assert s.duration_s == 2.0
    # failed requests contribute nothing to the latency pools, even when they had a ttft
    assert s.ttft_p50 == pytest.approx(0.2)
    assert s.ttft_mean == pytest.approx(0.2)
    assert s.ttft_p90 == pytest.approx(0.28)  # rank 1.8 of [0.1, 0.2, 0.3]
    assert s.ttft_p99 == pytest.approx(0.298)
    # ITL pools every gap of every ok request: [0.01, 0.02, 0.03]
    assert s.itl_p50 == pytest.approx(0.02)
    assert s.itl_mean == pytest.approx(0.02)
    assert s.itl_p90 == pytest.approx(0.028)
    assert s.itl_p99 == pytest.approx(0.0298)
    assert s.tpot_p50 == pytest.approx((0.015 + 0.03) / 2)
    assert s.e2e_p50 == pytest.approx(0.23)
    assert s.e2e_p99 == pytest.approx(0.23 + 0.98 * (0.3 - 0.23))  # rank 1.98 of [0.13, 0.23, 0.3]


def test_aggregate_throughput(results: list[RequestResult]) -> None:
    s = aggregate(results, 2.0)
    assert s.output_tok_s == pytest.approx((3 + 2 + 1) / 2.0)
    assert s.request_throughput == pytest.approx(3 / 2.0)
    assert s.sent_rate == pytest.approx(5 / 2.0)
    assert s.sent_input_tokens_mean == pytest.approx(30.0)  # over every request sent
    assert s.sent_output_tokens_mean == pytest.approx((3 + 2 + 1 + 5 + 5) / 5)
    assert s.goodput is None  # no SLO given
    assert s.first_error == "HTTP 500: boom"


@pytest.mark.parametrize(
    ("slo_ttft", "slo_itl", "meeting"),
    [
        (0.25, None, 2),  # 0.1 and 0.2
        (0.3, None, 3),  # inclusive
        (None, 0.015, 2),  # mean ITL 0.015 (inclusive) and the one-token request without gaps
        (None, 0.001, 1),  # only the one-token request
        (0.25, 0.015, 1),
        (0.01, None, 0),
    ],
)
def test_goodput(results: list[RequestResult], slo_ttft: float | None, slo_itl: float | None,
                 meeting: int) -> None:
    s = aggregate(results, 2.0, slo_ttft_s=slo_ttft, slo_itl_s=slo_itl)
    assert s.goodput == pytest.approx(meeting / 2.0)


def test_meets() -> None:
    r = _ok(0.1, [0.02, 0.04], 3)
    assert r.meets(None, None)
    assert r.meets(0.1, 0.03) and not r.meets(0.09, None) and not r.meets(None, 0.029)
    no_ttft = RequestResult(sent_at=0, input_tokens=1, max_tokens=1, ok=True, ttft=None)
    assert not no_ttft.meets(1.0, None)
    failed = RequestResult(sent_at=0, input_tokens=1, max_tokens=1, ok=False, ttft=0.01)
    assert not failed.meets(None, None)


def test_aggregate_zero_duration_has_no_rates(results: list[RequestResult]) -> None:
    s = aggregate(results, 0.0, slo_ttft_s=1.0)
    assert s.duration_s is None
    assert s.output_tok_s is None and s.request_throughput is None and s.sent_rate is None
    assert s.goodput is None
    assert s.n_ok == 3 and s.ttft_p50 == pytest.approx(0.2)


def test_aggregate_nothing() -> None:
    s = aggregate([], 10.0, slo_ttft_s=1.0)
    assert (s.n_sent, s.n_ok, s.n_err) == (0, 0, 0)
    assert s.ttft_p50 is None and s.ttft_mean is None and s.itl_p50 is None and s.itl_mean is None
    assert s.tpot_p50 is None and s.e2e_p50 is None
    assert s.output_tok_s == 0.0 and s.request_throughput == 0.0 and s.sent_rate == 0.0
    assert s.goodput == 0.0
    assert s.sent_input_tokens_mean is None and s.first_error is None


def test_aggregate_all_failed() -> None:
    long = "x" * 2000
    rs = [RequestResult(sent_at=0, input_tokens=5, max_tokens=5, error=None),  # no message
          RequestResult(sent_at=0, input_tokens=5, max_tokens=5, error=long)]
    s = aggregate(rs, 1.0)
    assert (s.n_sent, s.n_ok, s.n_err) == (2, 0, 2)
    assert s.ttft_p50 is None and s.output_tok_s == 0.0
    assert s.first_error == "x" * 500  # the first error that has a message, truncated


def test_aggregate_tpot_needs_two_tokens() -> None:
    s = aggregate([_ok(0.1, [], 1), _ok(0.2, [], 0)], 1.0)
    assert s.tpot_p50 is None
    s = aggregate([_ok(0.1, [0.05, 0.05, 0.05, 0.05], 5)], 1.0)
    assert s.tpot_p50 == pytest.approx(0.05)


def test_deadline_diagnosis_says_requests_outlived_the_cell() -> None:
    from graphmode.profiling.stats import deadline_diagnosis

    # The H200 long case of 2026-12-02: streams at ~115 ms a token, cut at the deadline a quarter through.
    cut = [RequestResult(sent_at=float(i), input_tokens=64, max_tokens=384, ttft=0.5, itls=[0.115] * 95,
                         output_tokens=96, error="cancelled at the run's deadline") for i in range(10)]
    text = deadline_diagnosis(cut)
    assert text is not None
    assert text.startswith("10 requests were still streaming") and "25% of their tokens" in text
    assert "median ITL 115.0 ms" in text and "needs ~45 s" in text and "max_concurrency" in text
    # Failures of another kind (refused, never started) are not explained as a too-long cell.
    refused = [RequestResult(sent_at=0.0, input_tokens=8, max_tokens=8, error="ClientConnectorError: refused")]
    never = [RequestResult(sent_at=0.0, input_tokens=8, max_tokens=8,
                           error="not sent or cancelled before the run's deadline")]
    assert deadline_diagnosis(refused) is None and deadline_diagnosis(never) is None


def test_fixed_cell_requests_open_loop_by_plan_closed_loop_by_departure() -> None:
    from graphmode.profiling.stats import fixed_cell_requests

    def req(plan: float, left: float | None) -> RequestResult:
        departed = None if left is None else 100 + left
        return RequestResult(sent_at=plan, input_tokens=8, max_tokens=8, started_at=departed)

    early_plan_late_departure = req(0.1, 3.0)
    in_warm_up = req(0.2, 0.4)
    after_window = req(0.3, 6.0)
    never_left = req(4.0, None)
    rs = [early_plan_late_departure, in_warm_up, after_window, never_left]
    closed = fixed_cell_requests(rs, 100.0, 1.0, 5.0, closed_loop=True)
    assert closed == [(pytest.approx(3.0), early_plan_late_departure)]
    opened = fixed_cell_requests(rs, 100.0, 1.0, 5.0, closed_loop=False)
    assert opened == [(4.0, never_left)]  # open loop: a request planned after warm-up counts even if it never left
