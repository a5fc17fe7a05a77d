"""Profile datasets → what the report shows: per (model shape, workload, mode) cells, verdicts, facts.

Rows are read with :class:`~graphmode.core.dataset.ProfileStore` and aggregated as the selector
does: one :class:`~graphmode.selector.aggregate.TrainingSet` per (GPU, vLLM version), so cell means,
the noise (standard error shrunk towards the pooled spread), the ties and the rule that drops ``itl_*``
of a row whose client read coalesced chunks (:func:`~graphmode.selector.aggregate.metric_value`) are
exactly the selector's. The per-repeat values the plots need (for min/max whiskers and the coefficient
of variation) are kept beside it, filtered by the same :func:`metric_value`.

No plotting here: :mod:`graphmode.report.figures` and :mod:`graphmode.report.html` draw what this builds.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graphmode.core.dataset import ProfileStore
from graphmode.core.errors import DatasetError
from graphmode.core.modes import ALL_MODES, DEFAULT_MODE, parse_mode
from graphmode.core.records import lone_start
from graphmode.report.configs import Configuration, configurations
from graphmode.selector.aggregate import (
    ITL_COALESCED_RATIO,
    TrainingSet,
    build_training_set,
    cell_frame,
    cell_stats,
    finite_number,
    metric_value,
    workload_spec,
)
from graphmode.selector.featurize import shape_key, shape_of_row
from graphmode.selector.objective import METRICS, make_objective, regret
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
BAR_METRICS: tuple[str, ...] = ("itl_p50", "ttft_p50", "tpot_p50", "output_tok_s")
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

    def lo(self, metric: str) -> float | None:
        v = self.vals(metric)
        return min(v) if v else None

    def hi(self, metric: str) -> float | None:
        v = self.vals(metric)
        return max(v) if v else None

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

    @property
    def tokens(self) -> tuple[float, float] | None:
        if self.input_tokens is None or self.output_tokens is None:
            return None
        return (self.input_tokens, self.output_tokens)


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
                    saturated.append((s.short, w.label, sorted(modes, key=_mode_order)))
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
def read_datasets(paths: Sequence[Path]) -> tuple[list[SourceDataset], list[tuple[str, dict[str, Any]]]]:
    """Every row of every dataset, tagged with its file name. Missing or corrupt files: DatasetError."""
    if not paths:
        raise DatasetError("no profile dataset given")
    sources: list[SourceDataset] = []
    rows: list[tuple[str, dict[str, Any]]] = []
    for path in paths:
        with ProfileStore(path, readonly=True) as store:
            got = store.rows()
        n_ok = sum(1 for r in got if r.get("status") == "ok")
        sources.append(SourceDataset(Path(path), len(got), n_ok, len(got) - n_ok))
        rows += [(Path(path).name, r) for r in got]
    if not any(s.n_ok for s in sources):
        names = ", ".join(str(s.path) for s in sources)
        raise DatasetError(f"no ok rows in {names}: nothing to report")
    return sources, rows


def _row_id(r: Mapping[str, Any]) -> tuple[Any, ...]:
    return (r.get("run_id"), r.get("mode"), r.get("workload"), r.get("workload_hash"), r.get("repeat"),
            r.get("started_at"), r.get("status"))




def _mean_of(spec: Mapping[str, Any], key: str) -> float | None:
    part = spec.get(key)
    return finite_number(part.get("mean")) if isinstance(part, Mapping) else finite_number(part)


def _mode(r: Mapping[str, Any]) -> str | None:
    try:
        return parse_mode(str(r.get("mode"))).value
    except ValueError:
        return None


def known_shape_names(shapes_dir: Path | None) -> dict[str, str]:
    """config hash -> file stem of each ``models/shapes/*.json`` (hashed as the fingerprint does)."""
    out: dict[str, str] = {}
    if shapes_dir is None or not shapes_dir.is_dir():
        return out
    for p in sorted(shapes_dir.glob("*.json")):
        try:
            cfg = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(cfg, dict):
            out[hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:12]] = p.stem
    return out


def shape_labels(shape: Mapping[str, Any], names: Mapping[str, str]) -> tuple[str, str]:
    """(long label, short label) of a model shape."""
    arch = shape.get("model_architecture") or "unknown architecture"
    p = finite_number(shape.get("num_params_b"))
    dims = "×".join(str(shape.get(k)) for k in ("num_layers", "hidden_size") if shape.get(k) is not None)
    detail = ", ".join(x for x in (str(arch), f"{p:.2f}B params" if p else "", f"{dims} layers×hidden" if dims
                                   else "") if x)
    name = names.get(str(shape.get("model_config_hash") or ""))
    short = name or (f"{arch} {p:.2g}B" if p else str(arch))
    return (f"{name} ({detail})" if name else detail), short


def _host(r: Mapping[str, Any]) -> Host:
    return Host(
        gpu_name=r.get("fp_gpu_name"),
        gpu_count=r.get("fp_gpu_count"),
        gpu_memory_gib=finite_number(r.get("fp_gpu_memory_gib")),
        driver_version=r.get("fp_driver_version"),
        cuda_version=r.get("fp_cuda_version"),
        vllm_version=r.get("fp_vllm_version"),
        torch_version=r.get("fp_torch_version"),
    )


def load_report_data(paths: Sequence[Path], *, shapes_dir: Path | None = None) -> ReportData:
    """Read ``paths`` and aggregate them (see the module docstring)."""
    sources, tagged = read_datasets(paths)
    seen: set[tuple[Any, ...]] = set()
    rows: list[tuple[str, dict[str, Any]]] = []
    for name, r in tagged:
        rid = _row_id(r)
        if rid in seen:
            continue
        seen.add(rid)
        rows.append((name, r))
    duplicates = len(tagged) - len(rows)
    names = known_shape_names(shapes_dir)
    notes: list[str] = []
    if duplicates:
        notes.append(f"{duplicates} rows appear in several datasets (same run, cell and start) and are counted once")

    failed: list[FailedRow] = []
    ok_by_host: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    bad_modes: set[str] = set()
    for name, r in rows:
        mode = _mode(r)
        shape = shape_of_row(r)
        if r.get("status") != "ok":
            reason = str(r.get("reason") or "no reason recorded").strip()
            failed.append(FailedRow(name, shape_labels(shape, names)[1], mode or str(r.get("mode")),
                                    str(r.get("workload")), int(r.get("repeat") or 0), reason,
                                    finite_number(r.get("started_at"))))
            continue
        if mode is None:
            bad_modes.add(str(r.get("mode")))
            continue
        ok_by_host[(r.get("fp_gpu_name"), r.get("fp_vllm_version"))].append(r)
    if bad_modes:
        notes.append(f"rows with unknown modes left out: {', '.join(sorted(bad_modes))}")

    failed_count: dict[tuple[str, str], int] = defaultdict(int)
    for _, r in rows:
        if r.get("status") != "ok":
            failed_count[(shape_key(shape_of_row(r)), _mode(r) or str(r.get("mode")))] += 1

    shapes: list[ShapeView] = []
    for (gpu, vllm), host_rows in ok_by_host.items():
        try:
            ts: TrainingSet | None = build_training_set(host_rows)
        except DatasetError as exc:
            ts = None
            notes.append(f"{gpu or 'unknown GPU'}, vLLM {vllm or '?'}: the selector cannot use these rows ({exc}); "
                         "their measurements are shown, without ties and verdicts")
        by_shape: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in host_rows:
            by_shape[shape_key(shape_of_row(r))].append(r)
        for skey, srows in by_shape.items():
            shapes.append(_shape_view(skey, srows, ts, names, failed_count))
    many_hosts = len({(s.host.gpu_name, s.host.vllm_version) for s in shapes}) > 1
    if many_hosts:
        for s in shapes:
            s.label = f"{s.label} — {s.host.label}"
            s.short = f"{s.short} @ {s.host.gpu_name or '?'}/vLLM {s.host.vllm_version or '?'}"
    shapes.sort(key=lambda s: (s.host.gpu_name or "", s.host.vllm_version or "",
                               finite_number(s.shape.get("num_params_b")) or 0.0, s.short))
    present = {m for s in shapes for m in s.modes}
    modes: list[str] = [m.value for m in ALL_MODES if m.value in present]
    for s in shapes:
        for w in s.workloads:
            for metric in HEADLINE_METRICS + NOISE_METRICS + PARETO_METRICS:
                if metric not in w.verdicts:
                    v = verdict(s, w, metric)
                    if v is not None:
                        w.verdicts[metric] = v
    return ReportData(sources, shapes, failed, modes, duplicates, notes,
                      configurations([r for _, r in rows], names))


def _shape_view(
    skey: str,
    rows: list[dict[str, Any]],
    ts: TrainingSet | None,
    names: Mapping[str, str],
    failed_count: Mapping[tuple[str, str], int],
) -> ShapeView:
    shape = shape_of_row(rows[0])
    label, short = shape_labels(shape, names)
    obs = [f"obs_{f}" for f in ("arrival_rate", "prefill_decode_ratio", "mean_input_tokens", "mean_output_tokens",
                                 "batch_mean", "batch_cv", "concurrency_mean")]
    frame = cell_frame(rows, [*VIEWS, *obs])  # the selector's values: unreliable ITL already left out
    feats = cell_stats(frame, obs, by=("unit",))
    by_unit: dict[Any, Any] = frame.groupby("unit", sort=False).indices
    name_hashes: dict[str, set[str]] = defaultdict(set)
    for key in by_unit:
        name_hashes[key.split("@", 1)[0]].add(key)
    unit_index = {u.key: i for i, u in enumerate(ts.units)} if ts is not None else {}

    workloads: list[WorkloadView] = []
    for key, at in by_unit.items():
        urows = [rows[i] for i in at]
        wname = str(urows[0].get("workload"))
        whash = str(urows[0].get("workload_hash") or "")
        spec = workload_spec(urows[0])
        features = {o[4:]: finite_number(float(feats.loc[key, (o, "mean")])) for o in obs}
        cells: dict[str, Cell] = {}
        for mode, g in frame.iloc[at].groupby("mode", sort=False):
            cell = cells[str(mode)] = Cell(str(mode), n_rows=len(g))
            for metric in VIEWS:
                got = g[g[metric].notna()]
                if len(got):
                    cell.values[metric] = got[metric].tolist()
                    cell.by_repeat[metric] = dict(zip(got["repeat"].tolist(), got[metric].tolist(), strict=True))
        for r in urows:
            cell = cells[_mode(r) or ""]
            block = r.get("gpu_uuid") or r.get("run_id")
            if block:
                cell.block[int(r.get("repeat") or 0)] = str(block)
            dropped = False
            for metric in VIEWS:
                if metric_value(r, metric) is not None:
                    ci = finite_number(r.get(metric + "_ci"))  # adaptive windows record it; older rows do not
                    if ci is not None:
                        cell.ci.setdefault(metric, []).append(ci)
                elif metric.startswith("itl_") and finite_number(r.get(metric)) is not None:
                    dropped = True
            cell.itl_dropped += int(dropped)
            sent_rate = finite_number(r.get("sent_rate")) or 0.0
            offered = sent_rate * (finite_number(r.get("sent_output_tokens_mean")) or 0.0)
            out_rate = finite_number(r.get("output_tok_s"))
            if offered > 0 and out_rate is not None:
                cell.delivered.append(out_rate / offered)
            queue = finite_number(r.get("obs_queue_mean"))
            if queue is not None:
                cell.queue.append(queue)
        burst = finite_number(spec.get("burstiness"))
        workloads.append(
            WorkloadView(
                key=key,
                name=wname,
                label=wname if len(name_hashes[wname]) == 1 else f"{wname} ({whash[:6]})",
                spec=spec,
                rate=finite_number(spec.get("rate")),
                burstiness=burst if burst is not None else (
                    1.0 if finite_number(spec.get("rate")) is not None else None),
                input_tokens=_mean_of(spec, "input"),
                output_tokens=_mean_of(spec, "output"),
                features=features,
                cells=dict(sorted(cells.items(), key=lambda kv: _mode_order(kv[0]))),
                unit=unit_index.get(key),
            )
        )
    workloads.sort(key=_workload_order)

    present = {_mode(r) for r in rows}
    modes: list[str] = [m.value for m in ALL_MODES if m.value in present]
    ok_rows = {m: sum(1 for r in rows if _mode(r) == m) for m in modes}
    repeats: dict[str, tuple[int, int]] = {}
    for m in modes:
        counts = [w.cells[m].n_rows for w in workloads if m in w.cells]
        repeats[m] = (min(counts), max(counts)) if counts else (0, 0)
    attention: dict[str, list[str]] = {}
    runner: dict[str, list[str]] = {}
    for m in modes:
        rs = [r for r in rows if _mode(r) == m]
        attention[m] = sorted({str(r["attention_backend"]) for r in rs if r.get("attention_backend")})
        runner[m] = sorted({str(r["model_runner"]) for r in rs if r.get("model_runner")})
    times = [t for r in rows for t in (finite_number(r.get("started_at")), finite_number(r.get("finished_at"))) if t]
    constants: dict[str, dict[str, float | None]] = {}
    starts: dict[str, int] = {}
    for m in modes:
        per_start: dict[str, dict[str, Any]] = {}
        for r in rows:
            if _mode(r) == m:
                per_start.setdefault(str(r.get("run_id")), r)
        starts[m] = len(per_start)
        constants[m] = {}
        for c in ("startup_s", "capture_s", "graph_gib"):
            if ts is not None and skey in ts.shape_keys and m in ts.modes and c in ts.constants:
                v = ts.const_mean[ts.shape_keys.index(skey), ts.modes.index(m), ts.constants.index(c)]
                constants[m][c] = float(v) if math.isfinite(v) else None
            else:
                # a start beside others (a race's wave) reads their memory in vLLM's graph GiB: lone starts only
                alone = [r for r in per_start.values() if c != "graph_gib" or lone_start(r)]
                vals = [v for v in (finite_number(r.get(c)) for r in alone) if v is not None]
                if not vals and m == "NONE" and c in ("capture_s", "graph_gib"):
                    vals = [0.0]  # NONE captures no graphs (as the selector counts it)
                constants[m][c] = float(np.mean(vals)) if vals else None
    return ShapeView(
        key=skey,
        label=label,
        short=short,
        shape=shape,
        host=_host(rows[0]),
        ts=ts,
        workloads=workloads,
        modes=modes,
        ok_rows=ok_rows,
        failed_rows={m: failed_count.get((skey, m), 0) for m in [x.value for x in ALL_MODES]
                     if failed_count.get((skey, m), 0)},
        repeats=repeats,
        attention=attention,
        runner=runner,
        first=min(times) if times else None,
        last=max(times) if times else None,
        constants=constants,
        starts=starts,
    )


def _mode_order(mode: str) -> int:
    values = [m.value for m in ALL_MODES]
    return values.index(mode) if mode in values else len(values)


def _workload_order(w: WorkloadView) -> tuple[Any, ...]:
    ratio = (w.input_tokens / w.output_tokens) if w.input_tokens and w.output_tokens else 0.0
    return (-ratio, w.rate if w.rate is not None else math.inf,
            -(w.burstiness if w.burstiness is not None else 0.0), w.label)


# ---------------------------------------------------------------- verdicts and summaries
def verdict(shape: ShapeView, w: WorkloadView, metric: str, default_mode: str = DEFAULT) -> Verdict | None:
    """The measured ranking of ``w`` under ``metric`` with the selector's noise and tie rule."""
    from graphmode.selector.model import measured_ranking

    if shape.ts is None or w.unit is None or metric not in shape.ts.metrics:
        return None
    ranking = measured_ranking(shape.ts, w.unit, make_objective(metric), default_mode)
    if ranking is None or ranking.top is None or ranking.best is None:
        return None
    values = {m: s.value for m, s in ranking.scores.items() if s.value is not None}
    if ranking.top not in values:
        return None
    ties = [ranking.top, *[m for m in ranking.ties if m != ranking.top]]
    loss = regret(values.get(default_mode), values[ranking.top], metric) if default_mode in values else None
    return Verdict(metric, ranking.top, ranking.best, ties, values, loss)


def headline(data: ReportData, metrics: Sequence[str] = HEADLINE_METRICS) -> list[HeadlineRow]:
    """Per shape and metric: wins per mode, ties, and the default's median / max loss vs the best."""
    out: list[HeadlineRow] = []
    for s in data.shapes:
        for metric in metrics:
            vs = [(w, w.verdicts[metric]) for w in s.workloads if metric in w.verdicts]
            if not vs:
                continue
            wins = {m: 0 for m in s.modes}
            for _, v in vs:
                wins[v.best] = wins.get(v.best, 0) + 1
            losses = [(v.default_loss_pct, w.label, v) for w, v in vs if v.default_loss_pct is not None]
            worst = max(losses, key=lambda x: x[0]) if losses else None
            out.append(
                HeadlineRow(
                    shape=s.short,
                    metric=metric,
                    n=len(vs),
                    wins=wins,
                    ties=sum(1 for _, v in vs if v.tied),
                    default_median_loss_pct=float(np.median([x for x, _, _ in losses])) if losses else None,
                    default_max_loss_pct=worst[0] if worst else None,
                    default_max_loss_workload=worst[1] if worst else None,
                    default_ok=sum(1 for _, v in vs if DEFAULT in v.ties),
                    worst_best_mode=worst[2].best if worst else None,
                    worst_best_value=worst[2].values.get(worst[2].best) if worst else None,
                    worst_default_value=worst[2].values.get(DEFAULT) if worst else None,
                )
            )
    return out


def _front(points: Sequence[tuple[float, ...]]) -> list[bool]:
    """Which points no other point dominates (every coordinate minimised)."""
    out = []
    for i, p in enumerate(points):
        dominated = any(
            all(q[k] <= p[k] for k in range(len(p))) and any(q[k] < p[k] for k in range(len(p)))
            for j, q in enumerate(points)
            if j != i
        )
        out.append(not dominated)
    return out


def pareto(data: ReportData, metrics: Sequence[str] = PARETO_METRICS) -> list[ParetoPoint]:
    """One point per (shape, mode): median relative latency over workloads, graph memory, start-up."""
    out: list[ParetoPoint] = []
    for s in data.shapes:
        pts = [
            ParetoPoint(s.short, m, {}, {}, s.constants[m].get("graph_gib"), s.constants[m].get("startup_s"),
                        s.constants[m].get("capture_s"), {}, {})
            for m in s.modes
        ]
        for metric in metrics:
            rel: dict[str, list[float]] = defaultdict(list)
            for w in s.workloads:
                means = {m: c.mean(metric) for m, c in w.cells.items()}
                known = {m: v for m, v in means.items() if v is not None and v > 0}
                if len(known) < 2:
                    continue
                best = min(known.values())
                for m, v in known.items():
                    rel[m].append(v / best)
            for p in pts:
                p.rel[metric] = float(np.median(rel[p.mode])) if rel.get(p.mode) else None
                p.n[metric] = len(rel.get(p.mode, []))
            full = [p for p in pts if p.rel[metric] is not None and p.graph_gib is not None]
            two = _front([(p.rel[metric] or 0.0, p.graph_gib or 0.0) for p in full])
            with_start = [p for p in full if p.startup_s is not None]
            three = _front([(p.rel[metric] or 0.0, p.graph_gib or 0.0, p.startup_s or 0.0) for p in with_start])
            for p in pts:
                p.pareto[metric] = any(p is q and f for q, f in zip(full, two, strict=True))
                p.pareto3[metric] = any(p is q and f for q, f in zip(with_start, three, strict=True))
        out += pts
    return out


def coalesced_rule() -> str:
    return (f"ITL ignored where ITL p50 < {ITL_COALESCED_RATIO:g} × TPOT p50 (the client read coalesced chunks; "
            "the selector does the same, aggregate.py metric_value; docs/method.md “ITL under overload”)")
