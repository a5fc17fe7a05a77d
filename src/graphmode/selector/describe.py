"""A workload description (rate, burstiness, token lengths, concurrency cap) → the features it should show.

The result uses the definitions of :mod:`graphmode.profiling.features`, so it lands where a live
server's ``/metrics`` would:

* ``arrival_rate = completion_rate = rate`` (requests that arrive finish, in steady state);
  ``mean_input_tokens``, ``mean_output_tokens`` as given; ``prefill_decode_ratio = input / output``;
  token rates are ``rate × length``.
* The running batch follows Little's law, ``L = rate × E2E``, where the end-to-end latency ``E2E``
  comes from the model itself (its predicted ``e2e_p50``, geometric mean over modes, as the training
  features are an average over modes). ``L`` depends on ``E2E`` and the model's ``E2E`` on ``L``, so
  the two are iterated to a fixed point.
* ``batch_var = L / burstiness``: the count of a renewal arrival process over a window has variance
  ``≈ c_a² × mean``, and gamma inter-arrival gaps of shape ``burstiness`` have ``c_a² = 1/burstiness``
  (Poisson, 1, gives the M/G/∞ answer ``var = L``). ``batch_cv = sqrt(var) / L``.
* A concurrency cap (``vllm bench --max-concurrency``, the grid's ``max_concurrency``) holds requests
  at the client: ``L ≤ cap`` and, once it binds, the server sees ``rate = cap / E2E``.
* ``queue_mean = 0``: the profiled regime does not queue inside vLLM.

Training checks these formulas against every profiled workload whose spec is known and stores a
per-feature calibration factor (median observed/described, clipped to [0.25, 4]) with the errors before
and after, in the model card.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from graphmode.core.records import ObservedFeatures

CALIBRATED = ("batch_mean", "batch_cv", "concurrency_mean", "batch_var")
CHECKED = (
    "arrival_rate",
    "prefill_decode_ratio",
    "mean_input_tokens",
    "mean_output_tokens",
    "batch_mean",
    "batch_cv",
    "concurrency_mean",
)
E2E_PER_OUTPUT_TOKEN_GUESS_S = 0.02  # used only when the model has no latency to iterate with


class WorkloadDescription(BaseModel):
    """Traffic as a person would describe it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate: float = Field(gt=0, le=1e5, description="arrival rate, requests per second")
    burstiness: float = Field(1.0, gt=0, le=100, description="gamma shape of inter-arrival gaps; 1 = Poisson")
    input_tokens: float = Field(gt=0, le=1e7, description="mean prompt length, tokens")
    output_tokens: float = Field(gt=0, le=1e7, description="mean generated length, tokens")
    concurrency: int | None = Field(None, gt=0, description="client-side cap on requests in flight")

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> WorkloadDescription | None:
        """From a grid workload spec (a dataset row's ``workload_spec``); None if it lacks the fields."""
        try:
            inp: Any = spec.get("input")
            out: Any = spec.get("output")
            return cls(
                rate=float(spec["rate"]),
                burstiness=float(spec.get("burstiness") or 1.0),
                input_tokens=float(inp["mean"]),
                output_tokens=float(out["mean"]),
                concurrency=spec.get("max_concurrency") or None,
            )
        except (KeyError, TypeError, ValueError):
            return None


E2EPredictor = Callable[[dict[str, float | None]], float | None]


def describe_features(
    desc: WorkloadDescription,
    e2e_of: E2EPredictor | None = None,
    calibration: Mapping[str, float] | None = None,
    *,
    iterations: int = 30,
) -> ObservedFeatures:
    """Expected observed features of ``desc`` (see the module docstring)."""
    e2e = E2E_PER_OUTPUT_TOKEN_GUESS_S * desc.output_tokens
    feats = _features(desc, e2e)
    if e2e_of is not None:
        for _ in range(iterations):
            new = e2e_of(feats)
            if new is None or not math.isfinite(new) or new <= 0:
                break
            nxt = math.sqrt(e2e * new)  # damped: the fixed point can oscillate near saturation
            converged = abs(nxt - e2e) <= 1e-4 * e2e
            e2e = nxt
            feats = _features(desc, e2e)
            if converged:
                break
    if calibration:
        for name, factor in calibration.items():
            v = feats.get(name)
            if v is not None and name in CALIBRATED:
                feats[name] = v * factor
    return ObservedFeatures(**feats)


def _features(desc: WorkloadDescription, e2e: float) -> dict[str, float | None]:
    rate = desc.rate
    load = rate * e2e
    if desc.concurrency is not None and load > desc.concurrency:
        load = float(desc.concurrency)
        rate = load / e2e
    load = max(load, 1e-6)
    var = load / desc.burstiness
    return {
        "arrival_rate": rate,
        "completion_rate": rate,
        "prompt_tokens_rate": rate * desc.input_tokens,
        "generation_tokens_rate": rate * desc.output_tokens,
        "prefill_decode_ratio": desc.input_tokens / desc.output_tokens,
        "mean_input_tokens": desc.input_tokens,
        "mean_output_tokens": desc.output_tokens,
        "batch_mean": load,
        "batch_var": var,
        "batch_cv": math.sqrt(var) / load,
        "concurrency_mean": load,
        "queue_mean": 0.0,
    }
