"""Profile rows → a training set: one unit per (workload, model shape), repeats aggregated with their spread.

* A **unit** is one workload under one model shape. Its input is the mean of every observed feature over
  all of its ok rows, every mode and repeat: the selector must score every mode from one feature
  vector, and a live server only shows the features under the mode it runs, so the training input is
  the workload's signature rather than any one mode's view of it.
* A **cell** is (unit, mode). Each metric over its repeats gives ``mean``, ``std`` (``NaN`` with one
  repeat) and ``n``.
* **Per-mode constants** (start-up, capture, graph memory, KV cache) are properties of an engine start,
  copied onto every row the start served; they are aggregated over distinct starts, keyed by
  ``(run_id, mode)``, per model shape. ``NONE`` captures no graphs, so its missing capture time and
  graph memory are 0, not unknown.
* **Noise** per metric is the median coefficient of variation over cells with two or more repeats; with
  no repeats anywhere it is an assumed :data:`DEFAULT_NOISE_CV` and the card says so.

Every null is tolerated: a metric null everywhere is simply absent, a mode with no rows is absent.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from graphmode.core.errors import DatasetError
from graphmode.core.modes import ALL_MODES, CudaGraphMode, parse_mode
from graphmode.core.records import Fingerprint, ObservedFeatures
from graphmode.selector.featurize import shape_key, shape_of_row
from graphmode.selector.noise import RaceNoise, race_noise
from graphmode.selector.objective import CONSTANT_METRICS, WORKLOAD_METRICS
from graphmode.selector.paired import PairedVerdict, measured_from_rows, paired_rounds, paired_verdicts
from graphmode.selector.specdecode import SpecDecodeMeasured, spec_decode_by_shape
from graphmode.selector.verdicts import SPENDING_RULE, RaceVerdict, race_verdicts

DEFAULT_NOISE_CV = 0.03
SHRINK_K = 2.0  # prior weight (in repeats) of the pooled noise when shrinking one cell's spread
OBS_NAMES: tuple[str, ...] = tuple(ObservedFeatures.model_fields)
FloatArray = NDArray[np.float64]



VERDICT_METRICS: tuple[str, ...] = ("itl_p50", "ttft_p50", "tpot_p50")  # race verdicts the card keeps

@dataclass
class Unit:
    key: str
    workload: str
    workload_hash: str
    group: str
    shape: dict[str, Any]
    shape_key: str
    features: dict[str, float | None]
    spec: dict[str, Any]
    n_rows: int


@dataclass
class TrainingSet:
    units: list[Unit]
    modes: list[str]
    metrics: list[str]
    mean: FloatArray  # (units, modes, metrics)
    std: FloatArray
    count: NDArray[np.int64]
    shapes: dict[str, dict[str, Any]]  # shape key -> shape fields
    constants: list[str]
    const_mean: FloatArray  # (shapes, modes, constants), shapes in `shape_keys` order
    const_std: FloatArray
    const_count: NDArray[np.int64]
    shape_keys: list[str]
    noise_cv: dict[str, float]
    noise_source: dict[str, str]
    fingerprints: list[Fingerprint]
    data_sha256: str
    n_rows: int
    n_rows_total: int
    synthetic: bool
    notes: list[str] = field(default_factory=list)
    paired: list[PairedVerdict] = field(default_factory=list)  # mode vs default inside rounds, per shape
    race: list[RaceVerdict] = field(default_factory=list)  # race verdicts per shape (selector.verdicts)
    race_noise: list[RaceNoise] = field(default_factory=list)  # restart and clock effects per shape (selector.noise)
    spec_decode: dict[str, SpecDecodeMeasured] = field(default_factory=dict)  # shape key -> drafts accepted

    @property
    def groups(self) -> list[str]:
        return sorted({u.group for u in self.units})

    def subset(self, keep: Sequence[int]) -> TrainingSet:
        """The same set restricted to the units at ``keep`` (constants and noise kept as they are)."""
        idx = np.asarray(keep, dtype=np.int64)
        return TrainingSet(
            units=[self.units[i] for i in idx],
            modes=self.modes,
            metrics=self.metrics,
            mean=self.mean[idx],
            std=self.std[idx],
            count=self.count[idx],
            shapes=self.shapes,
            constants=self.constants,
            const_mean=self.const_mean,
            const_std=self.const_std,
            const_count=self.const_count,
            shape_keys=self.shape_keys,
            noise_cv=self.noise_cv,
            noise_source=self.noise_source,
            fingerprints=self.fingerprints,
            data_sha256=self.data_sha256,
            n_rows=self.n_rows,
            n_rows_total=self.n_rows_total,
            synthetic=self.synthetic,
            notes=self.notes,
            paired=self.paired,
            spec_decode=self.spec_decode,
        )

    def cell_sigma(self, metric: str) -> FloatArray:
        """Standard error of each cell's mean of ``metric``: its spread shrunk towards the pooled noise."""
        j = self.metrics.index(metric)
        mean, std, n = self.mean[:, :, j], self.std[:, :, j], self.count[:, :, j].astype(np.float64)
        pooled = self.noise_cv.get(metric, DEFAULT_NOISE_CV) * np.abs(mean)
        own = np.where(np.isfinite(std), std, 0.0) ** 2 * np.maximum(n - 1, 0)
        var = (own + SHRINK_K * pooled**2) / (np.maximum(n - 1, 0) + SHRINK_K)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.asarray(np.sqrt(var) / np.sqrt(np.maximum(n, 1)), dtype=np.float64)

    def table(self, u: int) -> dict[str, dict[str, float | None]]:
        """Measured means of unit ``u``: mode -> metric -> value, constants of its shape included."""
        s = self.shape_keys.index(self.units[u].shape_key)
        out: dict[str, dict[str, float | None]] = {}
        for i, mode in enumerate(self.modes):
            if self.count[u, i].max(initial=0) == 0:
                continue
            row: dict[str, float | None] = {m: _f(self.mean[u, i, j]) for j, m in enumerate(self.metrics)}
            row.update({c: _f(self.const_mean[s, i, k]) for k, c in enumerate(self.constants)})
            out[mode] = row
        return out


