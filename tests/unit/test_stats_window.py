"""Windowed stats and the confidence intervals that let an adaptive cell stop early."""

from __future__ import annotations

import json

import numpy as np
import pytest

from graphmode.profiling.loadgen import count_tokens
from graphmode.profiling.stats import (
    RequestResult,
    WindowMonitor,
    aggregate_window,
    batch_median_ci_rel,
    median_ci_rel,
    t975,
)


def _stream(start: float, gaps: list[float], ttft: float, n_out: int, ok: bool = True) -> RequestResult:
    """A request sent at *start* whose tokens arrive ttft later, then every gap."""
    r = RequestResult(sent_at=start, input_tokens=10, max_tokens=n_out, started_at=start)
    t = start + ttft
    r.ttft, r.first_at = ttft, t
    r.chunk_at.append(t)
    r.chunk_n.append(1)
    for g in gaps:
        t += g
        r.itls.append(g)
        r.itl_at.append(t)
        r.chunk_at.append(t)
        r.chunk_n.append(1)
    r.chunks = len(r.chunk_at)
    r.output_tokens = len(r.chunk_at)
    if ok:
        r.ok, r.done_at, r.e2e = True, t, t - start
    else:
        r.cut, r.error = True, "cut"
    return r


def test_t975_matches_the_table() -> None:
    assert t975(1) == pytest.approx(12.706, abs=1e-3)  # the printed tables' three decimals
    assert t975(4) == pytest.approx(2.776, abs=1e-3)
    assert t975(200) == pytest.approx(1.96, abs=1e-3)
    with pytest.raises(ValueError):
        t975(0)


def test_median_ci_needs_samples_and_narrows_with_more() -> None:
    assert median_ci_rel([1.0] * 5) is None
    assert median_ci_rel([0.0] * 10) is None  # zero median: relative width undefined
    assert median_ci_rel([2.0] * 10) == 0.0
    rng = np.random.default_rng(0)
    few = median_ci_rel(list(rng.uniform(0.8, 1.2, 20)))
    many = median_ci_rel(list(rng.uniform(0.8, 1.2, 2000)))
    assert few is not None and many is not None
    assert 0.03 < few < 0.25 and many < 0.02 and many < few


def test_median_ci_covers_the_true_median_about_95_percent() -> None:
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(400):
        xs = np.sort(rng.exponential(1.0, 40))
        med = float(np.median(xs))
        half = median_ci_rel(list(xs))
        assert half is not None
        hits += med * (1 - 2 * half) <= np.log(2) <= med * (1 + 2 * half)  # loose: the interval is not symmetric
    assert hits / 400 > 0.9


