"""The graph-memory fit's non-negative least squares is numpy only and matches scipy's."""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

from graphmode.selector.capture_costs import _nnls


def test_small_nnls_reaches_scipys_optimum() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        x, y = rng.normal(size=(7, 3)), rng.normal(size=7)
        ours, ref = _nnls(x, y), nnls(x, y)[0]
        assert (ours >= 0).all()
        assert np.isclose(np.sum((y - x @ ours) ** 2), np.sum((y - x @ ref) ** 2), atol=1e-9)


def test_an_exact_nonnegative_fit_is_recovered() -> None:
    x = np.column_stack([np.ones(5), np.arange(5.0), np.arange(5.0) ** 2])
    assert np.allclose(_nnls(x, x @ np.array([0.2, 0.0, 1.5])), [0.2, 0.0, 1.5])
