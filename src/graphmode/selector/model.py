"""The fitted selector in memory: feature spec, per-(mode, metric) regressors, per-mode constants, classifier.

Targets are learned in log space (``log`` for latencies and throughputs, ``log1p`` for the per-mode
constants, which can be 0), so errors are relative and predictions stay positive. Columns are
mode-major: output ``i * len(metrics) + j`` is metric ``j`` of mode ``i``.

The classifier is the fast path for the default objective and must agree with it, so it is a
*distillation* of the regressors: it learns the mode the per-mode predictions choose under the default
objective (:func:`~graphmode.selector.objective.rank`, ties going to vLLM's default, exactly as
:meth:`~graphmode.selector.recommend.Recommender.recommend` decides), on the training points plus a
deterministic sample of points in the training feature ranges (:func:`distill_points`), so it agrees
on and near the data. The *measured* best modes (:func:`labels_for`) are not its labels; cross-
validation scores its choices against them. :class:`~graphmode.selector.recommend.Recommender` still
checks it against the regressors on every answer.
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
from graphmode.selector.estimators import ClassifierKind, ColumnwiseRegressor, RegressorKind, make_classifier
from graphmode.selector.featurize import FeatureSpec, fit_spec
from graphmode.selector.objective import Objective, Ranking, rank

FloatArray = NDArray[np.float64]
N_TREES = 50
DISTILL_FACTOR = 20  # sampled points per training point for the classifier's labels...
DISTILL_MIN = 1000  # ...and at least this many
DISTILL_JITTER = 0.1  # near-data samples: training points moved by this share of each feature's range
DISTILL_SLACK = 0.1  # the sampled box: training ranges widened by this share (FeatureSpec.out_of_range's)


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
    classifier: Any
    classes: list[str]
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

    def classify(self, X: FloatArray) -> list[str]:
        return [str(c) for c in self.classifier.predict(_design(X))]

    # ---- persistence: the estimators go to skops, everything else to the card ----
    def artifact(self) -> dict[str, Any]:
        return {
            "regressor": self.regressor,
            "const_regressor": self.const_regressor,
            "classifier": self.classifier,
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
        classes: list[str],
        noise_cv: dict[str, float],
        default_mode: str,
    ) -> SelectorModel:
        if not isinstance(obj, dict) or not {"regressor", "const_regressor", "classifier", "train_x"} <= set(
            obj
        ):
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
            classifier=obj["classifier"],
            classes=classes,
            train_x=np.asarray(obj["train_x"], dtype=np.float64),
            noise_cv=noise_cv,
            default_mode=default_mode,
        )


def _f(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def const_columns(spec: FeatureSpec) -> list[int]:
    return [i for i, s in enumerate(spec.sources) if s != "obs"]


def labels_for(
    ts: TrainingSet, objective: Objective, default_mode: str = DEFAULT_MODE.value
) -> list[str | None]:
    out: list[str | None] = []
    for u in range(len(ts.units)):
        r = measured_ranking(ts, u, objective, default_mode)
        out.append(r.best if r is not None else None)
    return out


def distill_points(
    X: FloatArray, spec: FeatureSpec, random_state: int = 0, n_extra: int | None = None
) -> FloatArray:
    """The training points ``X`` plus a deterministic sample in their ranges (model feature space).

    ``n_extra`` (default ``max(DISTILL_MIN, DISTILL_FACTOR * len(X))``) points are added: half drawn
    uniformly in the training box of the traffic columns, half training points jittered by
    ``DISTILL_JITTER`` of each range; the box is widened by ``DISTILL_SLACK`` of each range, as far as
    :meth:`FeatureSpec.out_of_range` still calls an input in range, and samples are clipped to it. Shape
    and architecture columns are copied from a random training point, so every sample is a profiled
    model shape.
    """
    n, d = X.shape
    if n == 0 or d == 0:
        return X.copy()
    m = max(DISTILL_MIN, DISTILL_FACTOR * n) if n_extra is None else n_extra
    rng = np.random.default_rng(random_state)
    lo, hi = X.min(axis=0), X.max(axis=0)
    pad = DISTILL_SLACK * (hi - lo)
    lo, hi = lo - pad, hi + pad
    obs = np.array([s == "obs" for s in spec.sources], dtype=bool)
    k = int(obs.sum())
    S = X[rng.integers(0, n, size=m)].copy()
    half = m // 2
    if k:
        S[:half, obs] = rng.uniform(lo[obs], hi[obs], size=(half, k))
        S[half:, obs] += rng.normal(0.0, 1.0, size=(m - half, k)) * (DISTILL_JITTER * (hi - lo)[obs])
        S[:, obs] = np.clip(S[:, obs], lo[obs], hi[obs])
    return np.vstack([X, S])


def decided_modes(model: SelectorModel, X: FloatArray, objective: Objective) -> list[str | None]:
    """The mode the per-mode predictions choose for each row of ``X`` (as the recommender decides)."""
    out: list[str | None] = []
    for table in model.tables(X):
        if not table:
            out.append(None)
            continue
        try:
            r = rank(table, model.noise_for(table, objective.metric), objective, model.default_mode)
        except Exception:
            out.append(None)
            continue
        out.append(r.best)
    return out


def fit_classifier(
    model: SelectorModel,
    objective: Objective,
    kind: ClassifierKind | None,
    random_state: int = 0,
    X: FloatArray | None = None,
    labels: list[str | None] | None = None,
) -> Any:
    """A classifier of ``kind`` distilled from ``model``'s regressors under ``objective``.

    ``X``/``labels`` (the points and the regressors' choices there) may be precomputed, e.g. shared by
    several kinds; by default they are :func:`distill_points` of the training inputs. ``kind=None``
    gives a constant classifier (the most common choice on the training points).
    """
    if X is None:
        X = model.train_x if kind is None else distill_points(model.train_x, model.spec, random_state)
        labels = None
    if labels is None:
        labels = decided_modes(model, X, objective)
    keep = [i for i, lab in enumerate(labels) if lab is not None]
    if not keep:
        raise ModelError(
            f"the regressors predict no {objective.metric} for any mode: cannot label the best mode"
        )
    y = np.array([labels[i] for i in keep], dtype=object).astype(str)
    n_classes = len(set(y.tolist()))
    clf = make_classifier(kind or "extra_trees", n_classes if kind else 1, random_state)
    return clf.fit(_design(X)[keep], y)


def fit_model(
    ts: TrainingSet,
    *,
    objective: Objective,
    regressor_kind: RegressorKind = "ridge",
    classifier_kind: ClassifierKind | None = "extra_trees",
    random_state: int = 0,
) -> SelectorModel:
    """Fit every part of a selector on ``ts``: the regressors, then the classifier distilled from them.

    ``classifier_kind=None`` skips the distillation (a constant classifier stands in), for evaluations
    that fit classifiers on their own.
    """
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
    model = SelectorModel(
        spec=spec,
        modes=list(ts.modes),
        metrics=list(ts.metrics),
        constants=list(ts.constants),
        regressor=reg,
        const_regressor=creg,
        const_cols=ccols,
        classifier=None,
        classes=[],
        train_x=X,
        noise_cv=dict(ts.noise_cv),
        default_mode=default_mode,
    )
    clf = fit_classifier(model, objective, classifier_kind, random_state)
    model.classifier = clf
    model.classes = [str(c) for c in clf.classes_]
    return model
