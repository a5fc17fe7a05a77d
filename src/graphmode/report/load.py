"""Profile datasets → what the report shows: per (model shape, workload, mode) cells, verdicts, facts.

Rows are read with :class:`~graphmode.core.dataset.ProfileStore` and aggregated as the selector
does: one :class:`~graphmode.selector.aggregate.TrainingSet` per (GPU, vLLM version), so cell means,
the noise (standard error shrunk towards the pooled spread), the ties and the rule that drops ``itl_*``
of a row whose client read coalesced chunks (:func:`~graphmode.selector.aggregate.metric_value`) are
exactly the selector's. The per-repeat values the plots need (for min/max whiskers and the coefficient
of variation) are kept beside it, filtered by the same :func:`metric_value`.

No plotting here: the views are :mod:`graphmode.report.views`; :mod:`graphmode.report.analysis` ranks them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from graphmode.core.dataset import ProfileStore
from graphmode.core.errors import DatasetError
from graphmode.core.modes import ALL_MODES, parse_mode
from graphmode.core.records import lone_start
from graphmode.report.analysis import verdict
from graphmode.report.configs import configurations
from graphmode.report.shapes import known_shape_names, shape_labels
from graphmode.report.views import (
    HEADLINE_METRICS,
    NOISE_METRICS,
    PARETO_METRICS,
    VIEWS,
    Cell,
    FailedRow,
    Host,
    ReportData,
    ShapeView,
    SourceDataset,
    WorkloadView,
    mode_order,
)
from graphmode.selector.aggregate import (
    TrainingSet,
    build_training_set,
    cell_frame,
    cell_stats,
    finite_number,
    metric_value,
    workload_spec,
)
from graphmode.selector.featurize import shape_key, shape_of_row


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
    skeys: dict[int, str] = {}  # id(row) -> its shape key: shape_of_row reads the deployment, once a row
    for name, r in rows:
        mode = _mode(r)
        shape = shape_of_row(r)
        skeys[id(r)] = shape_key(shape)
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
            failed_count[(skeys[id(r)], _mode(r) or str(r.get("mode")))] += 1

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
            by_shape[skeys[id(r)]].append(r)
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
            _add_row_facts(cells[_mode(r) or ""], r)
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
                cells=dict(sorted(cells.items(), key=lambda kv: mode_order(kv[0]))),
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
    constants, starts = _constants(skey, rows, modes, ts)
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




def _workload_order(w: WorkloadView) -> tuple[Any, ...]:
    ratio = (w.input_tokens / w.output_tokens) if w.input_tokens and w.output_tokens else 0.0
    return (-ratio, w.rate if w.rate is not None else math.inf,
            -(w.burstiness if w.burstiness is not None else 0.0), w.label)


# ---------------------------------------------------------------- verdicts and summaries


def _add_row_facts(cell: Cell, r: Mapping[str, Any]) -> None:
    """What one row adds to its cell beyond the selector's values: its block (GPU or run), window CIs, ITL
    dropped for coalesced chunks, delivered / offered output, vLLM's queue."""
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


def _constants(skey: str, rows: Sequence[Mapping[str, Any]], modes: Sequence[str],
               ts: TrainingSet | None) -> tuple[dict[str, dict[str, float | None]], dict[str, int]]:
    """Per mode: start-up, capture time and graph memory (the selector's means where it has them), and how
    many engine starts its rows come from."""
    constants: dict[str, dict[str, float | None]] = {}
    starts: dict[str, int] = {}
    for m in modes:
        per_start: dict[str, Mapping[str, Any]] = {}
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
    return constants, starts
