"""The fitted selector in memory: feature spec, per-(mode, metric) regressors, per-mode constants.

Targets are learned in log space (``log`` for latencies and throughputs, ``log1p`` for the per-mode
constants, which can be 0), so errors are relative and predictions stay positive. Columns are
mode-major: output ``i * len(metrics) + j`` is metric ``j`` of mode ``i``. The decision is the ranking
of these per-mode predictions (:func:`~graphmode.selector.objective.rank`), for any objective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from graphmode.core.errors import ModelError
from graphmode.core.modes import DEFAULT_MODE
from graphmode.selector.aggregate import TrainingSet
from graphmode.selector.estimators import ColumnwiseRegressor, RegressorKind
from graphmode.selector.featurize import FeatureSpec, fit_spec
from graphmode.selector.objective import Objective, Ranking, rank

FloatArray = NDArray[np.float64]
N_TREES = 50


def measured_ranking(
    ts: TrainingSet, u: int, objective: Objective, default_mode: str = DEFAULT_MODE.value
) -> Ranking | None:
    """The ranking of unit ``u``'s measured modes (noise: standard error of each cell's mean)."""
    table = ts.table(u)
    if objective.metric in ts.metrics:
        sigma = ts.cell_sigma(objective.metric)[u]
        noise = {m: (float(sigma[i]) if math.isfinite(sigma[i]) else None) for i, m in enumerate(ts.modes)}
    else:
        noise = {}
    try:
        return rank(table, noise, objective, default_mode)
    except Exception:
        return None


def _design(X: FloatArray) -> FloatArray:
    """Estimators need at least one column; with no usable feature the model is intercept-only."""
    return X if X.shape[1] else np.zeros((X.shape[0], 1))


@dataclass
class SelectorModel:
    spec: FeatureSpec
    modes: list[str]
    metrics: list[str]
    constants: list[str]
    regressor: ColumnwiseRegressor
    const_regressor: ColumnwiseRegressor
    const_cols: list[int]
    train_x: FloatArray
    noise_cv: dict[str, float]
    default_mode: str

    # ---- batch prediction (CV, training checks); the per-request path is compiled in recommend.py ----
    def predict_metrics(self, X: FloatArray) -> FloatArray:
        """(n, modes, metrics) in base units; NaN where the model has no such column."""
        logy = self.regressor.predict(_design(X))
        return np.exp(np.asarray(logy).reshape(X.shape[0], len(self.modes), len(self.metrics)))

    def const_input(self, X: FloatArray) -> FloatArray:
        return _design(X[:, self.const_cols] if self.const_cols else np.zeros((X.shape[0], 0)))

    def predict_constants(self, X: FloatArray) -> FloatArray:
        if not self.constants:
            return np.zeros((X.shape[0], len(self.modes), 0))
        logc = self.const_regressor.predict(self.const_input(X))
        return np.expm1(np.asarray(logc).reshape(X.shape[0], len(self.modes), len(self.constants)))

    def tables(self, X: FloatArray) -> list[dict[str, dict[str, float | None]]]:
        met, const = self.predict_metrics(X), self.predict_constants(X)
        out = []
        for r in range(X.shape[0]):
            table: dict[str, dict[str, float | None]] = {}
            for i, mode in enumerate(self.modes):
                row = {m: _f(met[r, i, j]) for j, m in enumerate(self.metrics)}
                row.update({c: _f(const[r, i, k]) for k, c in enumerate(self.constants)})
                if any(v is not None for v in row.values()):
                    table[mode] = row
            out.append(table)
        return out

    def noise_for(self, table: dict[str, dict[str, float | None]], metric: str) -> dict[str, float | None]:
        cv = self.noise_cv.get(metric)
        return {
            m: (None if cv is None or row.get(metric) is None else cv * abs(row[metric] or 0.0))
            for m, row in table.items()
        }

    # ---- persistence: the estimators go to skops, everything else to the card ----
    def artifact(self) -> dict[str, Any]:
        return {
            "regressor": self.regressor,
            "const_regressor": self.const_regressor,
            "train_x": self.train_x,
        }

    @classmethod
    def from_artifact(
        cls,
        obj: Any,
        *,
        spec: FeatureSpec,
        modes: list[str],
        metrics: list[str],
        constants: list[str],
        noise_cv: dict[str, float],
        default_mode: str,
    ) -> SelectorModel:
        if not isinstance(obj, dict) or not {"regressor", "const_regressor", "train_x"} <= set(obj):
            raise ModelError("model artifact does not hold a graphmode selector")
        reg, creg = obj["regressor"], obj["const_regressor"]
        if not isinstance(reg, ColumnwiseRegressor) or not isinstance(creg, ColumnwiseRegressor):
            raise ModelError("model artifact's regressors are not graphmode ColumnwiseRegressors")
        if reg.n_outputs_ != len(modes) * len(metrics):
            raise ModelError(f"regressor has {reg.n_outputs_} outputs, card says {len(modes)}x{len(metrics)}")
        return cls(
            spec=spec,
            modes=modes,
            metrics=metrics,
            constants=constants,
            regressor=reg,
            const_regressor=creg,
            const_cols=const_columns(spec),
            train_x=np.asarray(obj["train_x"], dtype=np.float64),
            noise_cv=noise_cv,
            default_mode=default_mode,
        )


def _f(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def const_columns(spec: FeatureSpec) -> list[int]:
    return [i for i, s in enumerate(spec.sources) if s != "obs"]


def fit_model(
    ts: TrainingSet, *, regressor_kind: RegressorKind = "ridge", random_state: int = 0
) -> SelectorModel:
    """Fit every part of a selector on ``ts``: the workload regressors and the per-shape constants."""
    default_mode = DEFAULT_MODE.value
    spec, X = fit_spec([u.features for u in ts.units], [u.shape for u in ts.units])
    n = len(ts.units)
    with np.errstate(divide="ignore", invalid="ignore"):
        Y = np.where(ts.mean > 0, np.log(np.where(ts.mean > 0, ts.mean, 1.0)), np.nan).reshape(n, -1)
    reg = ColumnwiseRegressor(
        kind=regressor_kind, n_estimators=N_TREES, random_state=random_state, allow_nan_targets=True
    ).fit(_design(X), Y)
    ccols = const_columns(spec)
    shape_rows = np.array([spec.vectorize({}, ts.shapes[k])[0] for k in ts.shape_keys]).reshape(
        len(ts.shape_keys), -1
    )
    Xc = _design(shape_rows[:, ccols] if ccols else np.zeros((len(ts.shape_keys), 0)))
    with np.errstate(invalid="ignore"):
        Yc = np.where(ts.const_mean >= 0, np.log1p(np.maximum(ts.const_mean, 0.0)), np.nan)
    Yc = Yc.reshape(len(ts.shape_keys), -1)
    # One shape: the constants are its means. Several: those of the nearest profiled shape.
    const_kind: RegressorKind = "knn" if len(ts.shape_keys) >= 2 else "mean"
    creg = ColumnwiseRegressor(kind=const_kind, n_neighbors=1, allow_nan_targets=True).fit(
        Xc, Yc if Yc.shape[1] else np.zeros((Xc.shape[0], 1))
    )
    return SelectorModel(
        spec=spec,
        modes=list(ts.modes),
        metrics=list(ts.metrics),
        constants=list(ts.constants),
        regressor=reg,
        const_regressor=creg,
        const_cols=ccols,
        train_x=X,
        noise_cv=dict(ts.noise_cv),
        default_mode=default_mode,
    )