def test_batch_ci_sees_drift_that_gap_counts_hide() -> None:
    # 4 s of gaps, 200 per half second. Steady: tight. Batch size swinging every half second: wide,
    # however many gaps there are.
    t = np.repeat(np.arange(8) * 0.5 + 0.25, 200)
    steady = np.full(t.size, 0.010)
    swing = np.where((np.arange(t.size) // 200) % 2 == 0, 0.008, 0.012)
    assert batch_median_ci_rel(t, steady, 0.0, 4.0) == 0.0
    wide = batch_median_ci_rel(t, swing, 0.0, 4.0)
    assert wide is not None and wide > 0.1
    assert batch_median_ci_rel(t[:400], steady[:400], 0.0, 1.0) is None  # two batches: unknown
    with pytest.raises(ValueError):
        batch_median_ci_rel([0.1], [], 0.0, 1.0)


def test_aggregate_window_counts_only_the_window() -> None:
    t_lo, t_hi = 10.0, 12.0
    before = _stream(8.0, [0.01] * 300, 0.05, 301)  # sent in warm-up, streams through the window
    inside = _stream(10.5, [0.02] * 20, 0.1, 21)  # sent and done inside
    cut = _stream(11.5, [0.02] * 40, 0.2, 41, ok=False)  # sent inside, still streaming at the end
    late_first = _stream(11.95, [], 0.5, 1, ok=False)  # first token after the window: no TTFT
    s = aggregate_window([before, inside, cut, late_first], t_lo, t_hi)
    assert s.duration_s == pytest.approx(2.0)
    assert s.n_sent == 3 and s.n_ok == 1 and s.n_err == 0 and s.n_cut == 2
    assert s.ttft_p50 == pytest.approx(0.15)  # inside (0.1) and cut (0.2); late_first has no first token in time
    assert s.e2e_p50 == pytest.approx(0.1 + 20 * 0.02)
    # gaps inside [10, 12]: before's 0.01 gaps from 10.0 to 11.05, inside's 20, cut's from 11.72 on
    in_before = sum(1 for at in before.itl_at if t_lo <= at <= t_hi)
    in_cut = sum(1 for at in cut.itl_at if t_lo <= at <= t_hi)
    assert in_before > 90 and in_cut > 5
    assert s.itl_p50 == pytest.approx(0.01)
    assert s.tpot_p50 == pytest.approx(0.02)  # per-request means: 0.01, 0.02, 0.02
    tokens = sum(1 for r in (before, inside, cut) for at in r.chunk_at if t_lo <= at <= t_hi)
    assert s.output_tok_s == pytest.approx(tokens / 2.0)
    assert s.request_throughput == pytest.approx(2 / 2.0)  # before (done at 11.05) and inside finished in it
    with pytest.raises(ValueError):
        aggregate_window([], 1.0, 1.0)


def test_window_monitor_matches_the_batch_ci_incrementally() -> None:
    rng = np.random.default_rng(3)
    results = [_stream(0.1 * i, list(rng.uniform(0.009, 0.011, 200)), 0.05, 201) for i in range(40)]
    mon = WindowMonitor(t_lo=1.0)
    # feed it in two steps, as the controller would while the load runs
    mon.update(results, 2.6)  # three closed half-second batches: enough for an interval
    first = mon.itl_ci()
    mon.update(results, 5.0)
    final = mon.itl_ci()
    assert first is not None and final is not None and final < 0.03
    pairs = [(at, g) for r in results for at, g in zip(r.itl_at, r.itls, strict=True) if 1.0 <= at < 5.0]
    direct = batch_median_ci_rel([a for a, _ in pairs], [g for _, g in pairs], 1.0, 5.0)
    assert direct is not None and final == pytest.approx(direct, rel=0.05)
    assert mon.ttft_ci() is not None and mon.ci("ttft_p50") == mon.ttft_ci()
    assert mon.tpot_ci() is not None and len(mon.ttfts) == 30  # requests sent from 1.0 s on
    with pytest.raises(KeyError):
        mon.ci("e2e_p50")


@pytest.mark.parametrize("payload, tokens, usage", [
    (b'{"choices":[{"index":0,"text":"","prompt_token_ids":[1,2,3],"token_ids":[230]}]}', 1, None),
    (b'{"choices":[{"index":0,"text":"","prompt_token_ids":null,"token_ids":[4,5,6]}]}', 3, None),
    (b'{"choices":[{"index":0,"text":"","token_ids":[]}]}', 0, None),
    (b'{"choices":[{"index":0,"text":"x","token_ids":[1]},{"index":1,"token_ids":[2,3]}]}', 3, None),
    # spaces (json.dumps' default): the fast path does not match, JSON decides
    (json.dumps({"choices": [{"text": "", "token_ids": [1, 2]}]}).encode(), 2, None),
    (b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":17,"total_tokens":20}}', 0, 17),
    (b'{"choices":[{"text":"hi"}]}', 1, None),  # a server that ignores return_token_ids
])
def test_count_tokens(payload: bytes, tokens: int, usage: int | None) -> None:
    assert count_tokens(payload) == (tokens, usage)


def test_count_tokens_rejects_garbage() -> None:
    with pytest.raises(json.JSONDecodeError):
        count_tokens(b"not json")


def test_a_client_that_read_the_stream_in_bursts_reports_no_itl_quantile_under_the_floor() -> None:
    """H200 lease 12: a load process at a full core read SSE events several at once, and a cell's ITL p50
    read 0.017 ms against a mean of 31 ms. No vLLM step is under 0.1 ms: such a quantile is not reported
    (nor its interval); the mean and TPOT (sums of gaps) stand, and so do quantiles above the floor."""
    from graphmode.core.records import ITL_FLOOR_S

    # 24 requests, a 30 ms step read as one 120 ms gap and three ~0 gaps
    burst = [0.12, 1e-5, 1e-5, 1e-5] * 10
    reqs = [_stream(0.0, burst, 0.05, len(burst) + 1) for _ in range(24)]
    st = aggregate_window(reqs, 0.0, 10.0)
    assert st.itl_p50 is None and st.itl_p50_ci is None
    assert st.itl_p90 == pytest.approx(0.12)  # the burst's real gap is a step's, not the client's
    assert st.itl_mean == pytest.approx(0.03, rel=0.01) and st.tpot_p50 == pytest.approx(0.03, rel=0.01)
    # a few short gaps (a busy 2-core test machine reads some so) leave the quantiles as they were
    steady = [0.03] * 16 + [ITL_FLOOR_S / 2] * 4
    st2 = aggregate_window([_stream(0.0, steady, 0.05, 21) for _ in range(24)], 0.0, 10.0)
    assert st2.itl_p50 == pytest.approx(0.03)
    mon = WindowMonitor(0.0)
    mon.update(reqs, 10.0)
    assert mon.itl_ci() is None  # an adaptive cell never stops on such an interval
