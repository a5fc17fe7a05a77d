"""The model card: everything about a trained selector model that is not an estimator, as JSON.

It sits beside the artifact (``card.json`` next to ``model.skops``) and says what the model is valid for
(fingerprints, shapes), what it was trained on (row-content hash, counts, workloads, modes), with what
(library versions, estimator kinds and the numbers that chose them), how good it is (leave-one-workload-out
results), what the metrics and the default objective mean, and the sha256 every artifact must have
before it is loaded.
"""

from __future__ import annotations

import functools
import hashlib
import platform
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from graphmode.core.errors import DatasetError, ModelError
from graphmode.core.records import Fingerprint
from graphmode.selector.featurize import FeatureSpec
from graphmode.selector.noise import RaceNoise
from graphmode.selector.objective import Objective
from graphmode.selector.paired import PairedVerdict
from graphmode.selector.specdecode import SpecDecodeMeasured
from graphmode.selector.verdicts import RaceVerdict

CARD_FILE = "card.json"
ARTIFACT_FILE = "model.skops"
CV_FILE = "cv.json"
CARD_SCHEMA_VERSION = 1


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LibraryVersions(_Card):
    python: str
    graphmode: str
    numpy: str
    scikit_learn: str
    skops: str
    pydantic: str

    @classmethod
    def current(cls) -> LibraryVersions:
        def v(dist: str) -> str:
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                return "unknown"

        return cls(
            python=platform.python_version(),
            graphmode=v("graphmode"),
            numpy=v("numpy"),
            scikit_learn=v("scikit-learn"),
            skops=v("skops"),
            pydantic=v("pydantic"),
        )


class ArtifactInfo(_Card):
    file: str
    sha256: str
    bytes: int
    trusted_types: list[str] = Field(
        description="non-default types the artifact holds; all must be allow-listed"
    )


class DatasetSource(_Card):
    path: str = Field(description="the dataset file, relative to the model folder (absolute if elsewhere)")
    sha256: str
    bytes: int

    def resolve(self, folder: Path) -> Path:
        """The file, checked against its sha256 (the model folder keeps no copy of its data)."""
        path = (folder / self.path).resolve()
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise DatasetError(f"model dataset {path} is not readable: {exc.strerror or exc}") from None
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise DatasetError(f"model dataset {path} changed since the model was trained (sha256 differs)")
        return path


class DatasetInfo(_Card):
    sources: list[DatasetSource] = Field(description="the dataset files trained on, merged in this order")
    capture_sources: list[DatasetSource] = Field(
        default_factory=list,
        description="datasets read only for capture costs (lone engine starts of several capture lists, the "
                    "capture chain's), not trained on",
    )
    rows_sha256: str = Field(
        description="sha256 of the ok rows used, in id order (see aggregate.rows_sha256)"
    )
    rows_used: int
    rows_total: int
    n_workloads: int
    workloads: list[str]
    modes: list[str]
    repeats_min: int
    repeats_max: int
    synthetic: bool = False

    def cost_sources(self) -> list[DatasetSource]:
        """Every dataset whose engine starts feed the capture cost model: the training data, then the rest."""
        return [*self.sources, *self.capture_sources]


class MetricInfo(_Card):
    name: str
    direction: Literal["min", "max"]
    unit: str
    kind: Literal["workload", "constant"]
    description: str
    noise_cv: float
    noise_source: str
    measured_cells: int


class CandidateSummary(_Card):
    kind: str
    mean_regret_pct: float | None
    median_regret_pct: float | None
    max_regret_pct: float | None
    correct_pct: float | None = Field(
        None, description="held-out workloads where the choice is the oracle or tied"
    )
    mean_log_rmse: float | None = Field(None, description="regressors: mean over metrics of log-space RMSE")
    log_rmse: dict[str, float] = Field(default_factory=dict)
    predict_us: float | None = Field(
        None, description="one-row latency of the compiled predictor, microseconds"
    )


class CVSummary(_Card):
    objective: str
    n: int
    mean_regret_pct: float | None
    median_regret_pct: float | None
    max_regret_pct: float | None
    correct_pct: float | None
    mean_gain_vs_default_pct: float | None
    mean_gain_vs_static_pct: float | None
    static_mode: str | None
    default_regret_pct: float | None = Field(None, description="mean regret of always running vLLM's default")
    static_regret_pct: float | None = Field(None, description="mean regret of the best single static mode")


