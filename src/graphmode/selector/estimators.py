"""The estimators a selector model is made of, and their fast single-row inference.

:class:`ColumnwiseRegressor` predicts every (mode, metric) column at once. Each column is its own
regressor fitted on the rows where that column was measured (a mode that failed on a workload leaves a
hole, ``NaN``, and the other columns keep that row), so "one regressor per (mode, target)" holds while
prediction stays one numpy call for every mode:

``ridge``
    Ridge regression on standardized inputs, ``alpha`` chosen per column by exact leave-one-out error
    over a fixed grid. Prediction is one matrix product.
``knn``
    Inverse-square-distance weighted mean of the ``n_neighbors`` nearest rows that measured the
    column, in standardized input space.
``extra_trees``
    One multi-output :class:`~sklearn.ensemble.ExtraTreesRegressor` over all columns (holes filled
    with the column mean for fitting only).
``mean``
    The column mean: the no-information baseline the others must beat.

For the per-request path every kind compiles to a function of one row (:meth:`ColumnwiseRegressor.compile`):
``ridge`` and ``knn`` to a few numpy operations, ``extra_trees`` to its trees' own ``predict``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.ensemble import ExtraTreesRegressor
from sklearn.utils.validation import check_is_fitted, validate_data

FloatArray = NDArray[np.float64]
RegressorKind = Literal["ridge", "knn", "extra_trees", "mean"]
REGRESSOR_KINDS: tuple[RegressorKind, ...] = ("ridge", "knn", "extra_trees", "mean")
DEFAULT_ALPHAS: tuple[float, ...] = tuple(float(a) for a in np.logspace(-3, 3, 13))
# Bounds for the per-request arithmetic: a far-out but finite input (a feature of 1e154) would square to
# inf, give every neighbour a weight of 1/inf = 0 and divide by their zero sum (issue 12). Standardized
# inputs are clipped to this many standard deviations, squared distances saturate below overflow.
MAX_ABS_Z = 1e6
MAX_D2 = 1e300


def _standardize_one(x: FloatArray, mean: FloatArray, scale: FloatArray) -> FloatArray:
    # inputs are finite (featurization fills NaN, requests reject inf): clipping also maps an overflow's ±inf
    # (the ufuncs, not np.clip's wrapper: a few µs on a path called up to 30 times per answer)
    return np.minimum(np.maximum((x - mean) / scale, -MAX_ABS_Z), MAX_ABS_Z)


def _inverse_square_weights(d2: FloatArray) -> FloatArray:
    """1 / d², finite and > 0 for every finite or infinite squared distance."""
    # NaN and anything above MAX_D2 (inf included) compare false: MAX_D2 (np.nan_to_num is ~20x slower)
    return np.asarray(1.0 / (np.where(d2 <= MAX_D2, d2, MAX_D2) + 1e-9))


class ColumnwiseRegressor(RegressorMixin, BaseEstimator):  # type: ignore[misc]
    """Multi-output regressor whose targets may have holes (NaN); see the module docstring.

    With ``allow_nan_targets`` a NaN target means "not measured": the row is left out of that column's
    fit only, and a column with no value at all predicts NaN. Without it, NaN targets are an error, as
    in any scikit-learn regressor.

    Parameters are stored unchanged by ``__init__``; everything learned ends in ``_``.
    """

    def __init__(
        self,
        kind: RegressorKind = "ridge",
        alphas: Sequence[float] = DEFAULT_ALPHAS,
        n_neighbors: int = 3,
        n_estimators: int = 100,
        random_state: int = 0,
        allow_nan_targets: bool = False,
    ) -> None:
        self.kind = kind
        self.alphas = alphas
        self.n_neighbors = n_neighbors
        self.n_estimators = n_estimators
        self.random_state = random_state
        self.allow_nan_targets = allow_nan_targets

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = True
        tags.target_tags.required = True
        return tags

    def fit(self, X: Any, y: Any) -> ColumnwiseRegressor:
        if self.kind not in REGRESSOR_KINDS:
            raise ValueError(f"kind must be one of {REGRESSOR_KINDS}, got {self.kind!r}")
        if y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target y is None")
        X = validate_data(self, X, reset=True, dtype=np.float64, ensure_min_samples=1)
        Y = np.asarray(y, dtype=np.float64)
        if Y.ndim not in (1, 2) or Y.shape[0] != X.shape[0]:
            raise ValueError(f"y must have {X.shape[0]} rows, got shape {Y.shape}")
        if np.isinf(Y).any():
            raise ValueError("Input y contains infinity")
        if not self.allow_nan_targets and np.isnan(Y).any():
            raise ValueError("Input y contains NaN (set allow_nan_targets=True for columns with holes)")
        self.single_output_ = Y.ndim == 1
        Y2 = Y.reshape(-1, 1) if Y.ndim == 1 else Y
        k = Y2.shape[1]
        self.n_outputs_ = k
        mean = X.mean(axis=0)
        scale = X.std(axis=0)
        self.x_mean_ = mean
        self.x_scale_ = np.where(scale > 0, scale, 1.0)
        Z = (X - self.x_mean_) / self.x_scale_
        finite = np.isfinite(Y2)
        self.n_fit_ = finite.sum(axis=0).astype(np.int64)
        col_mean = np.array([Y2[finite[:, j], j].mean() if finite[:, j].any() else np.nan for j in range(k)])
        self.y_mean_ = col_mean
        self.coef_ = np.zeros((Z.shape[1], k))
        self.intercept_ = np.where(np.isfinite(col_mean), col_mean, np.nan)
        self.alpha_ = np.full(k, np.nan)
        if self.kind == "ridge":
            for j in range(k):
                rows = finite[:, j]
                if rows.sum() >= 3 and Z.shape[1]:
                    coef, icpt, alpha = _ridge_loo(Z[rows], Y2[rows, j], self.alphas)
                    self.coef_[:, j], self.intercept_[j], self.alpha_[j] = coef, icpt, alpha
        elif self.kind == "knn":
            self.train_z_ = Z
            self.train_y_ = Y2.copy()
        elif self.kind == "extra_trees":
            filled = np.where(finite, Y2, np.where(np.isfinite(col_mean), col_mean, 0.0))
            forest = ExtraTreesRegressor(
                n_estimators=self.n_estimators, random_state=self.random_state, min_samples_leaf=1
            )
            self.forest_ = forest.fit(Z, filled if k > 1 else filled.ravel())
        return self

    def _z(self, X: Any) -> FloatArray:
        check_is_fitted(self, "n_outputs_")
        X = validate_data(self, X, reset=False, dtype=np.float64)
        return np.asarray((X - self.x_mean_) / self.x_scale_, dtype=np.float64)

    def predict(self, X: Any) -> FloatArray:
        Z = self._z(X)
        out = self._predict_z(Z)
        return out.ravel() if self.single_output_ else out

    def _predict_z(self, Z: FloatArray) -> FloatArray:
        absent = ~np.isfinite(self.y_mean_)
        if self.kind == "knn":
            out = _knn(Z, self.train_z_, self.train_y_, self.n_neighbors)
        elif self.kind == "extra_trees":
            out = np.asarray(self.forest_.predict(Z), dtype=np.float64).reshape(Z.shape[0], -1)
        else:
            out = Z @ self.coef_ + self.intercept_
        out[:, absent] = np.nan
        return np.asarray(out, dtype=np.float64)

    def compile(self, columns: Sequence[int] | None = None) -> Callable[[FloatArray], FloatArray]:
        """A function from one raw input row to all outputs (or to ``columns`` of them, in that order),
        for the per-request path (no validation)."""
        check_is_fitted(self, "n_outputs_")
        mean, scale = self.x_mean_.copy(), self.x_scale_.copy()
        cols = np.arange(self.n_outputs_) if columns is None else np.asarray(columns, dtype=np.int64)
        if self.kind in ("ridge", "mean"):
            coef, icpt = self.coef_[:, cols].copy(), self.intercept_[cols].copy()
            return lambda x: _standardize_one(x, mean, scale) @ coef + icpt
        if self.kind == "knn":
            return _knn_one(mean, scale, self.train_z_, self.train_y_[:, cols], self.n_neighbors)
        # the trees' own predict, skipping the forest's per-call validation and joblib dispatch (~50x)
        trees = [est.tree_ for est in self.forest_.estimators_]
        absent = ~np.isfinite(self.y_mean_[cols])

        def forest_predict(x: FloatArray) -> FloatArray:
            z = np.ascontiguousarray(_standardize_one(x, mean, scale)[None, :], dtype=np.float32)
            out = np.mean([t.predict(z)[0, :, 0] for t in trees], axis=0)[cols]
            out[absent] = np.nan
            return np.asarray(out, dtype=np.float64)

        return forest_predict


def _ridge_loo(Z: FloatArray, y: FloatArray, alphas: Sequence[float]) -> tuple[FloatArray, float, float]:
    """Ridge with intercept; the alpha with the lowest exact leave-one-out squared error."""
    m = Z.shape[0]
    zm, ym = Z.mean(axis=0), y.mean()
    Zc, yc = Z - zm, y - ym
    U, s, Vt = np.linalg.svd(Zc, full_matrices=False)
    uy = U.T @ yc
    best: tuple[float, FloatArray, float] | None = None
    for alpha in alphas:
        shrink = s / (s**2 + alpha)
        coef = Vt.T @ (shrink * uy)
        h = (U**2) @ (s**2 / (s**2 + alpha)) + 1.0 / m
        resid = yc - Zc @ coef
        loo = resid / np.maximum(1.0 - h, 1e-6)
        err = float(np.mean(loo**2))
        if best is None or err < best[0] - 1e-15:
            best = (err, coef, float(alpha))
    assert best is not None
    _, coef, alpha = best
    return coef, float(ym - zm @ coef), alpha


def _knn(Zq: FloatArray, Zt: FloatArray, Yt: FloatArray, k: int) -> FloatArray:
    d2 = ((Zq[:, None, :] - Zt[None, :, :]) ** 2).sum(axis=2)  # (q, n)
    order = np.argsort(d2, axis=1, kind="stable")
    finite = np.isfinite(Yt)  # (n, K)
    fs = finite[order]  # (q, n, K)
    ys = np.where(finite, Yt, 0.0)[order]
    ds = np.take_along_axis(d2, order, axis=1)[:, :, None]
    take = fs & (np.cumsum(fs, axis=1) <= max(k, 1))
    w = take * _inverse_square_weights(ds)
    wsum = w.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (w * ys).sum(axis=1) / wsum
    out[wsum == 0] = np.nan
    return np.asarray(out, dtype=np.float64)


def _knn_one(
    mean: FloatArray, scale: FloatArray, Zt: FloatArray, Yt: FloatArray, k: int
) -> Callable[[FloatArray], FloatArray]:
    """:func:`_knn` for one query row, ~10x faster: one sort shared by every output, one weighted sum for
    the outputs with no holes, and for the outputs with holes one masked weighted sum over the sorted rows
    (each column's nearest ``k`` finite rows), not a loop over the columns.

    The per-request path calls it up to 30 times per workload description (the e2e fixed point), so the
    generic (q, n, K) version's 100 µs was most of a recommendation (docs/design.md, service speed)."""
    kk = max(k, 1)
    finite = np.isfinite(Yt)
    dense = finite.all(axis=0)
    y_dense = Yt[:, dense]
    hole_cols = np.flatnonzero(~dense)
    hole_ok = finite[:, hole_cols]
    hole_y = np.where(hole_ok, Yt[:, hole_cols], 0.0)
    Zt, mean, scale = Zt.copy(), mean.copy(), scale.copy()

    def predict(x: FloatArray) -> FloatArray:
        d2 = np.minimum(np.add.reduce((_standardize_one(x, mean, scale) - Zt) ** 2, axis=1), MAX_D2)
        order = d2.argsort(kind="stable")
        out = np.empty(Yt.shape[1])
        w_sorted = _inverse_square_weights(d2[order])
        out[dense] = (w_sorted[:kk] @ y_dense[order[:kk]]) / np.add.reduce(w_sorted[:kk])
        if hole_cols.size:
            ok = hole_ok[order]  # (n, holes): which sorted rows measured each column
            w = np.where(ok & (ok.cumsum(axis=0) <= kk), w_sorted[:, None], 0.0)
            wsum = np.add.reduce(w, axis=0)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[hole_cols] = np.where(wsum > 0, np.add.reduce(w * hole_y[order], axis=0) / wsum, np.nan)
        return out

    return predict


__all__ = ["REGRESSOR_KINDS", "ColumnwiseRegressor", "RegressorKind"]
