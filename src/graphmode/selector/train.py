"""``graphmode train``: dataset(s) → cross-validated, saved model folder (artifact, card, CV, decision table).

Steps: read the ok rows; aggregate them (:mod:`~graphmode.selector.aggregate`); leave-one-workload-out
CV of every candidate regressor, which picks the kind (lowest log-RMSE; :mod:`~graphmode.selector.evaluate`)
unless given; fit it on all data; check the description formulas against the profiled workloads
(:mod:`~graphmode.selector.describe`); precompute the launch-time decision table
(:mod:`~graphmode.selector.table`); save. The card names the dataset files by path and sha256; the
folder keeps no copy of them.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from graphmode.core.dataset import ProfileStore
from graphmode.core.errors import DatasetError, ModelError, ObjectiveError
from graphmode.core.modes import DEFAULT_MODE
from graphmode.profiling.race_sizes import is_sizes_row
from graphmode.selector.aggregate import TrainingSet, build_training_set
from graphmode.selector.artifacts import save_artifact
from graphmode.selector.card import (
    ARTIFACT_FILE,
    CV_FILE,
    CVReport,
    DatasetInfo,
    DatasetSource,
    DescribeCheck,
    LibraryVersions,
    MetricInfo,
    ModelCard,
)
from graphmode.selector.describe import CALIBRATED, CHECKED, WorkloadDescription, describe_features
from graphmode.selector.estimators import RegressorKind
from graphmode.selector.evaluate import DEFAULT_EVAL_METRICS, cross_validate
from graphmode.selector.model import SelectorModel, _design, fit_model
from graphmode.selector.objective import METRICS, Objective
from graphmode.selector.table import build_table, save_table

Progress = Callable[[str], None]


@dataclass
class TrainResult:
    model_id: str
    out_dir: Path
    card: ModelCard
    report: CVReport
    model: SelectorModel
    training_set: TrainingSet


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "x"


def derive_model_id(ts: TrainingSet) -> str:
    """``<gpu>-vllm<version>-<key>``: the registry folder of the (GPU, vLLM, model shape) fingerprint."""

    fp = ts.fingerprints[0]
    keys = sorted({f.key() for f in ts.fingerprints})
    key = keys[0] if len(keys) == 1 else hashlib.sha256("|".join(keys).encode()).hexdigest()[:12]
    return f"{_slug(fp.gpu_name or 'nogpu')}-vllm{_slug(fp.vllm_version or 'unknown')}-{key}"


def load_rows(dataset: Path | Sequence[Path]) -> tuple[list[dict[str, object]], int]:
    """Ok rows of one dataset or several (e.g. one per model shape), and how many rows they hold in all."""
    paths = [dataset] if isinstance(dataset, Path) else list(dataset)
    rows: list[dict[str, object]] = []
    total = 0
    for path in paths:
        with ProfileStore(path, readonly=True) as store:
            # a capture-size arm's rows ran the default mode with another list: not the mode's latency
            rows.extend(r for r in store.rows(status="ok") if not is_sizes_row(r))
            total += store.count()
    return rows, total


def train(
    dataset: Path | str | Sequence[Path | str],
    out_dir: Path | str | None = None,
    *,
    models_dir: Path | str | None = None,
    objective: Objective | None = None,
    regressor: RegressorKind | Literal["auto"] = "auto",
    fingerprint_key: str | None = None,
    profile_key: str | None = None,
    eval_metrics: Sequence[str] = DEFAULT_EVAL_METRICS,
    random_state: int = 0,
    progress: Progress | None = None,
    capture_datasets: Sequence[Path | str] = (),
) -> TrainResult:
    """Train a model on ``dataset`` (one file or several, merged) and save it to ``out_dir``
    (default: ``models_dir/<derived id>``). ``capture_datasets`` are named in the card for capture costs
    only (see :func:`check_capture_dataset`), never trained on."""
    say = progress or (lambda _m: None)
    paths = [Path(dataset)] if isinstance(dataset, str | Path) else [Path(d) for d in dataset]
    if not paths:
        raise DatasetError("no dataset given")
    if len({p.resolve() for p in paths}) != len(paths):
        raise DatasetError("the same dataset is given twice: its rows would count double")
    captures = [Path(c) for c in capture_datasets]
    if {c.resolve() for c in captures} & {p.resolve() for p in paths}:
        raise DatasetError("a dataset is given both to train on and for capture costs: give it once")
    rows, total = load_rows(paths)
    ts = build_training_set(
        rows, fingerprint_key=fingerprint_key, profile_key=profile_key, n_rows_total=total
    )
    objective = objective or Objective()
    if objective.metric not in ts.metrics:
        raise ObjectiveError(
            f"the default objective's metric {objective.metric} was never measured in "
            f"{', '.join(map(str, paths))} (measured: {', '.join(ts.metrics)}); pass another --objective"
        )
    evaluated = [Objective(metric=m) for m in eval_metrics if m in ts.metrics and m != objective.metric]
    say(
        f"{ts.n_rows} ok rows, {len(ts.units)} workloads × {len(ts.modes)} modes "
        f"({', '.join(ts.modes)}); {len(ts.shape_keys)} model shape(s)"
    )
    t0 = time.perf_counter()
    report = cross_validate(
        ts,
        default_objective=objective,
        objectives=evaluated,
        chosen_regressor=None if regressor == "auto" else regressor,
        random_state=random_state,
    )
    say(f"cross-validation: {report.folds} folds in {time.perf_counter() - t0:.1f} s")
    model = fit_model(ts, regressor_kind=report.chosen_regressor, random_state=random_state)  # type: ignore[arg-type]
    checks = describe_checks(ts, model)
    notes = list(ts.notes)
    if len(ts.groups) < 4:
        notes.append(f"only {len(ts.groups)} workloads: the model is little more than a lookup; profile more")
    if len(ts.modes) < 2:
        notes.append(
            f"only {len(ts.modes)} mode(s) in the data ({', '.join(ts.modes)}): no real choice to make"
        )

    fp0 = ts.fingerprints[0]
    for c in captures:
        say(check_capture_dataset(c, gpu_name=fp0.gpu_name, vllm_version=fp0.vllm_version))
    model_id = derive_model_id(ts)
    if out_dir is None:
        root = Path(models_dir) if models_dir is not None else _default_models_dir()
        out = root / model_id
    else:
        out = Path(out_dir)
        if not re.fullmatch(r"[A-Za-z0-9_.\-+]+", out.name) or out.name in (".", ".."):
            raise ModelError(
                f"--out {out}: the folder name is the model id and may hold only letters, digits and . _ - +"
            )
        model_id = out.name
    out.mkdir(parents=True, exist_ok=True)
    info = save_artifact(model.artifact(), out / ARTIFACT_FILE)
    card = build_card(
        ts,
        model,
        report,
        objective,
        evaluated,
        model_id=model_id,
        sources=[dataset_source(p, out) for p in paths],
        capture_sources=[dataset_source(c, out) for c in captures],
        checks=checks,
        notes=notes,
        artifact=info,
    )
    (out / CV_FILE).write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    card.save(out)
    descriptions = [d for u in ts.units if (d := WorkloadDescription.from_spec(u.spec)) and d.concurrency is None]
    if descriptions:
        from graphmode.selector.recommend import Recommender

        t0 = time.perf_counter()
        table = build_table(Recommender.from_dir(out), descriptions, [objective, *evaluated])
        save_table(table, out)
        n = len(next(iter(table["objectives"].values()))["mode"])
        say(f"decision table: {n} described workloads × {len(table['objectives'])} objectives "
            f"in {time.perf_counter() - t0:.1f} s")
    say(f"saved {out}")
    return TrainResult(model_id=model_id, out_dir=out, card=card, report=report, model=model, training_set=ts)


def _default_models_dir() -> Path:
    from graphmode.core.settings import load_settings

    return load_settings().selector.models_dir


def check_capture_dataset(path: Path, *, gpu_name: str | None, vllm_version: str | None) -> str:
    """Why *path* cannot give this model capture costs (a DatasetError), else what it adds.

    Its lone engine starts (not race starts: side by side, vLLM's graph GiB is the device's) must be of the
    model's GPU and vLLM release, since both move capture time and graph memory."""
    from graphmode.selector.capture_costs import costs_from_dataset

    rows: list[dict[str, object]] = []
    with ProfileStore(path, readonly=True) as store:
        rows = [r for r in store.rows(status="ok") if not r.get("race_id")]
    starts = {(r.get("run_id"), r.get("mode"), r.get("repeat"), r.get("startup_s")) for r in rows
              if r.get("capture_s") is not None}
    if not starts:
        raise DatasetError(f"capture dataset {path}: no engine start outside a race with a capture time: "
                           "nothing to fit capture costs on")
    for field, want in (("fp_gpu_name", gpu_name), ("fp_vllm_version", vllm_version)):
        seen = sorted({str(r.get(field)) for r in rows if r.get(field) is not None})
        if want is not None and any(v != want for v in seen):
            raise DatasetError(f"capture dataset {path}: {field.removeprefix('fp_')} {', '.join(seen)}, the model's "
                               f"is {want}: capture costs do not carry across")
    costs = costs_from_dataset(path)
    return f"capture costs from {path.name}: {len(starts)} engine starts; {costs.basis}"


