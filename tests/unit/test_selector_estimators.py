"""Estimator contracts (scikit-learn's check_estimator), NaN-holed targets, and the compiled fast paths."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.utils.estimator_checks import check_estimator

from graphmode.selector.estimators import REGRESSOR_KINDS, ColumnwiseRegressor


@pytest.mark.parametrize("kind", ["ridge", "knn", "extra_trees"])
def test_check_estimator(kind: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(ColumnwiseRegressor(kind=kind, n_estimators=10), on_fail=None)  # type: ignore[arg-type]
    failed = [(r["check_name"], str(r["exception"])[:300]) for r in results if r["status"] == "failed"]
    assert not failed


def test_init_stores_params_and_learned_state_ends_in_underscore() -> None:
    params = {
        "kind": "knn",
        "alphas": (0.1, 1.0),
        "n_neighbors": 2,
        "n_estimators": 7,
        "random_state": 3,
        "allow_nan_targets": True,
    }
    est = ColumnwiseRegressor(**params)  # type: ignore[arg-type]
    assert est.get_params() == params
    assert set(inspect.signature(ColumnwiseRegressor.__init__).parameters) - {"self"} == set(params)
    before = set(vars(est))
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(12, 3)), rng.normal(size=(12, 2))
    assert est.fit(X, y) is est
    learned = set(vars(est)) - before
    assert learned and all(name.endswith("_") and not name.startswith("_") for name in learned)
    assert est.get_params() == params  # fit changed no parameter
    assert clone(est).get_params() == params


def test_fit_validates_inputs() -> None:
    est = ColumnwiseRegressor()
    with pytest.raises(ValueError, match="requires y"):
        est.fit(np.zeros((3, 2)), None)
    with pytest.raises(ValueError):
        est.fit(np.array([[1.0, np.nan]]), np.array([1.0]))
    with pytest.raises(ValueError, match="NaN"):
        est.fit(np.ones((3, 2)), np.array([1.0, np.nan, 2.0]))
    with pytest.raises(ValueError, match="rows"):
        est.fit(np.ones((3, 2)), np.ones(4))
    with pytest.raises(ValueError, match="kind"):
        ColumnwiseRegressor(kind="magic").fit(np.ones((3, 1)), np.ones(3))  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", REGRESSOR_KINDS)
def test_nan_holes_and_compiled_predictor(kind: str) -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(25, 4))
    Y = np.column_stack([X @ rng.normal(size=4) for _ in range(3)])
    Y[[2, 5], 0] = np.nan  # a mode that failed on two workloads
    Y[:, 2] = np.nan  # a metric never measured
    est = ColumnwiseRegressor(kind=kind, allow_nan_targets=True, n_estimators=20).fit(X, Y)
    pred = est.predict(X)
    assert pred.shape == (25, 3)
    assert np.isfinite(pred[:, :2]).all() and np.isnan(pred[:, 2]).all()
    assert est.n_fit_.tolist() == [23, 25, 0]
    f = est.compile()
    np.testing.assert_allclose(np.array([f(x) for x in X[:5]]), pred[:5], equal_nan=True, rtol=1e-9)
    # a subset of the outputs, in the order asked (the per-request e2e fixed point asks for a few)
    g = est.compile([2, 0])
    q = X[7] + 0.1  # off the training rows, so the k-NN weights are not one row's
    np.testing.assert_allclose(g(q), f(q)[[2, 0]], equal_nan=True, rtol=1e-9)
    if kind == "ridge":  # a linear signal is recovered
        assert np.corrcoef(pred[:, 1], Y[:, 1])[0, 1] > 0.99


def test_single_output_predicts_1d() -> None:
    X = np.arange(10.0).reshape(-1, 1)
    est = ColumnwiseRegressor().fit(X, 2 * X.ravel() + 1)
    assert est.predict(X).shape == (10,)
    np.testing.assert_allclose(est.predict(X), 2 * X.ravel() + 1, rtol=0.05)


def test_compiled_knn_matches_the_generic_one_on_scattered_holes() -> None:
    """The one-row k-NN picks, per output with holes, its own nearest finite rows (vectorized over the outputs):
    the same numbers as the generic (q, n, K) version, for columns with many, few (< k) and no finite rows."""
    rng = np.random.default_rng(7)
    X = rng.normal(size=(40, 5))
    Y = rng.normal(size=(40, 12))
    Y[rng.random(Y.shape) < 0.4] = np.nan  # scattered holes in most columns
    Y[:, 0] = rng.normal(size=40)  # a dense column
    Y[:, 5] = np.nan
    Y[3, 5] = 1.5  # one finite row: fewer than k
    Y[:, 6] = np.nan
    Y[[4, 9], 6] = [2.0, -1.0]  # two finite rows
    Y[:, 7] = np.nan  # none
    est = ColumnwiseRegressor(kind="knn", n_neighbors=3, allow_nan_targets=True).fit(X, Y)
    f = est.compile()
    queries = rng.normal(size=(30, 5)) * 2.0
    np.testing.assert_allclose(np.array([f(q) for q in queries]), est.predict(queries), equal_nan=True,
                               rtol=1e-12)
    assert np.isnan(f(queries[0])[7]) and f(queries[0])[5] == pytest.approx(1.5)
    big = np.full(5, 1e200)  # far out: every squared distance saturates, the weights stay finite
    assert np.isfinite(f(big)[[0, 5, 6]]).all()
