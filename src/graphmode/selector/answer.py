"""The typed answer of the decision path (:func:`graphmode.selector.decide.decide`): one mode with its evidence.

A :class:`Recommendation` is what the CLI prints, the API returns, ``launch`` applies and ``watch`` acts on;
none of them assembles it. Its notes are typed (:class:`Finding`): a renderer picks them by ``kind`` (the
region a request lies outside, another GPU's verdicts, the release assumed), never by the words of a text.
``notes`` holds their texts, in order, for readers that only print.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from graphmode.selector.capture import CaptureAnswer
from graphmode.selector.noise import RaceNoise
from graphmode.selector.objective import TIE_Z, Objective
from graphmode.selector.region import OutsideRegion
from graphmode.selector.verdicts import RaceAnswer

FeatureSource = Literal["observed", "description", "server"]
ConfidenceLevel = Literal["high", "medium", "low"]
FAR_RATIO = 4.0  # distance to the nearest training workload, in typical training spacings, that is "far"
NEAR_RATIO = 2.0
# What a finding is about. ``caution`` kinds change how far an answer can be trusted: launch and watch show them.
FindingKind = Literal[
    "outside_region",  # the request lies outside every raced region: vLLM's default, and how to measure it
    "other_gpu",  # the verdicts were measured on another GPU: how to profile this one
    "release_assumed",  # no vLLM release given: the newest profiled release's model answered
    "race",  # what the race verdicts decided, and why
    "tie_rule",  # the regressors' best is within noise of the default (only when no verdict decides)
    "paired",  # what paired campaign rounds on one host say
    "constraints",  # which constraints hold, fail or cannot be checked
    "unmeasured",  # modes never measured on this shape, so never chosen
    "not_chosen",  # modes the races found worse on a latency metric, kept out of a regressor's pick
    "noise",  # the shape's measured noise
    "frontend",  # the API server's CPU (advice only)
    "spec_decode",  # speculative decoding's acceptance
    "downgraded",  # vLLM would not run the chosen mode in this deployment: another was recommended
]
CAUTION: frozenset[str] = frozenset({"outside_region", "other_gpu", "release_assumed", "downgraded"})


class Finding(BaseModel):
    """One typed note of an answer."""

    model_config = ConfigDict(extra="forbid")

    kind: FindingKind
    text: str
    outside: list[OutsideRegion] = Field(default_factory=list, description="outside_region: the dimensions "
                                                                           "outside, where the races were")
    command: str | None = Field(None, description="the graphmode command that would measure what is missing")


class ModePrediction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: str
    metrics: dict[str, float | None] = Field(description="predicted values, base units (s, tok/s, GiB, ...)")
    objective_value: float | None
    score: float | None = Field(description="objective value with memory/startup weights applied")
    noise: float | None = Field(description="one standard deviation of the objective value (run-to-run)")
    status: str = Field(description="ok | unverified | violates | unknown (constraints)")
    violations: list[str] = Field(default_factory=list)
    tied: bool = Field(description="within the noise of the chosen mode")


class Confidence(BaseModel):
    model_config = ConfigDict(extra="forbid")

    level: ConfidenceLevel
    margin_sigma: float | None = Field(
        description="chosen vs runner-up score gap, in noise standard deviations"
    )
    runner_up: str | None = Field(description="the best-scoring mode other than the chosen one")
    distance: float = Field(description="standardized distance to the nearest profiled workload")
    distance_ratio: float | None = Field(
        description="that distance over the typical spacing of profiled workloads"
    )
    in_distribution: bool
    out_of_range: list[str] = Field(default_factory=list, description="features outside the profiled range")
    imputed: list[str] = Field(
        default_factory=list, description="features not given, filled with training medians"
    )
    reasons: list[str] = Field(default_factory=list)


class Recommendation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: str
    compilation_config: str = Field(description="JSON for vLLM's --compilation-config")
    vllm_args: list[str]
    objective: Objective
    objective_description: str
    predicted_value: float | None = Field(description="predicted objective metric of the chosen mode")
    default_mode: str
    gain_vs_default_pct: float | None = Field(
        description="predicted improvement over vLLM's default on the objective's metric, %"
    )
    score_gain_vs_default_pct: float | None = Field(
        None,
        description="improvement of the weighted score (metric with the memory and start-up weights) "
        "over the default's, %; equals gain_vs_default_pct when no weight is set",
    )
    gain_significant: bool = Field(
        description="True only when the race verdicts found the chosen mode better than the default"
    )
    ties: list[str]
    constraints_met: bool = Field(description="the chosen mode meets every constraint (status ok)")
    predictions: list[ModePrediction]
    confidence: Confidence
    features: dict[str, float | None]
    features_source: FeatureSource
    model_id: str
    fingerprint_keys: list[str]
    fingerprint_match: str
    synthetic_model: bool = False
    race: RaceAnswer | None = Field(None, description="what the race verdicts decided (None: no race rounds)")
    noise: RaceNoise | None = Field(
        None, description="what a restart alone and the clock alone moved the objective's metric by on this shape")
    warnings: list[str] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list, description="the typed notes")
    notes: list[str] = Field(default_factory=list, description="the findings' texts, and later additions")
    elapsed_ms: float | None = None
    capture: CaptureAnswer | None = Field(None, description="capture sizes for the observed steps (graphconfig)")

    def cautions(self) -> list[Finding]:
        """The findings that limit how far this answer can be trusted (:data:`CAUTION`)."""
        return [f for f in self.findings if f.kind in CAUTION]


def margin_over(scores: dict[str, tuple[float | None, float | None]], order: list[str], best: str,
                minimize: bool) -> tuple[float | None, str | None]:
    """The chosen mode's margin over the best other mode, in noise standard deviations, and that mode's name.

    *scores* maps a mode to (score, one standard deviation); *order* is best first. Computed for the mode
    finally chosen, so the runner-up is never the choice itself."""
    chosen = scores.get(best, (None, None))
    runner = next((m for m in order if m != best and scores.get(m, (None, None))[0] is not None), None)
    if runner is None or chosen[0] is None:
        return None, runner
    other = scores[runner]
    assert other[0] is not None
    sd = math.hypot(chosen[1] or 0.0, other[1] or 0.0)
    gap = (other[0] - chosen[0]) if minimize else (chosen[0] - other[0])
    if sd > 0:
        return gap / sd, runner
    return (math.inf if gap > 0 else -math.inf if gap < 0 else 0.0), runner


def confidence_of(*, margin: float | None, runner: str | None, dist: float, ratio: float | None, oor: list[str],
                  imputed: list[str], best: str, default_mode: str, constraints_met: bool, described: bool,
                  synthetic: bool, shape_unlike: bool, deployment_unlike: bool, fingerprint_differs: bool,
                  other_gpu: str | None, outside_region: bool) -> Confidence:
    """How far an answer can be trusted, and why (the lowest level any reason sets)."""
    low, medium = [], []
    if oor:
        low.append(f"features outside the profiled range: {', '.join(oor)}")
    if ratio is not None and ratio > FAR_RATIO:
        low.append(f"far from every profiled workload ({ratio:.1f}× the usual spacing)")
    elif ratio is not None and ratio > NEAR_RATIO:
        medium.append(f"between profiled workloads ({ratio:.1f}× the usual spacing)")
    if outside_region:
        low.append("the request lies outside every raced region of this shape")
    if other_gpu:
        low.append(f"the verdicts and predictions were measured on {other_gpu}, not this GPU")
    if shape_unlike:
        low.append("model shape unlike the trained ones")
    if deployment_unlike:
        low.append("deployment configuration unlike the trained ones")
    if fingerprint_differs and not other_gpu:
        medium.append("the model's fingerprint is not the target's")
    if not constraints_met:
        low.append("the chosen mode does not meet every constraint")
    if imputed:
        (low if len(imputed) > 2 else medium).append(f"features imputed: {', '.join(imputed)}")
    if margin is not None and 0 <= margin < TIE_Z and best != default_mode:
        medium.append(f"runner-up {runner} is within {TIE_Z:g} noise standard deviations")
    if synthetic:
        low.append("synthetic training data")
    if described:
        medium.append("features derived from a description, not observed")
    level: ConfidenceLevel = "low" if low else "medium" if medium else "high"
    return Confidence(
        level=level,
        margin_sigma=None if margin is None or not math.isfinite(margin) else margin,
        runner_up=runner,
        distance=dist,
        distance_ratio=ratio,
        in_distribution=not oor and (ratio is None or ratio <= FAR_RATIO),
        out_of_range=oor,
        imputed=imputed,
        reasons=low + medium,
    )
