"""Percentiles and the aggregation of per-request measurements into :class:`LatencyStats`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from graphmode.profiling.records import LatencyStats


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

    def meets(self, slo_ttft_s: float | None, slo_itl_s: float | None) -> bool:
        if not self.ok:
            return False
        if slo_ttft_s is not None and (self.ttft is None or self.ttft > slo_ttft_s):
            return False
        return not (slo_itl_s is not None and self.itls and float(np.mean(self.itls)) > slo_itl_s)


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
        ttft_p50=percentile(ttfts, 50),
        ttft_p90=percentile(ttfts, 90),
        ttft_p99=percentile(ttfts, 99),
        ttft_mean=float(np.mean(ttfts)) if ttfts else None,
        itl_p50=percentile(itls, 50),
        itl_p90=percentile(itls, 90),
        itl_p99=percentile(itls, 99),
        itl_mean=float(np.mean(itls)) if itls else None,
        tpot_p50=percentile(tpots, 50),
        chunk_tokens_mean=out_tokens / chunks if chunks else None,
        e2e_p50=percentile(e2es, 50),
        e2e_p90=percentile(e2es, 90),
        e2e_p99=percentile(e2es, 99),
        output_tok_s=out_tokens / dur if dur else None,
        request_throughput=len(ok) / dur if dur else None,
        goodput=(sum(r.meets(slo_ttft_s, slo_itl_s) for r in results) / dur) if (have_slo and dur) else None,
        sent_rate=len(results) / dur if dur else None,
        sent_input_tokens_mean=float(np.mean([r.input_tokens for r in results])) if results else None,
        sent_output_tokens_mean=float(np.mean([r.max_tokens for r in results])) if results else None,
        first_error=errors[0][:500] if errors else None,
    )
