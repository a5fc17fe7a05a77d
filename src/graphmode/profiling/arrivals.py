"""Open-loop arrival schedules and exact-length token-id prompts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphmode.profiling.grid import Workload


def arrival_offsets(rate: float, burstiness: float, duration_s: float, rng: np.random.Generator,
                    max_requests: int | None = None) -> np.ndarray:
    """Send times (s from start) with gamma inter-arrival gaps of mean ``1/rate``.

    Shape ``burstiness`` and scale ``1/(rate·burstiness)`` keep the mean rate fixed while the
    coefficient of variation of the gaps is ``1/sqrt(burstiness)``: the same definition as
    ``vllm bench serve --burstiness``.
    """
    if rate <= 0 or burstiness <= 0 or duration_s <= 0:
        raise ValueError("rate, burstiness and duration must be positive")
    expected = rate * duration_s
    # Draw enough gaps that running out before duration_s is astronomically unlikely.
    n = int(expected + 10 * np.sqrt(expected / burstiness) + 20)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    times = np.cumsum(gaps)
    times = times[times < duration_s]
    if max_requests is not None:
        times = times[:max_requests]
    return times


@dataclass(frozen=True)
class PlannedRequest:
    at_s: float
    prompt: list[int]
    max_tokens: int


def plan_requests(workload: Workload, vocab_size: int, repeat: int = 0) -> list[PlannedRequest]:
    """Every request of one workload run, fixed by the workload's seed and the repeat index."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be at least 1, got {vocab_size}")
    rng = np.random.default_rng([workload.seed, repeat, 0x6A7])
    times = arrival_offsets(workload.rate, workload.burstiness, workload.duration_s, rng, workload.max_requests)
    in_lo, in_hi = workload.input.bounds()
    out_lo, out_hi = workload.output.bounds()
    # Low ids are often special tokens; random ids defeat prefix caching, so prefill cost is real.
    low = min(10, vocab_size - 1)
    plans = []
    for t in times:
        n_in = int(rng.integers(in_lo, in_hi + 1))
        n_out = int(rng.integers(out_lo, out_hi + 1))
        prompt = rng.integers(low, vocab_size, size=n_in).tolist()
        plans.append(PlannedRequest(at_s=float(t), prompt=prompt, max_tokens=n_out))
    return plans
