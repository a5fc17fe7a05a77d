"""Paired comparisons: each mode against vLLM's default inside one round, measured on one GPU.

Engine starts on different hosts are not exchangeable: a host that runs vLLM's Python 30% slower moves
every mode of its starts (docs/results). The selector's tie rule takes the spread over all starts,
hosts included, so it is conservative: it keeps the default wherever hosts differ more than modes do. A
ratio taken inside a round (one repeat of every mode) on one GPU cancels the host; whether that ratio
falls on the same side in every round is the evidence this module computes. It is reported (the report's
noise section, the model card, and a note on a recommendation) and does not change a decision.

A *block* is the GPU UUID a row was measured on, or its profile run for rows recorded before the UUID
was. A round pairs a mode with the default on the workloads both measured in the same repeat and block.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from graphmode.core.modes import DEFAULT_MODE, parse_mode
from graphmode.selector.featurize import shape_key, shape_of_row

PAIRED_METRICS: tuple[str, ...] = ("itl_p50", "ttft_p50")
PAIRED_MARGIN = 0.03  # a round's ratio within ±3% of 1 says "same": the profiler's ITL target width
PAIRED_MIN_WORKLOADS = 3  # a round that paired fewer workloads says nothing

Verdict = Literal["lower", "higher", "same", "mixed", "one round"]
# (shape, workload, mode) -> repeat -> (block, metric -> value)
Measured = Mapping[tuple[str, str, str], Mapping[int, tuple[str, Mapping[str, float]]]]


class PairedRound(BaseModel):
    """One mode against the default inside one round (a repeat) measured on one block (GPU)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shape: str
    mode: str
    repeat: int
    block: str  # short label: the GPU UUID's first 8 hex digits, or the profile run
    ratios: dict[str, tuple[int, float]]  # metric -> (workloads paired, median of mode / default)


class PairedVerdict(BaseModel):
    """One mode against the default on one metric, over every round that paired it.

    ``lower`` / ``higher``: each round's median ratio is beyond the margin on the same side, in two
    rounds at least; ``same``: every round within the margin; ``mixed``: rounds disagree; ``one round``:
    too few rounds to tell a mode effect from one engine start's luck.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    shape: str
    mode: str
    metric: str
    rounds: list[tuple[int, int, float]]  # (repeat, workloads paired, median mode / default)
    verdict: Verdict

    @property
    def decisive(self) -> bool:
        return self.verdict in ("lower", "higher")

    def describe(self) -> str:
        """e.g. ``FULL's ttft_p50 was 0.75×/0.65× the default's, lower in 2 of 2 rounds (24, 3 workloads)``."""
        ratios = "/".join(f"{x:.2f}×" for _, _, x in self.rounds)
        workloads = ", ".join(str(n) for _, n, _ in self.rounds)
        n = len(self.rounds)
        side = f"{self.verdict} in {n} of {n} rounds" if self.decisive else f"{self.verdict} over {n} round(s)"
        return f"{self.mode}'s {self.metric} was {ratios} the default's, {side} ({workloads} workloads)"


def block_label(block: str) -> str:
    return block[4:12] if block.startswith("GPU-") else block


def measured_from_rows(
    rows: Iterable[Mapping[str, Any]],
    value: Callable[[Mapping[str, Any], str], float | None],
    metrics: Sequence[str] = PAIRED_METRICS,
) -> dict[tuple[str, str, str], dict[int, tuple[str, dict[str, float]]]]:
    """Index ok rows by (shape key, workload@hash, mode) and repeat; ``value`` reads a metric (the
    selector passes :func:`~graphmode.selector.aggregate.metric_value`, which drops unreliable ITL)."""
    out: dict[tuple[str, str, str], dict[int, tuple[str, dict[str, float]]]] = defaultdict(dict)
    for r in rows:
        if r.get("status", "ok") != "ok":
            continue
        try:
            mode = parse_mode(str(r.get("mode"))).value
        except ValueError:
            continue
        block = r.get("gpu_uuid") or r.get("run_id")
        if not block:
            continue
        key = (shape_key(shape_of_row(r)), f"{r.get('workload')}@{r.get('workload_hash') or ''}", mode)
        vals = {m: v for m in metrics if (v := value(r, m)) is not None}
        out[key][int(r.get("repeat") or 0)] = (str(block), vals)
    return out


def paired_rounds(
    measured: Measured, metrics: Sequence[str] = PAIRED_METRICS, default: str = DEFAULT_MODE.value
) -> list[PairedRound]:
    """Per shape, mode and round on one block: the median over workloads of mode / default."""
    acc: dict[tuple[str, str, int, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (shape, workload, mode), reps in measured.items():
        if mode == default:
            continue
        base = measured.get((shape, workload, default), {})
        for rep, (block, vals) in reps.items():
            if rep not in base or base[rep][0] != block:
                continue
            for metric in metrics:
                mine, ref = vals.get(metric), base[rep][1].get(metric)
                if mine is not None and ref is not None and ref > 0:
                    acc[(shape, mode, rep, block)][metric].append(mine / ref)
    return [
        PairedRound(shape=shape, mode=mode, repeat=rep, block=block_label(block),
                    ratios={m: (len(r), float(statistics.median(r))) for m, r in by_metric.items() if r})
        for (shape, mode, rep, block), by_metric in sorted(acc.items())
    ]


def paired_verdicts(
    rounds: Sequence[PairedRound],
    metrics: Sequence[str] = PAIRED_METRICS,
    margin: float = PAIRED_MARGIN,
    min_workloads: int = PAIRED_MIN_WORKLOADS,
) -> list[PairedVerdict]:
    """Sign agreement of the paired rounds per shape, mode and metric (a sign test across rounds)."""
    grouped: dict[tuple[str, str, str], list[tuple[int, int, float]]] = defaultdict(list)
    for r in rounds:
        for metric in metrics:
            got = r.ratios.get(metric)
            if got is not None and got[0] >= min_workloads:
                grouped[(r.shape, r.mode, metric)].append((r.repeat, got[0], got[1]))
    out: list[PairedVerdict] = []
    for (shape, mode, metric), rs in grouped.items():
        sides = {"lower" if x < 1 - margin else "higher" if x > 1 + margin else "same" for _, _, x in rs}
        verdict: Verdict
        if len(rs) < 2:
            verdict = "one round"
        elif len(sides) == 1:
            verdict = "lower" if "lower" in sides else "higher" if "higher" in sides else "same"
        else:
            verdict = "mixed"
        out.append(PairedVerdict(shape=shape, mode=mode, metric=metric, rounds=sorted(rs), verdict=verdict))
    return out


def paired_notes(verdicts: Iterable[PairedVerdict], better: str, best: str,
                 default_mode: str) -> tuple[list[str], list[str]]:
    """What the rounds measured on one host (*verdicts*: the shape's, on the objective's metric, where *better*
    is ``lower`` or ``higher``) say against an answer of *best*: the notes that a paired round would settle a
    tie the rule kept, and those where the default measured better."""
    settle, against = [], []
    for v in verdicts:
        if v.mode != best and v.verdict == better and best == default_mode:
            settle.append(
                f"paired inside rounds on one GPU for this model shape, {v.describe()}; the tie rule "
                f"counts differences between hosts as noise and keeps {best}. A paired round of "
                f"{v.mode} and {best} (graphmode profile --modes {v.mode},{best}) would settle it"
            )
        elif v.mode == best and v.verdict != better:
            against.append(
                f"paired inside rounds on one GPU for this model shape, {v.describe()}: inside one "
                f"host the default measured better"
            )
    return settle, against
