"""The evidence region of race verdicts: where a shape's races measured, and how far a request lies outside it.

Every per-workload verdict carries the features its default engine observed (arrival rate, prompt and output
tokens, requests in flight); the pool of a shape's races (one configuration, max_model_len and API-server
count) spans them. A request inside the span widened by :data:`REGION_REACH` is answered by those verdicts;
outside every pool's span it gets vLLM's default, with the dimensions outside (:class:`OutsideRegion`) and the
``graphmode profile --race`` command (:func:`race_command`, grid included) that would measure it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from graphmode.selector.verdicts import RaceVerdict

# features that place a request near a raced workload (log scale; what a description and /metrics both give)
REGION_FEATURES: tuple[str, ...] = ("arrival_rate", "mean_input_tokens", "mean_output_tokens", "concurrency_mean")

# A raced region reaches this factor past its outermost workloads (their centres are means of rounds that
# spread around them); further out a verdict is an extrapolation.
REGION_REACH = 1.5
_UNITS = {"arrival_rate": "req/s", "mean_input_tokens": "prompt tokens", "mean_output_tokens": "output tokens",
          "concurrency_mean": "requests in flight"}


class OutsideRegion(BaseModel):
    """One dimension of a request outside a raced region: where the request is, where the races were."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    feature: str
    value: float
    raced_lo: float
    raced_hi: float
    factor: float = Field(description="how far outside: value / raced_hi above it, raced_lo / value below it")

    def describe(self) -> str:
        side = "above" if self.value > self.raced_hi else "below"
        return (f"{self.feature} {self.value:.4g} {_UNITS.get(self.feature, '')} is {self.factor:.1f}× {side} the "
                f"raced {self.raced_lo:.4g}–{self.raced_hi:.4g}")


def region_span(verdicts: Iterable[RaceVerdict]) -> dict[str, tuple[float, float]]:
    """Per region feature, the lowest and highest value measured among one pool's *verdicts*: the pooled
    verdicts' stored spans (every round's observed features), else (a card trained before spans were stored)
    the raced workloads' centres."""
    verdicts = list(verdicts)
    span: dict[str, tuple[float, float]] = {}
    for v in verdicts:
        if v.workload is None:
            for f, (lo, hi) in v.span.items():
                if f in REGION_FEATURES and lo > 0:
                    old = span.get(f, (lo, hi))
                    span[f] = (min(old[0], lo), max(old[1], hi))
    if span:
        return span
    for v in verdicts:
        if v.workload is None:
            continue
        for f, x in v.features.items():
            if f in REGION_FEATURES and x > 0:
                lo, hi = span.get(f, (x, x))
                span[f] = (min(lo, x), max(hi, x))
    return span


# Load below the lightest raced workload is not outside: every race has a concurrency-1 stream (c1-short), and
# a lighter load has at most one request in flight too, the same steps at longer idle gaps.
_LOAD_FEATURES = frozenset({"arrival_rate", "concurrency_mean"})


def outside_region(span: Mapping[str, tuple[float, float]], features: Mapping[str, Any],
                   reach: float = REGION_REACH) -> list[OutsideRegion]:
    """The request's dimensions outside *span* widened by *reach* (empty: the region holds the request);
    token lengths count on both sides, load only above (:data:`_LOAD_FEATURES`)."""
    out = []
    for f, (lo, hi) in span.items():
        x = features.get(f)
        if not isinstance(x, int | float) or not math.isfinite(x) or x <= 0:
            continue
        # requests in flight move by whole requests: near one, one more is within reach whatever the factor
        top = max(hi * reach, hi + 1.0) if f == "concurrency_mean" else hi * reach
        if x > top:
            out.append(OutsideRegion(feature=f, value=float(x), raced_lo=lo, raced_hi=hi, factor=x / hi))
        elif x < lo / reach and f not in _LOAD_FEATURES:
            out.append(OutsideRegion(feature=f, value=float(x), raced_lo=lo, raced_hi=hi, factor=lo / x))
    return out


def race_command(features: Mapping[str, Any], outside: Sequence[OutsideRegion] = ()) -> str:
    """The ``graphmode profile --race`` command, grid included, that would measure the request's region: one
    workload at the request's rate and token counts (and its concurrency when it is capped low)."""
    def num(f: str, default: float) -> float:
        x = features.get(f)
        return float(x) if isinstance(x, int | float) and math.isfinite(x) and x > 0 else default

    rate, prompt, out = num("arrival_rate", 4.0), num("mean_input_tokens", 256.0), num("mean_output_tokens", 128.0)
    cap = "" if not any(o.feature == "concurrency_mean" for o in outside) else \
        f", max_concurrency: {max(1, round(num('concurrency_mean', 1.0)))}"
    grid = (f"{{name: region, workloads: [{{name: requested, rate: {rate:.4g}{cap}, input: {{mean: {prompt:.0f}, "
            f"spread: 0.2}}, output: {{mean: {out:.0f}, spread: 0.2}}}}]}}")
    length = 4096
    while length < 1.3 * (prompt + out):
        length *= 2
    return (f"echo '{grid}' > region.yaml && graphmode profile --race --control --grid region.yaml -- "
            f"--model DIR --max-model-len {length}")