def _f(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def finite_number(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


# Below this ratio of ITL p50 to TPOT p50 the client read coalesced chunks (the API server or client fell
# behind), so the pooled per-token gaps say nothing about the engine: see docs/method.md, "ITL under overload".
ITL_COALESCED_RATIO = 0.5


def metric_value(row: Mapping[str, Any], metric: str) -> float | None:
    """A row's measured *metric*, or None where the measurement is known to be unreliable."""
    value = finite_number(row.get(metric))
    if value is not None and metric.startswith("itl_"):
        itl50, tpot50 = finite_number(row.get("itl_p50")), finite_number(row.get("tpot_p50"))
        if itl50 is not None and tpot50 and itl50 < ITL_COALESCED_RATIO * tpot50:
            return None
    return value


Value = Callable[[Mapping[str, Any], str], float | None]


def workload_spec(row: Mapping[str, Any]) -> dict[str, Any]:
    try:
        spec = json.loads(row.get("workload_spec") or "{}")
    except (TypeError, json.JSONDecodeError):
        return {}
    return spec if isinstance(spec, dict) else {}


def unit_key(row: Mapping[str, Any]) -> str:
    """One workload (name and spec hash) under one model shape."""
    return f"{row.get('workload')}@{row.get('workload_hash') or ''}#{shape_key(shape_of_row(row))}"


def cell_frame(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], value: Value = metric_value) -> pd.DataFrame:
    """One line per row: its unit, shape, workload, mode, repeat and run, and ``value(row, column)`` for each
    of ``columns`` (NaN where it is None). The trainer, the report and bench/campaign_stats.py aggregate it."""
    keys = ("unit", "shape", "workload", "mode", "repeat", "run_id")
    lines = [
        (unit_key(r), shape_key(shape_of_row(r)), str(r.get("workload")), parse_mode(str(r.get("mode"))).value,
         int(r.get("repeat") or 0), str(r.get("run_id")), *(value(r, c) for c in columns))
        for r in rows
    ]
    frame = pd.DataFrame(lines, columns=[*keys, *columns])
    return frame.astype(dict.fromkeys(columns, "float64"))


def cell_stats(frame: pd.DataFrame, columns: Sequence[str], by: Sequence[str] = ("unit", "mode")) -> pd.DataFrame:
    """Per group (a cell by default): ``mean``, sample ``std`` (NaN with one value) and ``count`` of each column,
    missing values left out; columns are (column, statistic). No columns (race rows only: no lone start to
    take start-up constants from) give no groups, not pandas' "No objects to concatenate"."""
    if not columns:
        return pd.DataFrame(index=pd.MultiIndex.from_tuples([], names=list(by)))
    return frame.groupby(list(by), sort=False)[list(columns)].agg(["mean", "std", "count"])


def _fill(stats: pd.DataFrame, columns: Sequence[str], index: Callable[[Any], tuple[int, int] | None],
          shape: tuple[int, int, int]) -> tuple[FloatArray, FloatArray, NDArray[np.int64]]:
    """(mean, std, count) arrays from :func:`cell_stats`, each group placed at ``index(group)``."""
    mean, std, count = np.full(shape, np.nan), np.full(shape, np.nan), np.zeros(shape, dtype=np.int64)
    placed = [(k, at) for k, group in enumerate(stats.index) if (at := index(group)) is not None]
    if placed:
        rows, where = [k for k, _ in placed], tuple(np.array([at for _, at in placed]).T)
        mean[where] = stats.xs("mean", axis=1, level=1)[list(columns)].to_numpy()[rows]
        std[where] = stats.xs("std", axis=1, level=1)[list(columns)].to_numpy()[rows]
        count[where] = stats.xs("count", axis=1, level=1)[list(columns)].to_numpy()[rows]
    return mean, std, count


def rows_sha256(rows: Sequence[Mapping[str, Any]]) -> str:
    """Content hash of the rows a model was trained on (independent of SQLite's file layout)."""
    h = hashlib.sha256()
    for row in sorted(rows, key=lambda r: (r.get("id") or 0, str(r.get("run_id")))):
        h.update(json.dumps(row, sort_keys=True, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


def fingerprint_of_row(row: Mapping[str, Any]) -> Fingerprint:
    fields: dict[str, Any] = {}
    for name in Fingerprint.model_fields:
        v = row.get("fp_" + name)
        if name == "vllm_args":
            try:
                v = json.loads(v) if isinstance(v, str) else (v or [])
            except json.JSONDecodeError:
                v = []
        fields[name] = v
    return Fingerprint.model_validate(fields)


def build_training_set(
    rows: Sequence[Mapping[str, Any]],
    *,
    fingerprint_key: str | None = None,
    profile_key: str | None = None,
    n_rows_total: int | None = None,
) -> TrainingSet:
    """Aggregate ok rows (see the module docstring). Raises :class:`DatasetError` when nothing is usable."""
    notes: list[str] = []
    usable: list[Mapping[str, Any]] = []
    bad_modes: set[str] = set()
    for r in rows:
        if r.get("status", "ok") != "ok":
            continue
        try:
            parse_mode(str(r.get("mode")))
        except ValueError:
            bad_modes.add(str(r.get("mode")))
            continue
        if profile_key and r.get("profile_key") != profile_key:
            continue
        if fingerprint_key and fingerprint_of_row(r).key() != fingerprint_key:
            continue
        usable.append(r)
    if bad_modes:
        notes.append(f"rows with unknown modes skipped: {', '.join(sorted(bad_modes))}")
    if not usable:
        raise DatasetError(
            "no usable ok rows"
            + (" for the fingerprint/profile key given" if fingerprint_key or profile_key else "")
        )
    hosts = {(r.get("fp_gpu_name"), r.get("fp_vllm_version")) for r in usable}
    if len(hosts) > 1:
        keys = sorted(
            {
                fingerprint_of_row(r).key() + f" ({r.get('fp_gpu_name')}, vLLM {r.get('fp_vllm_version')})"
                for r in usable
            }
        )
        raise DatasetError(
            "the rows come from several GPUs or vLLM versions; a model covers one. Pick one "
            "fingerprint key: " + "; ".join(keys)
        )

    obs = [f"obs_{n}" for n in OBS_NAMES]
    frame = cell_frame(usable, [*WORKLOAD_METRICS, *obs])
    feats = cell_stats(frame, obs, by=("unit",))
    by_unit: dict[Any, Any] = frame.groupby("unit").indices  # unit -> positions of its rows in `usable`

    modes = [m.value for m in ALL_MODES if m.value in set(frame["mode"])]
    units: list[Unit] = []
    for key in sorted(by_unit):
        r = usable[by_unit[key][0]]
        wname = str(r.get("workload"))
        features = {n: _f(float(feats.loc[key, (f"obs_{n}", "mean")])) for n in OBS_NAMES}
        if all(v is None for v in features.values()):
            notes.append(f"workload {wname} has no observed features in any row; left out")
            continue
        shape = shape_of_row(r)
        units.append(Unit(key=key, workload=wname, workload_hash=str(r.get("workload_hash") or ""), group=wname,
                          shape=shape, shape_key=shape_key(shape), features=features,
                          spec=workload_spec(r), n_rows=len(by_unit[key])))
    if not units:
        raise DatasetError("no row has observed features: was /metrics scraped during the profile?")

    metrics = [m for m in WORKLOAD_METRICS if frame[m].notna().any()]
    if not metrics:
        raise DatasetError("no row has a latency or throughput measurement")
    unit_index = {u.key: i for i, u in enumerate(units)}
    mode_index = {m: i for i, m in enumerate(modes)}

    def cell_at(group: Any) -> tuple[int, int] | None:
        key, mode = group
        return (unit_index[key], mode_index[mode]) if key in unit_index else None

    mean, std, count = _fill(cell_stats(frame, metrics), metrics, cell_at, (len(units), len(modes), len(metrics)))

    shapes: dict[str, dict[str, Any]] = {}
    for unit in units:
        shapes.setdefault(unit.shape_key, unit.shape)
    shape_keys = sorted(shapes)
    starts: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    for r in usable:
        skey = shape_key(shape_of_row(r))
        # Race engines start side by side: vLLM's graph memory is a device-wide free-memory difference
        # and start-up shares the host, so an overlapped start measures its neighbours too (the H200
        # race of 2026-12-01 logged 19.7 GiB of "graphs" for a 0.5B default whose lone starts took 0.33).
        if skey in shapes and not r.get("race_id"):
            starts.setdefault((skey, parse_mode(str(r["mode"])).value, str(r.get("run_id"))), r)
    constants = []
    for c in CONSTANT_METRICS:
        has = any(finite_number(r.get(c)) is not None for r in starts.values())
        if has or (c in ("capture_s", "graph_gib") and CudaGraphMode.NONE.value in modes):
            constants.append(c)
    n_s, n_c = len(shape_keys), len(constants)
    start_frame = cell_frame(list(starts.values()), constants, lambda r, c: finite_number(r.get(c)))

    def const_at(group: Any) -> tuple[int, int]:
        return shape_keys.index(group[0]), mode_index[group[1]]

    const_mean, const_std, const_count = _fill(
        cell_stats(start_frame, constants, by=("shape", "mode")), constants, const_at, (n_s, len(modes), n_c))
    if CudaGraphMode.NONE.value in modes:  # NONE captures no graphs: 0, not unknown, where it started at all
        i = mode_index[CudaGraphMode.NONE.value]
        started = {shape_keys.index(k) for k, m, _ in starts if m == CudaGraphMode.NONE.value}
        for k, c in enumerate(constants):
            for si in started:
                if c in ("capture_s", "graph_gib") and const_count[si, i, k] == 0:
                    const_mean[si, i, k], const_count[si, i, k] = 0.0, 1

    noise_cv: dict[str, float] = {}
    noise_source: dict[str, str] = {}
    for j, metric in enumerate(metrics):
        ok = (count[:, :, j] >= 2) & (np.abs(mean[:, :, j]) > 0)
        if ok.any():
            cvs = std[:, :, j][ok] / np.abs(mean[:, :, j][ok])
            noise_cv[metric] = float(np.median(cvs))
            noise_source[metric] = f"median CV over {int(ok.sum())} cells with repeats"
        else:
            noise_cv[metric] = DEFAULT_NOISE_CV
            noise_source[metric] = f"assumed {DEFAULT_NOISE_CV:.0%} (no cell has two repeats)"
    for k, c in enumerate(constants):
        ok = (const_count[:, :, k] >= 2) & (np.abs(const_mean[:, :, k]) > 0)
        if ok.any():
            noise_cv[c] = float(np.median(const_std[:, :, k][ok] / np.abs(const_mean[:, :, k][ok])))
            noise_source[c] = f"median CV over {int(ok.sum())} modes with several engine starts"
        else:
            noise_cv[c] = DEFAULT_NOISE_CV
            noise_source[c] = f"assumed {DEFAULT_NOISE_CV:.0%} (one engine start per mode)"

    fps: dict[str, Fingerprint] = {}
    for r in usable:
        fp = fingerprint_of_row(r)
        fps.setdefault(fp.key(), fp)
    synthetic = any(str(r.get("run_id", "")).startswith("synthetic") for r in usable)
    if synthetic:
        notes.append("SYNTHETIC rows (run_id 'synthetic-*'): not measurements; for development only")
    # TPOT too: a race of hundreds of streams decides on it (SSE chunks coalesce, so ITL misleads there),
    # and a tpot_p50 objective should find its verdicts
    race = race_verdicts(usable, SPENDING_RULE, metrics=VERDICT_METRICS)  # a "better" at its stated error rate
    return TrainingSet(
        units=units,
        modes=modes,
        metrics=metrics,
        mean=mean,
        std=std,
        count=count,
        shapes=shapes,
        constants=constants,
        const_mean=const_mean,
        const_std=const_std,
        const_count=const_count,
        shape_keys=shape_keys,
        noise_cv=noise_cv,
        noise_source=noise_source,
        fingerprints=[fps[k] for k in sorted(fps)],
        data_sha256=rows_sha256(usable),
        n_rows=len(usable),
        n_rows_total=n_rows_total if n_rows_total is not None else len(rows),
        synthetic=synthetic,
        notes=notes,
        paired=paired_verdicts(paired_rounds(measured_from_rows(usable, metric_value))),
        race=race,
        race_noise=race_noise(usable, race),
        spec_decode=spec_decode_by_shape(usable),
    )
