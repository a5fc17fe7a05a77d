"""Across races: one mode against the default on one metric over the races of a model, each its own engine starts.

Every race (one model shape and deployment configuration) starts its own engines, so the ratios (each over all
its rounds) of one mode and metric over the *other* races of a model (one GPU, one vLLM release) are independent
draws of "mode against default, start effect included". Their one-sample t interval of the mean log ratio says
whether the effect is the mode's or a start's (:func:`across_races`); the same interval over the races' A/A arms
(:func:`across_aa_arms`), where the truth is 1, is its control.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from graphmode.core.modes import DEFAULT_MODE
from graphmode.profiling.race_rounds import CONTROL_ARM

if TYPE_CHECKING:
    from graphmode.selector.verdicts import RaceVerdict

VerdictKind = Literal["better", "worse", "equivalent", "undecided"]


# Fewer other races than this and their interval is too wide to tell a mode's effect from the starts'.
MIN_OTHER_RACES = 3


class AcrossRaces(BaseModel):
    """One mode against the default on one metric over several races (each its own engine starts)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: str
    metric: str
    verdict: VerdictKind
    races: int
    ratio: float = Field(description="geometric mean over the races of each race's ratio over all its rounds")
    lo: float
    hi: float
    confidence: float
    delta: float
    shapes: list[str] = Field(default_factory=list)

    def describe(self) -> str:
        return (f"{self.mode}'s {self.metric} is {self.ratio:.3f}× the default's over {self.races} other "
                f"races (their own engine starts and configurations), {self.confidence:.0%} interval "
                f"{self.lo:.3f}–{self.hi:.3f} (t on the races' log ratios): {self.verdict} (δ {self.delta:g})")


def across_races(verdicts: Sequence[RaceVerdict], mode: str, metric: str, *, exclude_shape: str | None = None,
                 delta: float = 0.03, confidence: float = 0.95,
                 min_races: int = MIN_OTHER_RACES) -> AcrossRaces | None:
    """*mode* against the default on *metric* over the races of *verdicts* (one per shape, the pooled verdict),
    but *exclude_shape*'s; None with fewer than *min_races*. A/A arms and arms vLLM ran as another mode are
    not the mode and are left out. Each race's sample is its ratio over every round (``ratio_all``), not the
    verdict's ratio at its first crossing, which a sequential rule reaches sooner on extreme rounds."""
    picked = sorted(((v.shape, r) for v in verdicts
                     if v.mode == mode and v.metric == metric and v.workload is None and not v.runs_as
                     and v.shape != exclude_shape and (r := _race_ratio(v)) is not None),
                    key=lambda sv: sv[0])
    return _across(picked, mode, metric, delta, confidence, min_races)


def _race_ratio(v: RaceVerdict) -> float | None:
    """A race's one sample: its ratio over every round (a verdict's own ratio stops at its first crossing)."""
    r = v.ratio_all if v.ratio_all is not None else v.ratio
    return r if r is not None and r > 0 else None


def across_aa_arms(verdicts: Sequence[RaceVerdict], metric: str, *, default_mode: str = DEFAULT_MODE.value,
                   delta: float = 0.03, confidence: float = 0.95,
                   min_races: int = MIN_OTHER_RACES) -> AcrossRaces | None:
    """The control of :func:`across_races`: the same interval over the races' A/A arms (CONTROL, and arms vLLM
    ran as the default's mode), where the truth is 1. It should not read "better" or "worse"."""
    picked = sorted(((v.shape, r) for v in verdicts
                     if (v.mode == CONTROL_ARM or v.runs_as == default_mode) and v.metric == metric
                     and v.workload is None and (r := _race_ratio(v)) is not None), key=lambda sv: sv[0])
    return _across(picked, CONTROL_ARM, metric, delta, confidence, min_races)


def _across(picked: Sequence[tuple[str, float]], mode: str, metric: str, delta: float, confidence: float,
            min_races: int) -> AcrossRaces | None:
    from graphmode.profiling.sequential import interval

    if len(picked) < max(min_races, 2):
        return None
    mean, lo, hi = interval([math.log(r) for _, r in picked], confidence)
    up, down = math.log1p(delta), math.log1p(-delta)
    kind: VerdictKind = ("better" if hi < down else "worse" if lo > up
                         else "equivalent" if -up <= lo and hi <= up else "undecided")
    return AcrossRaces(mode=mode, metric=metric, verdict=kind, races=len(picked), ratio=math.exp(mean),
                       lo=math.exp(lo), hi=math.exp(hi), confidence=confidence, delta=delta,
                       shapes=[sh for sh, _ in picked])
