"""Selector inputs: which observed features (and shape fields) a model uses, and how they become numbers.

Inputs are the *observed* traffic features of :class:`~graphmode.core.records.ObservedFeatures`,
computed by :mod:`graphmode.profiling.features` in the profiler and live alike, never the grid's nominal
knobs. Rates, token counts and batch sizes enter as ``log1p`` (latency scales multiplicatively with
them); coefficients of variation enter as they are. When a dataset holds several model shapes, the
shape fields of the fingerprint (parameters, layers, hidden size: ``log``; architecture: one-hot when
there are several) join them, so one model can tell a 1B from an 8B model. The deployment configuration
(:mod:`graphmode.core.deployment`) is part of a shape: rows of two configurations are two shapes for
aggregation (their own units, start-up constants and race verdicts), and its elements join the shape
fields (active parameters, TP, speculative k, max_num_seqs as numbers; backend, quantization and
speculative method one-hot) so the k-NN and the regressors see how far a configuration is from another.

A :class:`FeatureSpec` is fitted on the training units and saved in the model card. It records the
columns kept, the ones dropped (all-null, or constant across the training data) and why, the training
median used for a missing value, and the training range and spacing used to say how far an input is
from what was profiled. :meth:`FeatureSpec.vectorize` is the per-request path: plain Python and one
small numpy array, no DataFrame.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:  # numpy is imported where it is used: the model card (JSON) needs FeatureSpec, not numpy
    import numpy as np
    from numpy.typing import NDArray

    FloatArray = NDArray[np.float64]

Transform = Literal["log1p", "log", "none"]
Source = Literal["obs", "shape", "arch", "cat"]

# The traffic features a model may use, with their transform. Order is the column order.
OBS_FEATURES: tuple[tuple[str, Transform], ...] = (
    ("arrival_rate", "log1p"),
    ("prefill_decode_ratio", "log1p"),
    ("mean_input_tokens", "log1p"),
    ("mean_output_tokens", "log1p"),
    ("batch_mean", "log1p"),
    ("batch_cv", "none"),
    ("concurrency_mean", "log1p"),
)
# Model-shape fields from the fingerprint (row columns fp_*), used only when the data has several shapes.
SHAPE_FEATURES: tuple[tuple[str, Transform], ...] = (
    ("num_params_b", "log"),
    ("num_layers", "log"),
    ("hidden_size", "log"),
)
ARCH_FIELD = "model_architecture"
# Deployment configuration (graphmode.core.deployment) as numbers, and as categories one-hot ("cat" columns,
# e.g. ``attention_backend=FLASHINFER``); like the shape fields, used only when the data has several shapes
# (a configuration is part of a shape's key) and dropped where constant, as they are in data from one
# configuration.
CONFIG_FEATURES: tuple[tuple[str, Transform], ...] = (
    ("num_active_params_b", "log"),
    ("tensor_parallel_size", "log"),
    ("speculative_k", "log1p"),
    ("max_num_seqs", "log"),
)
CONFIG_CATEGORIES: tuple[str, ...] = ("attention_backend", "quantization", "speculative_method")


def transform(value: float | None, how: Transform) -> float:
    """The model-space value of one raw feature; NaN for missing or unusable values."""
    if value is None:
        return math.nan
    v = float(value)
    if not math.isfinite(v):
        return math.nan
    if how == "log1p":
        return math.log1p(max(v, 0.0))
    if how == "log":
        return math.log(v) if v > 0 else math.nan
    return v


class FeatureSpec(BaseModel):
    """The fitted input definition of one model. Everything per column is in transformed space."""

    model_config = ConfigDict(extra="forbid")

    names: list[str]
    sources: list[Source]
    transforms: list[Transform]
    fill: list[float] = Field(description="training median, used for a missing value")
    lo: list[float] = Field(description="training minimum")
    hi: list[float] = Field(description="training maximum")
    center: list[float] = Field(description="training mean, for distances")
    scale: list[float] = Field(description="training standard deviation (1 where 0), for distances")
    dropped: dict[str, str] = Field(default_factory=dict, description="feature -> why it is not used")
    nn_dist_median: float = Field(0.0, description="median distance of a training unit to its nearest other")
    nn_dist_max: float = Field(0.0, description="largest such distance")
    architectures: list[str] = Field(default_factory=list)
    uses_shape: bool = False

    @property
    def n(self) -> int:
        return len(self.names)

    def raw_value(self, i: int, features: Mapping[str, Any], shape: Mapping[str, Any] | None) -> float | None:
        name, source = self.names[i], self.sources[i]
        if source == "obs":
            v = features.get(name)
            return None if v is None else float(v)
        if shape is None:
            return None
        if source == "shape":
            v = shape.get(name)
            if v is None and name == "speculative_k" and _config_known(shape, "speculative"):
                return 0.0  # known: no speculative decoding
            return None if v is None or isinstance(v, bool) or not isinstance(v, int | float) else float(v)
        if source == "cat":
            field, _, value = name.partition("=")
            if not _config_known(shape, "speculative" if field == "speculative_method" else field):
                return None
            return 1.0 if str(shape.get(field)) == value else 0.0
        arch = shape.get(ARCH_FIELD)
        if arch is None:
            return None
        return 1.0 if name == f"arch={arch}" else 0.0

    def vectorize(
        self, features: Mapping[str, Any], shape: Mapping[str, Any] | None = None
    ) -> tuple[FloatArray, list[str]]:
        """One input row (missing values filled with the training median) and the names that were filled."""
        return self.vectorizer(shape)(features)

    def vectorizer(
        self, shape: Mapping[str, Any] | None
    ) -> Callable[[Mapping[str, Any]], tuple[FloatArray, list[str]]]:
        """:meth:`vectorize` for one *shape*: its columns are computed once, a call fills in the traffic
        features only (a workload description vectorizes up to 30 times per answer: the e2e fixed point)."""
        import numpy as np

        base = np.empty(self.n, dtype=np.float64)
        fixed: list[tuple[int, str]] = []  # shape columns filled with the median
        obs: list[tuple[int, str, Transform, float]] = []
        for i in range(self.n):
            if self.sources[i] == "obs":
                obs.append((i, self.names[i], self.transforms[i], self.fill[i]))
                continue
            v = transform(self.raw_value(i, {}, shape), self.transforms[i])
            if math.isnan(v):
                v = self.fill[i]
                fixed.append((i, self.names[i]))
            base[i] = v

        def vectorize(features: Mapping[str, Any]) -> tuple[FloatArray, list[str]]:
            out = base.copy()
            filled = list(fixed)
            for i, name, how, fill in obs:
                raw = features.get(name)
                v = transform(None if raw is None else float(raw), how)
                if math.isnan(v):
                    v = fill
                    filled.append((i, name))
                out[i] = v
            return out, [name for _, name in sorted(filled)] if fixed else [name for _, name in filled]

        return vectorize

    def standardize(self, X: FloatArray) -> FloatArray:
        import numpy as np

        return np.asarray((X - np.asarray(self.center)) / np.asarray(self.scale), dtype=np.float64)

    def distance(self, x: FloatArray, train_std: FloatArray) -> float:
        """Distance of one row to the nearest training unit, in standardized units."""
        if train_std.size == 0 or self.n == 0:
            return 0.0
        z = self.standardize(x[None, :])
        return float((((train_std - z) ** 2).sum(axis=1) ** 0.5).min())

    def out_of_range(self, x: FloatArray, slack: float = 0.1) -> list[str]:
        """Features outside the training range widened by ``slack`` of its width on either side."""
        out = []
        for i, name in enumerate(self.names):
            if self.sources[i] in ("arch", "cat"):
                continue
            width = self.hi[i] - self.lo[i]
            pad = slack * width if width > 0 else 0.05 * max(abs(self.hi[i]), 1.0)
            if x[i] < self.lo[i] - pad or x[i] > self.hi[i] + pad:
                out.append(name)
        return out


def _config_known(shape: Mapping[str, Any], element: str) -> bool:
    unknown = shape.get("deployment_unknown")
    return isinstance(unknown, list) and element not in unknown and (
        element != "attention_backend" or shape.get("attention_backend") is not None)


def shape_of_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The model-shape fields of a dataset row (``fp_*`` columns), unprefixed, with the configuration it was
    measured under (:func:`graphmode.core.deployment.deployment_of_row`: its own columns, else what the row's
    args and log prove)."""
    from graphmode.core.deployment import deployment_of_row

    keys = [n for n, _ in SHAPE_FEATURES] + [ARCH_FIELD, "model_config_hash", "model_type"]
    shape = {k: row.get("fp_" + k) for k in keys}
    deployment = deployment_of_row(row)
    shape.update(deployment.shape_fields(), configuration=deployment.label())  # the card lists it per shape
    return shape


