"""The steps a size list serves: a step-size histogram as a weight per token count, and a list's statistics.

vLLM pads a step of ``n`` tokens up to the smallest captured size ``>= n`` and replays that graph; a step
above the largest captured size runs without a graph. :func:`step_distribution` spreads the histogram of
``vllm:iteration_tokens_total`` over integer token counts; :func:`list_stats` says how a list serves it
(share graphed, padding, its predicted cost); :func:`decode_only` moves the steps that must hold prefill
tokens out of reach, as FULL_DECODE_ONLY graphs only decode steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, Field

from graphmode.core.records import StepSizes
from graphmode.selector.capture_costs import CaptureCosts

__all__ = ["PAD_TOKEN_COST", "Distribution", "ListStats", "decode_only", "list_stats", "step_distribution"]

@dataclass(frozen=True)
class Distribution:
    """Weights of steps by token count ``1..len(weight) - 1`` (index = tokens), plus steps above that."""

    weight: np.ndarray
    above: float
    observed: tuple[int, ...]  # batch sizes seen in running samples

    @property
    def total(self) -> float:
        return float(self.weight.sum()) + self.above


def step_distribution(steps: StepSizes, limit: int) -> Distribution:
    """Spread each histogram bucket's steps over the integer token counts it covers, up to ``limit``.

    Inside a bucket ``(lo, hi]`` the steps follow the running-request samples that fall in it when there
    are any (a decode step has one token per running request), else they are uniform over ``lo+1..hi``.
    Steps of buckets (or parts of buckets) above ``limit`` go to ``above``: no graph can take them.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    weight = np.zeros(limit + 1)
    above = steps.steps[-1] if len(steps.steps) == len(steps.le) + 1 else 0.0
    lower = 0
    for le, mass in zip(steps.le, steps.steps, strict=False):
        hi = math.floor(le)
        if mass > 0 and hi > lower:
            inside = {n: c for n, c in steps.running.items() if lower < n <= hi and n > 0}
            if inside:
                total = sum(inside.values())
                for n, c in inside.items():
                    share = mass * c / total
                    if n <= limit:
                        weight[n] += share
                    else:
                        above += share
            else:
                per = mass / (hi - lower)
                top = min(hi, limit)
                if top > lower:
                    weight[lower + 1:top + 1] += per
                above += per * max(hi - max(limit, lower), 0)
        lower = max(lower, hi)
    observed = tuple(sorted(n for n in steps.running if 0 < n <= limit))
    return Distribution(weight=weight, above=float(above), observed=observed)


# A graphed step's time grows with the tokens its graph computes, padded ones included:
# t(n) ≈ t(0)·(1 + PAD_TOKEN_COST·n). The H200 8B closed loop (vLLM 0.33, 2026-12-04) read 1 → 63 padded
# as ITL 1.082x (0.0013 per token) and 48 → 256 as 1.467x (0.0025); the lower, so that padding is not
# overpriced where the shape's own cost is unmeasured.
PAD_TOKEN_COST = 0.0013


class ListStats(BaseModel):
    """How one size list serves a step-size distribution, and what it costs."""

    sizes: list[int]
    graphed_share: float | None = Field(description="share of steps that replay a graph")
    padded_tokens_per_step: float | None = Field(description="expected padding per graphed step, tokens")
    padding_share: float | None = Field(description="padded tokens / real tokens of graphed steps")
    padding_cost: float | None = Field(None, description="predicted step time padding adds, relative, over "
                                       "graphed steps (step time linear in tokens, PAD_TOKEN_COST per token)")
    capture_s: float | None = None
    graph_gib: float | None = None


def list_stats(sizes: Sequence[int], dist: Distribution, costs: CaptureCosts | None, mode: str) -> ListStats:
    capture_s = graph_gib = None
    if costs is not None and costs.n_starts:
        capture_s, graph_gib = (round(v, 3) for v in costs.predict(sizes, mode))
        if not costs.knows_gib(sizes):
            graph_gib = None
    total = dist.total
    if total <= 0 or not sizes:
        return ListStats(sizes=list(sizes), graphed_share=None, padded_tokens_per_step=None, padding_share=None,
                         capture_s=capture_s, graph_gib=graph_gib)
    tokens = np.arange(len(dist.weight), dtype=float)
    srt = sorted(sizes)
    graphed = pad = real = slow = 0.0
    lower = 0
    for s in srt:
        top = min(s, len(dist.weight) - 1)
        if top > lower:
            w, t = dist.weight[lower + 1:top + 1], tokens[lower + 1:top + 1]
            graphed += float(w.sum())
            pad += float((w * (s - t)).sum())
            real += float((w * t).sum())
            slow += float((w * PAD_TOKEN_COST * (s - t) / (1 + PAD_TOKEN_COST * t)).sum())
        lower = max(lower, top)
    return ListStats(
        sizes=list(srt),
        graphed_share=round(graphed / total, 4),
        padded_tokens_per_step=round(pad / graphed, 3) if graphed > 0 else None,
        padding_share=round(pad / real, 4) if real > 0 else None,
        padding_cost=round(slow / graphed, 5) if graphed > 0 else None,
        capture_s=capture_s, graph_gib=graph_gib,
    )


def decode_only(steps: StepSizes) -> StepSizes:
    """``steps`` with the buckets that must hold prefill tokens (lower edge at or above the largest running
    sample, the rule of :func:`graphmode.profiling.features.compute_step_sizes`) moved above every size."""
    batch_max = max(steps.running)
    lowers = [0.0, *steps.le]
    kept = [0.0 if lower >= batch_max else n for lower, n in zip(lowers, steps.steps, strict=False)]
    moved = sum(steps.steps[: len(steps.le)]) - sum(kept[: len(steps.le)])
    above = steps.steps[len(steps.le)] if len(steps.steps) > len(steps.le) else 0.0
    return steps.model_copy(update={"steps": [*kept[: len(steps.le)], above + moved]})