def dataset_source(path: Path, folder: Path) -> DatasetSource:
    """``path`` as the card names it: relative to the model folder, with its sha256."""
    data = path.read_bytes()
    try:
        rel = os.path.relpath(path.resolve(), folder.resolve())
    except ValueError:  # another drive
        rel = str(path.resolve())
    return DatasetSource(path=Path(rel).as_posix(), sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))


def describe_checks(ts: TrainingSet, model: SelectorModel) -> list[DescribeCheck]:
    """Described vs observed features over the profiled workloads; the calibration factors."""
    e2e_col = model.metrics.index("e2e_p50") if "e2e_p50" in model.metrics else None
    predict = model.regressor.compile()

    def e2e_of_shape(shape: dict[str, object]) -> Callable[[dict[str, float | None]], float | None] | None:
        if e2e_col is None:
            return None

        def f(feats: dict[str, float | None]) -> float | None:
            x, _ = model.spec.vectorize(feats, shape)
            vals = predict(_design(x[None, :])[0])[e2e_col :: len(model.metrics)]
            vals = vals[np.isfinite(vals)]
            return float(np.exp(vals.mean())) if vals.size else None

        return f

    pairs: dict[str, list[tuple[float, float]]] = {k: [] for k in CHECKED}
    for unit in ts.units:
        desc = WorkloadDescription.from_spec(unit.spec)
        if desc is None:
            continue
        d = describe_features(desc, e2e_of_shape(unit.shape)).__dict__
        for k in CHECKED:
            obs, got = unit.features.get(k), d.get(k)
            if obs is not None and got is not None and obs > 0 and got > 0:
                pairs[k].append((float(obs), float(got)))
    out = []
    for k, ps in pairs.items():
        if not ps:
            continue
        o_arr = np.array([p[0] for p in ps])
        g_arr = np.array([p[1] for p in ps])
        calib = float(np.clip(np.median(o_arr / g_arr), 0.25, 4.0)) if k in CALIBRATED else 1.0
        raw_err = float(np.median(np.abs(np.log(o_arr / g_arr))))
        cal_err = float(np.median(np.abs(np.log(o_arr / (g_arr * calib)))))
        out.append(
            DescribeCheck(
                feature=k,
                calibration=calib,
                median_abs_log_err_raw=raw_err,
                median_abs_log_err_calibrated=cal_err,
                n=len(ps),
            )
        )
    return out


