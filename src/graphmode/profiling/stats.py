"""Percentiles and the aggregation of per-request measurements into :class:`LatencyStats`.

Two views of a cell: :func:`aggregate` (every request sent after the warm-up, each followed to its end)
and :func:`aggregate_window` (what happened inside a time window, requests still running at its end
included), with the confidence intervals that let an adaptive cell stop early.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.stats

from graphmode.core.records import ITL_FLOOR_S, LatencyStats


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default, as vLLM's bench uses); None for no data."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside [0, 100]")
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


@dataclass
class RequestResult:
    sent_at: float
    input_tokens: int
    max_tokens: int
    ok: bool = False
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    e2e: float | None = None
    output_tokens: int = 0
    chunks: int = 0
    error: str | None = None
    # Absolute perf_counter times, for windowed stats: when each ITL gap ended, each chunk's arrival
    # and size, the first token and the end.
    itl_at: list[float] = field(default_factory=list)
    chunk_at: list[float] = field(default_factory=list)
    chunk_n: list[int] = field(default_factory=list)
    started_at: float | None = None
    first_at: float | None = None
    done_at: float | None = None
    cut: bool = False  # cancelled because the cell stopped, not an error

    def meets(self, slo_ttft_s: float | None, slo_itl_s: float | None) -> bool:
        if not self.ok:
            return False
        if slo_ttft_s is not None and (self.ttft is None or self.ttft > slo_ttft_s):
            return False
        return not (slo_itl_s is not None and self.itls and float(np.mean(self.itls)) > slo_itl_s)


def deadline_diagnosis(results: Sequence[RequestResult]) -> str | None:
    """Why no request finished, when the cause is that each needs longer than the cell: requests were still
    streaming at the deadline. An open-loop rate above what the engine decodes grows the batch until every
    stream crawls (H200, 2026-12-02: 256 req/s of 384 tokens held ~1020 sequences at ~8.6k tokens/s, so a
    request needed ~45 s against a ~40 s cell), and the bare "cancelled" said nothing of that."""
    cut = [r for r in results if not r.ok and r.output_tokens > 0 and r.error is not None
           and r.error.startswith("cancelled")]
    if not cut:
        return None
    gaps = [g for r in cut for g in r.itls]
    got = float(np.median([r.output_tokens / r.max_tokens for r in cut if r.max_tokens > 0] or [0.0]))
    text = f"{len(cut)} requests were still streaming at the cell's deadline, with a median {got:.0%} of their tokens"
    if gaps:
        itl = float(np.median(gaps))
        ttft = float(np.median([r.ttft for r in cut if r.ttft is not None] or [0.0]))
        need = ttft + float(np.median([r.max_tokens for r in cut])) * itl
        text += f" (median ITL {itl * 1e3:.1f} ms: a request needs ~{need:.0f} s)"
    return (text + "; the load asks more than the engine decodes in the cell: shorten the outputs, lower the rate "
            "or cap max_concurrency so that requests finish inside it")


def fixed_cell_requests(results: Sequence[RequestResult], t0: float, warmup_s: float, total_s: float, *,
                        closed_loop: bool) -> list[tuple[float, RequestResult]]:
    """The requests a fixed-length cell measures, each with its send time relative to *t0*.

    Open loop, a request leaves at its planned time or never (then it failed), so the plan's time decides.
    Closed loop (max_concurrency), a request waits for a free slot: with the offered rate above what the cap
    lets through, every request that left after warm-up was planned during it and those planned later never
    left (H200, 2026-12-03: 2000 req/s against a cap of 768 measured no request at all). So there the actual
    send time decides, inside [warmup_s, total_s), and a request still queued at the end was backlog, not a
    failure."""
    if not closed_loop:
        return [(r.sent_at, r) for r in results if r.sent_at >= warmup_s]
    return [(r.started_at - t0, r) for r in results
            if r.started_at is not None and warmup_s <= r.started_at - t0 < total_s]


def _latency_percentiles(ttfts: Sequence[float], itls: Sequence[float], tpots: Sequence[float],
                         e2es: Sequence[float]) -> dict[str, float | None]:
    def itl(q: float) -> float | None:
        v = percentile(itls, q)
        return None if v is not None and v < ITL_FLOOR_S else v

    return {
        "ttft_p50": percentile(ttfts, 50),
        "ttft_p90": percentile(ttfts, 90),
        "ttft_p99": percentile(ttfts, 99),
        "ttft_mean": float(np.mean(ttfts)) if ttfts else None,
        "itl_p50": itl(50),
        "itl_p90": itl(90),
        "itl_p99": itl(99),
        "itl_mean": float(np.mean(itls)) if itls else None,
        "tpot_p50": percentile(tpots, 50),
        "e2e_p50": percentile(e2es, 50),
        "e2e_p90": percentile(e2es, 90),
        "e2e_p99": percentile(e2es, 99),
    }


def aggregate(results: Sequence[RequestResult], duration_s: float, *, slo_ttft_s: float | None = None,
              slo_itl_s: float | None = None) -> LatencyStats:
    """Client-side stats over a run. ITL percentiles pool every inter-token gap of every request."""
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    e2es = [r.e2e for r in ok if r.e2e is not None]
    itls = [g for r in ok for g in r.itls]
    tpots = [
        (r.e2e - r.ttft) / (r.output_tokens - 1)
        for r in ok
        if r.e2e is not None and r.ttft is not None and r.output_tokens > 1
    ]
    out_tokens = sum(r.output_tokens for r in ok)
    chunks = sum(r.chunks for r in ok)
    errors = [r.error for r in results if not r.ok and r.error]
    have_slo = slo_ttft_s is not None or slo_itl_s is not None
    dur = duration_s if duration_s > 0 else None
    return LatencyStats(
        n_sent=len(results),
        n_ok=len(ok),
        n_err=len(results) - len(ok),
        duration_s=dur,
        **_latency_percentiles(ttfts, itls, tpots, e2es),
        chunk_tokens_mean=out_tokens / chunks if chunks else None,
        output_tok_s=out_tokens / dur if dur else None,
        request_throughput=len(ok) / dur if dur else None,
        goodput=(sum(r.meets(slo_ttft_s, slo_itl_s) for r in results) / dur) if (have_slo and dur) else None,
        sent_rate=len(results) / dur if dur else None,
        sent_input_tokens_mean=float(np.mean([r.input_tokens for r in results])) if results else None,
        sent_output_tokens_mean=float(np.mean([r.max_tokens for r in results])) if results else None,
        first_error=errors[0][:500] if errors else None,
    )


Z975 = float(scipy.stats.norm.ppf(0.975))


def t975(dof: int) -> float:
    """Two-sided 95% Student t quantile; the normal one beyond 30 degrees of freedom, as tables do."""
    if dof < 1:
        raise ValueError("need at least one degree of freedom")
    return float(scipy.stats.t.ppf(0.975, dof)) if dof <= 30 else Z975


def median_ci_rel(values: Sequence[float], min_n: int = 6) -> float | None:
    """Relative half-width of the distribution-free 95% CI of the median (binomial order statistics).

    None with fewer than *min_n* values or a zero median: the interval is not known, so never "tight".
    """
    n = len(values)
    if n < min_n:
        return None
    xs = np.sort(np.asarray(values, dtype=float))
    med = float(np.median(xs))
    if med <= 0:
        return None
    k = Z975 * np.sqrt(n) / 2
    lo = max(0, int(np.floor(n / 2 - k)) - 1)
    hi = min(n - 1, int(np.ceil(n / 2 + k)))
    return float((xs[hi] - xs[lo]) / 2 / med)


def batch_median_ci_rel(times: Sequence[float], values: Sequence[float], t_lo: float, t_hi: float,
                        batch_s: float = 0.5, min_per_batch: int = 5, min_batches: int = 3,
                        floor: float = 0.0) -> float | None:
    """Relative 95% CI half-width of a pooled median by batch means over time sub-windows.

    Inter-token gaps are not independent (every sequence in a batch shares one step time), so the
    order-statistic interval over gaps would be far too narrow. Medians of consecutive ``batch_s``
    sub-windows are close to independent; their spread gives an honest interval.
    """
    if len(times) != len(values):
        raise ValueError("times and values differ in length")
    if t_hi <= t_lo or not len(values):
        return None
    t = np.asarray(times, dtype=float)
    v = np.asarray(values, dtype=float)
    edges = np.arange(t_lo, t_hi + 1e-9, batch_s)
    meds = []
    for a, b in itertools.pairwise(edges):
        sel = v[(t >= a) & (t < b)]
        if len(sel) >= min_per_batch:
            meds.append(float(np.median(sel)))
    if len(meds) < min_batches:
        return None
    center = float(np.median(v[(t >= t_lo) & (t <= t_hi)]))
    if center <= floor:
        return None
    k = len(meds)
    return float(t975(k - 1) * np.std(meds, ddof=1) / np.sqrt(k) / center)


def aggregate_window(results: Sequence[RequestResult], t_lo: float, t_hi: float, *,
                     slo_ttft_s: float | None = None, slo_itl_s: float | None = None) -> LatencyStats:
    """Stats over the window [t_lo, t_hi] (absolute perf_counter times).

    TTFT and end-to-end latency come from requests sent inside the window (e2e only for those that
    finished in it); ITL pools every gap that ended inside it, from any request; TPOT is, per request,
    the mean of its in-window gaps (robust to chunk coalescing); throughput counts tokens that arrived
    inside it.
    """
    dur = t_hi - t_lo
    if dur <= 0:
        raise ValueError("empty window")
    sent = [r for r in results if r.started_at is not None and t_lo <= r.started_at < t_hi]
    ttfts = [r.ttft for r in sent if r.ttft is not None and r.first_at is not None and r.first_at <= t_hi]
    done = [r for r in sent if r.ok and r.done_at is not None and r.done_at <= t_hi]
    e2es = [r.e2e for r in done if r.e2e is not None]
    itl_t: list[float] = []
    itls: list[float] = []
    tpots: list[float] = []
    tokens = chunks = 0
    for r in results:
        mine = [g for g, at in zip(r.itls, r.itl_at, strict=False) if t_lo <= at <= t_hi]
        itls.extend(mine)
        itl_t.extend(at for at in r.itl_at if t_lo <= at <= t_hi)
        if len(mine) >= 2:
            tpots.append(float(np.mean(mine)))
        for at, n in zip(r.chunk_at, r.chunk_n, strict=False):
            if t_lo <= at <= t_hi:
                tokens += n
                chunks += 1
    completed = sum(1 for r in results if r.ok and r.done_at is not None and t_lo <= r.done_at <= t_hi)
    errors = [r.error for r in sent if not r.ok and not r.cut and r.error]
    have_slo = slo_ttft_s is not None or slo_itl_s is not None
    return LatencyStats(
        n_sent=len(sent),
        n_ok=len(done),
        n_err=len(errors),
        n_cut=sum(1 for r in results if r.cut),
        duration_s=dur,
        **_latency_percentiles(ttfts, itls, tpots, e2es),
        chunk_tokens_mean=tokens / chunks if chunks else None,
        output_tok_s=tokens / dur,
        request_throughput=completed / dur,
        goodput=(sum(r.meets(slo_ttft_s, slo_itl_s) for r in done) / dur) if have_slo else None,
        sent_rate=len(sent) / dur,
        sent_input_tokens_mean=float(np.mean([r.input_tokens for r in sent])) if sent else None,
        sent_output_tokens_mean=float(np.mean([r.max_tokens for r in sent])) if sent else None,
        first_error=errors[0][:500] if errors else None,
        itl_p50_ci=batch_median_ci_rel(itl_t, itls, t_lo, t_hi, floor=ITL_FLOOR_S),
        ttft_p50_ci=median_ci_rel(ttfts),
        tpot_p50_ci=median_ci_rel(tpots),
    )


class WindowMonitor:
    """Incremental view of a window that starts at *t_lo*, for deciding when an adaptive cell can stop.

    ``update`` only reads what arrived since its last call (a cursor per request), so checking every
    half second stays cheap; a slow check would stall the load's event loop and distort the very gaps
    it measures. The final numbers come from :func:`aggregate_window`, not from here.
    """

    def __init__(self, t_lo: float, batch_s: float = 0.5, min_per_batch: int = 5) -> None:
        self.t_lo = t_lo
        self.batch_s = batch_s
        self.min_per_batch = min_per_batch
        self._cursor: dict[int, int] = {}
        self._batches: dict[int, list[float]] = {}
        self._batch_medians: dict[int, float] = {}
        self._itls: list[float] = []
        self._req_sum: dict[int, float] = {}
        self._req_n: dict[int, int] = {}
        self._ttft_seen: set[int] = set()
        self.ttfts: list[float] = []

    def update(self, results: Sequence[RequestResult], now: float) -> None:
        for i, r in enumerate(results):
            if (r.started_at is not None and r.started_at >= self.t_lo and r.ttft is not None
                    and i not in self._ttft_seen):
                self._ttft_seen.add(i)
                self.ttfts.append(r.ttft)
            start = self._cursor.get(i, 0)
            end = len(r.itl_at)
            if end <= start:
                continue
            self._cursor[i] = end
            for at, gap in zip(r.itl_at[start:end], r.itls[start:end], strict=True):
                if at < self.t_lo:
                    continue
                self._batches.setdefault(int((at - self.t_lo) // self.batch_s), []).append(gap)
                self._itls.append(gap)
                self._req_sum[i] = self._req_sum.get(i, 0.0) + gap
                self._req_n[i] = self._req_n.get(i, 0) + 1
        closed = int((now - self.t_lo) // self.batch_s)  # batches before this index are complete
        for b, gaps in self._batches.items():
            if b < closed and b not in self._batch_medians and len(gaps) >= self.min_per_batch:
                self._batch_medians[b] = float(np.median(gaps))

    def itl_ci(self, min_batches: int = 3) -> float | None:
        meds = list(self._batch_medians.values())
        if len(meds) < min_batches or not self._itls:
            return None
        center = float(np.median(self._itls))
        if center < ITL_FLOOR_S:  # zero, or a burst-read median: never "tight"
            return None
        k = len(meds)
        return float(t975(k - 1) * np.std(meds, ddof=1) / np.sqrt(k) / center)

    def ttft_ci(self) -> float | None:
        return median_ci_rel(self.ttfts)

    def tpot_ci(self) -> float | None:
        return median_ci_rel([self._req_sum[i] / n for i, n in self._req_n.items() if n >= 2])

    def ci(self, metric: str) -> float | None:
        return {"itl_p50": self.itl_ci, "ttft_p50": self.ttft_ci, "tpot_p50": self.tpot_ci}[metric]()