class WorkloadResult(_Card):
    objective: str
    workload: str
    shape: str
    oracle: str
    ties: list[str]
    chosen: str | None
    regret_pct: float | None
    gain_vs_default_pct: float | None
    gain_vs_static_pct: float | None
    chosen_value: float | None
    oracle_value: float | None
    default_value: float | None
    static_value: float | None
    correct: bool | None


class CVReport(_Card):
    scheme: str = "leave-one-workload-out"
    folds: int
    skipped: str | None = None
    regressor_candidates: list[CandidateSummary] = Field(default_factory=list)
    chosen_regressor: str
    reason: str = ""
    summaries: list[CVSummary] = Field(default_factory=list, description="chosen regressor, per objective")
    workloads: list[WorkloadResult] = Field(default_factory=list)
    shape_cv: list[CVSummary] = Field(
        default_factory=list, description="leave-one-shape-out, with several shapes"
    )


class DescribeCheck(_Card):
    feature: str
    calibration: float = Field(
        description="factor applied to the described value (median observed/described)"
    )
    median_abs_log_err_raw: float | None
    median_abs_log_err_calibrated: float | None
    n: int


class ModelCard(_Card):
    schema_version: int = CARD_SCHEMA_VERSION
    model_id: str
    created_at: str
    synthetic: bool = False
    gpu_name: str | None
    vllm_version: str | None
    fingerprints: list[Fingerprint]
    fingerprint_keys: list[str]
    shapes: list[dict[str, Any]]
    dataset: DatasetInfo
    versions: LibraryVersions
    features: FeatureSpec
    modes: list[str]
    default_mode: str
    workload_metrics: list[str]
    constant_metrics: list[str]
    target_transform: dict[str, str] = Field(default_factory=lambda: {"workload": "log", "constant": "log1p"})
    metrics: dict[str, MetricInfo]
    default_objective: Objective
    evaluated_objectives: list[Objective]
    regressor_kind: str
    cv: CVReport
    describe: list[DescribeCheck] = Field(default_factory=list)
    paired: list[PairedVerdict] = Field(
        default_factory=list, description="each mode against the default inside rounds on one GPU, per shape"
    )
    race: list[RaceVerdict] = Field(
        default_factory=list, description="race verdicts per shape, mode and metric (selector.verdicts)"
    )
    race_noise: list[RaceNoise] = Field(
        default_factory=list, description="what a restart alone and the clock alone moved latency by, per shape "
                                          "and metric, from the race rows (selector.noise)"
    )
    shape_modes: dict[str, list[str]] = Field(
        default_factory=dict, description="shape key -> the modes measured on it (a configuration race leaves "
                                          "modes out); a prediction for another mode there borrows other shapes"
    )
    shape_spec_decode: dict[str, SpecDecodeMeasured] = Field(
        default_factory=dict, description="shape key -> the drafts accepted in its speculative-decoding cells"
    )
    artifacts: dict[str, ArtifactInfo]
    notes: list[str] = Field(default_factory=list)

    def save(self, folder: Path) -> Path:
        path = folder / CARD_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, folder: Path) -> ModelCard:
        path = folder / CARD_FILE
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ModelError(f"no readable model card at {path}: {exc.strerror or exc}") from exc
        try:
            card = cls.model_validate_json(text)
        except ValidationError as exc:
            raise ModelError(
                f"model card {path} is not valid: {exc.error_count()} problems, first: "
                f"{exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"
            ) from None
        if card.schema_version != CARD_SCHEMA_VERSION:
            raise ModelError(
                f"model card {path} has schema {card.schema_version}; this graphmode reads "
                f"{CARD_SCHEMA_VERSION}: retrain"
            )
        return card


def cost_paths(folder: Path) -> tuple[Path, ...]:
    """The datasets a model folder's card names for costs and step sizes, resolved (sha256-checked) once per
    version of its card: the service asks for them on every described request."""
    card = folder / "card.json"
    st = card.stat()
    return _cost_paths(str(folder), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=16)
def _cost_paths(folder: str, _mtime_ns: int, _size: int) -> tuple[Path, ...]:
    return tuple(src.resolve(Path(folder)) for src in ModelCard.load(Path(folder)).dataset.cost_sources())