def log_distance(a: Mapping[str, float], b: Mapping[str, Any]) -> float | None:
    """Root mean square of the log ratios of the region features *a* and *b* share (None: none shared)."""
    common = [f for f in REGION_FEATURES if f in a and isinstance(b.get(f), int | float) and (b.get(f) or 0) > 0]
    if not common:
        return None
    return math.sqrt(sum(math.log(a[f] / float(b[f])) ** 2 for f in common) / len(common))


def region_distances(regions: Sequence[RaceVerdict], features: Mapping[str, Any]) -> dict[str | None, float]:
    """The request's :func:`log_distance` to each raced workload of *regions* that shares a feature with it."""
    return {v.workload: d for v in regions if (d := log_distance(v.features, features)) is not None}


def pooled_disagrees(pooled: Mapping[str, RaceVerdict], regions: Sequence[RaceVerdict],
                     dists: Mapping[str | None, float], chosen: dict[str, RaceVerdict], notes: list[str]) -> str | None:
    """A pooled "better" (or a pooled verdict whose rounds all together read better) answers only where the
    per-workload verdict nearest the request (*dists*: :func:`region_distances`) agrees (its rounds read the same
    side, and it is not worse or equivalent): the effect depends on the load (FULL's TTFT win at concurrency 1
    is gone on prefill-heavy traffic at 32 req/s). Where it disagrees, that workload's verdict stands for the
    mode (*chosen* is updated) and its name is returned."""
    if not dists:
        return None
    near = min(dists, key=lambda w: dists[w])
    hit = None
    for mode, p in pooled.items():
        reads_better = p.verdict == "undecided" and p.hi_all is not None and p.hi_all < 1.0  # all rounds
        if p.verdict != "better" and not reads_better:
            continue
        local = next((v for v in regions if v.workload == near and v.mode == mode), None)
        ratio = None if local is None else (local.ratio_all if local.ratio_all is not None else local.ratio)
        if local is None or local.verdict == "better" or (
                local.verdict == "undecided" and ratio is not None and ratio < 1.0):
            continue
        chosen[mode] = local
        hit = near
        notes.append(f"race: pooled over every workload {p.describe()}, but on {near}, the raced workload nearest "
                     f"the request, {local.describe()}: the pooled verdict does not answer here")
    return hit


def pick_servers(mine: Sequence[RaceVerdict], api_server_count: int | None, notes: list[str]) -> int | None:
    """The API-server count whose races answer: the deployment's, else the nearest raced one (one server
    counts as 1); a note when there was a choice."""
    counts = sorted({v.api_servers for v in mine if v.workload is None}, key=lambda n: n or 1)
    if len(counts) < 2:
        return counts[0] if counts else None
    want = api_server_count if api_server_count and api_server_count > 1 else None
    # nearest in ratio; a tie goes to several servers (the frontend is then several processes either way)
    pick = want if want in counts else min(counts, key=lambda n: (abs(math.log((n or 1) / (want or 1))), -(n or 1)))

    def name(n: int | None) -> str:
        return "one API server" if n is None else f"{n} API servers"

    why = "the deployment's --api-server-count" if pick == want else "the nearest to the deployment's"
    others = ", ".join(name(n) for n in counts if n != pick)
    notes.append(f"race: this shape was raced with {' and with '.join(name(n) for n in counts)}; the races with "
                 f"{name(pick)} answer ({why}), not those with {others}")
    return pick


def pick_pool(mine: Sequence[RaceVerdict], features: Mapping[str, Any], max_model_len: int | None,
               notes: list[str]) -> int | None:
    """The max_model_len whose pooled verdicts answer (:func:`graphmode.selector.verdicts.race_decision`'s
    docstring); a note when there was a choice."""
    pooled = [v for v in mine if v.workload is None]
    lengths = sorted({v.max_model_len for v in pooled}, key=lambda x: x or 0)
    if len(lengths) < 2:
        return lengths[0] if lengths else None
    centres = {v.max_model_len: v.features for v in pooled if v.features}
    dists = {n: d for n in lengths if n in centres and (d := log_distance(centres[n], features)) is not None}
    if len(dists) == len(lengths):
        pick, why = min(lengths, key=lambda n: dists[n]), "its raced workloads sit nearest the request's"
    elif max_model_len in lengths:
        pick, why = max_model_len, "the deployment's --max-model-len"
    else:
        pick = max(lengths, key=lambda n: max(v.rounds for v in pooled if v.max_model_len == n))
        why = "the most rounds (the request's workload and max_model_len match none)"

    def name(n: int | None) -> str:
        return "the model's own max_model_len" if n is None else f"max_model_len={n}"

    others = ", ".join(name(n) for n in lengths if n != pick)
    notes.append(f"race: this shape was raced at {len(lengths)} max_model_len; the races at {name(pick)} answer "
                 f"({why}), not those at {others}")
    return pick