def shape_key(shape: Mapping[str, Any]) -> str:
    """Identity of a model shape under one configuration: its config hash, else its architecture and
    dimensions, then what sets its configuration apart from vLLM's defaults
    (:func:`graphmode.core.deployment.config_suffix`; nothing for a default deployment, so keys of shapes
    trained before configurations were recorded do not change)."""
    from graphmode.core.deployment import config_suffix

    h = shape.get("model_config_hash")
    if h:
        base = str(h)
    else:
        parts = [
            shape.get(ARCH_FIELD),
            shape.get("num_layers"),
            shape.get("hidden_size"),
            shape.get("num_params_b"),
        ]
        base = "|".join("?" if p is None else str(p) for p in parts)
    suffix = config_suffix(shape)
    return f"{base}+{suffix}" if suffix else base


def fit_spec(
    obs_rows: Sequence[Mapping[str, Any]], shapes: Sequence[Mapping[str, Any]]
) -> tuple[FeatureSpec, FloatArray]:
    """Fit the spec on the training units (one observed-feature mapping and one shape each).

    Returns the spec and the units' input matrix (missing values filled). Shape columns are only
    considered when the units span more than one shape.
    """
    import numpy as np

    n = len(obs_rows)
    distinct_shapes = {shape_key(s) for s in shapes}
    candidates: list[tuple[str, Source, Transform]] = [(name, "obs", t) for name, t in OBS_FEATURES]
    archs: list[str] = []
    if len(distinct_shapes) > 1:
        candidates += [(name, "shape", t) for name, t in SHAPE_FEATURES]
        archs = sorted({str(s.get(ARCH_FIELD)) for s in shapes if s.get(ARCH_FIELD)})
        if len(archs) > 1:
            candidates += [(f"arch={a}", "arch", "none") for a in archs]
        candidates += [(name, "shape", t) for name, t in CONFIG_FEATURES]
        for field in CONFIG_CATEGORIES:
            values = sorted({str(s.get(field)) for s in shapes
                             if _config_known(s, "speculative" if field == "speculative_method" else field)})
            if len(values) > 1:
                candidates += [(f"{field}={v}", "cat", "none") for v in values]
    cols: list[FloatArray] = []
    kept: list[tuple[str, Source, Transform]] = []
    dropped: dict[str, str] = {}
    probe = FeatureSpec(names=[], sources=[], transforms=[], fill=[], lo=[], hi=[], center=[], scale=[])
    for name, source, how in candidates:
        probe.names, probe.sources, probe.transforms = [name], [source], [how]
        col = np.array([transform(probe.raw_value(0, obs_rows[j], shapes[j]), how) for j in range(n)])
        finite = col[np.isfinite(col)]
        if finite.size == 0:
            dropped[name] = "null in every training row"
            continue
        if finite.size > 1 and float(finite.max() - finite.min()) <= 1e-12 * max(
            1.0, abs(float(finite.max()))
        ):
            dropped[name] = "constant across the training data"
            continue
        if finite.size == 1 and n > 1:
            dropped[name] = "known for only one training unit"
            continue
        cols.append(col)
        kept.append((name, source, how))
    X = np.column_stack(cols) if kept else np.zeros((n, 0))
    fill = [float(np.nanmedian(X[:, i])) for i in range(X.shape[1])]
    for i in range(X.shape[1]):
        X[~np.isfinite(X[:, i]), i] = fill[i]
    center = X.mean(axis=0) if n else np.zeros(X.shape[1])
    scale = X.std(axis=0) if n else np.ones(X.shape[1])
    scale = np.where(scale > 0, scale, 1.0)
    spec = FeatureSpec(
        names=[k[0] for k in kept],
        sources=[k[1] for k in kept],
        transforms=[k[2] for k in kept],
        fill=fill,
        lo=[float(v) for v in X.min(axis=0)] if n else [],
        hi=[float(v) for v in X.max(axis=0)] if n else [],
        center=[float(v) for v in center],
        scale=[float(v) for v in scale],
        dropped=dropped,
        architectures=archs,
        uses_shape=any(k[1] != "obs" for k in kept),
    )
    Z = spec.standardize(X)
    if n >= 2 and Z.shape[1]:
        d = np.sqrt(((Z[:, None, :] - Z[None, :, :]) ** 2).sum(axis=2))
        np.fill_diagonal(d, np.inf)
        nn = d.min(axis=1)
        spec.nn_dist_median = float(np.median(nn))
        spec.nn_dist_max = float(nn.max())
    return spec, X
