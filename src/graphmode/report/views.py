"""What the report shows, as data: per (model shape, workload, mode) cells, verdicts and facts.

:mod:`graphmode.report.load` builds them from datasets; :mod:`graphmode.report.analysis` ranks them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graphmode.core.modes import ALL_MODES, DEFAULT_MODE
from graphmode.report.configs import Configuration
from graphmode.selector.aggregate import (
    TrainingSet,
)
from graphmode.selector.objective import METRICS
from graphmode.selector.paired import PAIRED_METRICS, PairedRound, paired_rounds

DEFAULT = DEFAULT_MODE.value


@dataclass(frozen=True)
class MetricView:
    """How the report shows one metric: label, display unit and the factor from base units."""

    name: str
    label: str
    unit: str
    scale: float
    digits: int

    @property
    def direction(self) -> str:
        return METRICS[self.name].direction

    def fmt(self, v: float | None) -> str:
        return "–" if v is None or not math.isfinite(v) else f"{v * self.scale:.{self.digits}f}"


VIEWS: dict[str, MetricView] = {
    v.name: v
    for v in (
        MetricView("itl_p50", "ITL p50", "ms", 1e3, 2),
        MetricView("ttft_p50", "TTFT p50", "ms", 1e3, 1),
        MetricView("tpot_p50", "TPOT p50", "ms", 1e3, 2),
        MetricView("ttft_p99", "TTFT p99", "ms", 1e3, 1),
        MetricView("output_tok_s", "throughput", "tok/s", 1.0, 0),
    )
}
HEADLINE_METRICS: tuple[str, ...] = ("itl_p50", "ttft_p50", "output_tok_s")
NOISE_METRICS: tuple[str, ...] = ("itl_p50", "ttft_p50")
PARETO_METRICS: tuple[str, ...] = ("itl_p50", "ttft_p50", "tpot_p50")


# ---------------------------------------------------------------- what was read
@dataclass
class SourceDataset:
    path: Path
    n_rows: int
    n_ok: int
    n_failed: int


@dataclass
class FailedRow:
    dataset: str
    shape: str
    mode: str
    workload: str
    repeat: int
    reason: str
    started_at: float | None


@dataclass
class Host:
    gpu_name: str | None
    gpu_count: int | None
    gpu_memory_gib: float | None
    driver_version: str | None
    cuda_version: str | None
    vllm_version: str | None
    torch_version: str | None

    @property
    def label(self) -> str:
        return f"{self.gpu_name or 'unknown GPU'}, vLLM {self.vllm_version or '?'}"


# ---------------------------------------------------------------- cells and workloads
@dataclass
class Cell:
    """One (shape, workload, mode): every reliable per-repeat value of each metric."""

    mode: str
    n_rows: int = 0
    values: dict[str, list[float]] = field(default_factory=dict)
    itl_dropped: int = 0  # rows whose itl_* were dropped: the client read coalesced chunks
    ci: dict[str, list[float]] = field(default_factory=dict)  # metric -> relative 95% CI half-widths, if recorded
    delivered: list[float] = field(default_factory=list)  # output tokens delivered / offered, per repeat
    by_repeat: dict[str, dict[int, float]] = field(default_factory=dict)  # metric -> {repeat: value}
    queue: list[float] = field(default_factory=list)  # vLLM's mean waiting requests, per repeat
    block: dict[int, str] = field(default_factory=dict)  # repeat -> GPU (or profile run) that measured it

    def vals(self, metric: str) -> list[float]:
        return self.values.get(metric, [])

    def mean(self, metric: str) -> float | None:
        v = self.vals(metric)
        return float(np.mean(v)) if v else None

    def ci_median(self, metric: str) -> float | None:
        """Median over repeats of the within-window 95% CI half-width (relative), where rows record one."""
        v = self.ci.get(metric, [])
        return float(np.median(v)) if v else None

    def cv(self, metric: str) -> float | None:
        """Coefficient of variation over repeats (sample std / mean); None with fewer than two."""
        v = self.vals(metric)
        if len(v) < 2:
            return None
        m = float(np.mean(v))
        return float(np.std(v, ddof=1)) / abs(m) if m else None


@dataclass
class Verdict:
    """The measured ranking of one workload under one metric (the selector's tie rule)."""

    metric: str
    best: str  # best mean (lowest, or highest for throughput), before the prefer-default rule
    chosen: str  # what the selector's rule picks: the default when it is tied with the best
    ties: list[str]  # modes within the noise of the best (the best included)
    values: dict[str, float]
    default_loss_pct: float | None  # regret of vLLM's default vs the best, % of the best

    @property
    def tied(self) -> bool:
        return len(self.ties) > 1


@dataclass
class WorkloadView:
    key: str
    name: str
    label: str
    spec: dict[str, Any]
    rate: float | None
    burstiness: float | None
    input_tokens: float | None
    output_tokens: float | None
    features: dict[str, float | None]
    cells: dict[str, Cell]
    unit: int | None = None  # index into the shape's TrainingSet, None when the selector left it out
    verdicts: dict[str, Verdict] = field(default_factory=dict)


@dataclass
class ShapeView:
    key: str
    label: str
    short: str
    shape: dict[str, Any]
    host: Host
    ts: TrainingSet | None
    workloads: list[WorkloadView]
    modes: list[str]
    ok_rows: dict[str, int]
    failed_rows: dict[str, int]
    repeats: dict[str, tuple[int, int]]  # mode -> (min, max) repeats over its workloads
    attention: dict[str, list[str]]  # mode -> attention backends seen
    runner: dict[str, list[str]]  # mode -> model runners seen
    first: float | None
    last: float | None
    constants: dict[str, dict[str, float | None]]  # mode -> startup_s / capture_s / graph_gib means
    starts: dict[str, int]  # mode -> engine starts seen

    def workload(self, name: str) -> WorkloadView | None:
        return next((w for w in self.workloads if w.name == name), None)


@dataclass
class HeadlineRow:
    shape: str
    metric: str
    n: int
    wins: dict[str, int]  # mode -> workloads where it has the best mean
    ties: int  # workloads whose best is within noise of another mode
    default_median_loss_pct: float | None
    default_max_loss_pct: float | None
    default_max_loss_workload: str | None
    default_ok: int = 0  # workloads where the default is the best or within noise of it
    worst_best_mode: str | None = None  # on the default's worst workload: the best mode ...
    worst_best_value: float | None = None  # ... its mean ...
    worst_default_value: float | None = None  # ... and the default's mean


@dataclass
class StartEffect:
    """Later engine starts of one mode against its first, over the workloads measured in both."""

    shape: str
    mode: str
    workloads: int
    median_ratio: float
    min_ratio: float
    max_ratio: float
    share_slower: float  # of (workload, later start) pairs where the later start measured higher
    median_cv: float | None


@dataclass
class ParetoPoint:
    shape: str
    mode: str
    rel: dict[str, float | None]  # metric -> median over workloads of mean / best mean
    n: dict[str, int]
    graph_gib: float | None
    startup_s: float | None
    capture_s: float | None
    pareto: dict[str, bool]  # metric -> on the (latency, graph memory) front of its shape
    pareto3: dict[str, bool]  # metric -> on the (latency, graph memory, startup) front


@dataclass
class ReportData:
    datasets: list[SourceDataset]
    shapes: list[ShapeView]
    failed: list[FailedRow]
    modes: list[str]
    duplicates: int = 0
    notes: list[str] = field(default_factory=list)
    configurations: list[Configuration] = field(default_factory=list)  # deployment × vLLM release (configs.py)

    @property
    def hosts(self) -> list[Host]:
        seen: dict[tuple[str | None, str | None], Host] = {}
        for s in self.shapes:
            seen.setdefault((s.host.gpu_name, s.host.vllm_version), s.host)
        return list(seen.values())

    @property
    def n_ok(self) -> int:
        return sum(sum(s.ok_rows.values()) for s in self.shapes)

    @property
    def max_repeats(self) -> int:
        return max((hi for s in self.shapes for _, hi in s.repeats.values()), default=0)

    def saturation(self, queue_min: float = 1.0) -> tuple[float | None, list[tuple[str, str, list[str]]]]:
        """Median delivered/offered output tokens over unsaturated cells, and the saturated ones.

        A cell is saturated when vLLM kept ``queue_min`` or more requests waiting on average. Below that,
        an open-loop workload gets what it offers whatever the mode, so a throughput "win" there is
        window noise; (shape, workload, [modes]) lists where capacity differences can show.
        """
        delivered: list[float] = []
        saturated: list[tuple[str, str, list[str]]] = []
        for s in self.shapes:
            for w in s.workloads:
                modes = [m for m, c in w.cells.items() if c.queue and float(np.median(c.queue)) >= queue_min]
                if modes:
                    saturated.append((s.short, w.label, sorted(modes, key=mode_order)))
                delivered += [d for m, c in w.cells.items() if m not in modes for d in c.delivered]
        return (float(np.median(delivered)) if delivered else None), saturated

    def start_effects(self, metric: str) -> list[StartEffect]:
        """Per shape and mode, how much a later engine start differs from the first on the same workloads."""
        out: list[StartEffect] = []
        for s in self.shapes:
            for mode in self.modes:
                ratios: list[float] = []
                cvs: list[float] = []
                for w in s.workloads:
                    c = w.cells.get(mode)
                    reps = c.by_repeat.get(metric, {}) if c else {}
                    if len(reps) < 2 or c is None:
                        continue
                    first = reps[min(reps)]
                    ratios += [reps[k] / first for k in sorted(reps)[1:] if first]
                    if (cv := c.cv(metric)) is not None:
                        cvs.append(cv)
                if ratios:
                    out.append(StartEffect(s.short, mode, len(cvs), float(np.median(ratios)), min(ratios),
                                           max(ratios), float(np.mean([r > 1 for r in ratios])),
                                           float(np.median(cvs)) if cvs else None))
        return out

    def paired_rounds(self, metrics: Sequence[str] = PAIRED_METRICS) -> list[PairedRound]:
        """Per shape, mode and round on one GPU: the median over workloads of mode / default
        (:func:`graphmode.selector.paired.paired_rounds`, on this report's cells)."""
        measured: dict[tuple[str, str, str], dict[int, tuple[str, dict[str, float]]]] = {}
        for s in self.shapes:
            for w in s.workloads:
                for mode, c in w.cells.items():
                    measured[(s.short, w.label, mode)] = {
                        rep: (where, {m: c.by_repeat[m][rep] for m in metrics if rep in c.by_repeat.get(m, {})})
                        for rep, where in c.block.items()
                    }
        shapes = {s.short: i for i, s in enumerate(self.shapes)}
        modes = {m: i for i, m in enumerate(self.modes)}
        return sorted(paired_rounds(measured, metrics, DEFAULT),
                      key=lambda p: (shapes.get(p.shape, 0), modes.get(p.mode, 0), p.repeat, p.block))

    def itl_dropped(self) -> list[tuple[str, str, str, int, int]]:
        """(shape, workload, mode, rows dropped, rows) of every cell with coalesced-chunk ITL."""
        return [
            (s.short, w.label, m, c.itl_dropped, c.n_rows)
            for s in self.shapes
            for w in s.workloads
            for m, c in w.cells.items()
            if c.itl_dropped
        ]


# ---------------------------------------------------------------- loading


def mode_order(mode: str) -> int:
    values = [m.value for m in ALL_MODES]
    return values.index(mode) if mode in values else len(values)