def primary_first(ts: TrainingSet) -> list[str]:
    """The training set's shape keys, the one a question without a target shape assumes first: a shape under
    vLLM's default configuration before one with a backend, quantization or speculative decoding asked for,
    then the one measured on the most workloads, then the key (stable across retrains). The decision table
    is built for it, so launch's fast path answers for the shape the campaign measured most."""
    from graphmode.core.deployment import config_suffix

    workloads: dict[str, int] = {}
    for u in ts.units:
        workloads[u.shape_key] = workloads.get(u.shape_key, 0) + 1
    return sorted(ts.shape_keys,
                  key=lambda k: (config_suffix(ts.shapes[k]) != "", -workloads.get(k, 0), k))


def measured_modes(ts: TrainingSet) -> dict[str, list[str]]:
    """Shape key -> the modes with a measured cell on it, in the training set's mode order."""
    seen: dict[str, set[int]] = {k: set() for k in ts.shape_keys}
    has = np.asarray((ts.count > 0).any(axis=2))  # (units, modes)
    for u, unit in enumerate(ts.units):
        seen.setdefault(unit.shape_key, set()).update(int(i) for i in np.flatnonzero(has[u]))
    return {k: [ts.modes[i] for i in sorted(idx)] for k, idx in seen.items()}


def build_card(
    ts: TrainingSet,
    model: SelectorModel,
    report: CVReport,
    objective: Objective,
    evaluated: list[Objective],
    *,
    model_id: str,
    sources: list[DatasetSource],
    checks: list[DescribeCheck],
    notes: list[str],
    artifact: object,
    capture_sources: list[DatasetSource] | None = None,
) -> ModelCard:
    from graphmode.selector.card import ArtifactInfo

    assert isinstance(artifact, ArtifactInfo)
    reps = ts.count[ts.count > 0]
    metrics = {}
    for name in ts.metrics + ts.constants:
        d = METRICS[name]
        if name in ts.metrics:
            cells = int((ts.count[:, :, ts.metrics.index(name)] > 0).sum())
        else:
            cells = int((ts.const_count[:, :, ts.constants.index(name)] > 0).sum())
        metrics[name] = MetricInfo(
            name=name,
            direction=d.direction,
            unit=d.unit,
            kind=d.kind,
            description=d.description,
            noise_cv=ts.noise_cv.get(name, 0.0),
            noise_source=ts.noise_source.get(name, ""),
            measured_cells=cells,
        )
    fp0 = ts.fingerprints[0]
    return ModelCard(
        model_id=model_id,
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        synthetic=ts.synthetic,
        gpu_name=fp0.gpu_name,
        vllm_version=fp0.vllm_version,
        fingerprints=ts.fingerprints,
        fingerprint_keys=sorted({f.key() for f in ts.fingerprints}),
        shapes=[ts.shapes[k] for k in primary_first(ts)],
        shape_modes=measured_modes(ts),
        shape_spec_decode=ts.spec_decode,
        dataset=DatasetInfo(
            sources=sources,
            capture_sources=capture_sources or [],
            rows_sha256=ts.data_sha256,
            rows_used=ts.n_rows,
            rows_total=ts.n_rows_total,
            n_workloads=len(ts.units),
            workloads=sorted({u.workload for u in ts.units}),
            modes=ts.modes,
            repeats_min=int(reps.min()) if reps.size else 0,
            repeats_max=int(reps.max()) if reps.size else 0,
            synthetic=ts.synthetic,
        ),
        versions=LibraryVersions.current(),
        features=model.spec,
        modes=model.modes,
        default_mode=DEFAULT_MODE.value,
        workload_metrics=model.metrics,
        constant_metrics=model.constants,
        metrics=metrics,
        default_objective=objective,
        evaluated_objectives=evaluated,
        regressor_kind=report.chosen_regressor,
        cv=report,
        describe=checks,
        paired=ts.paired,
        race=ts.race,
        race_noise=ts.race_noise,
        artifacts={ARTIFACT_FILE: artifact},
        notes=notes,
    )


__all__ = ["ModelError", "TrainResult", "derive_model_id", "train"]
