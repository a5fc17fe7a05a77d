"""Request and response bodies of the v1 HTTP API.

Requests are strict: unknown fields, NaN/±inf, numbers given as strings or booleans, out-of-range
features, negative rates and lengths, unknown metrics, modes or constraint syntax are rejected with 422
and the path of the offending field (FastAPI's ``{"detail": [{"loc": [...], "msg": ..., "type": ...}]}``).
Responses have their own classes:
:class:`RecommendResponse` is the selector's :class:`~graphmode.selector.recommend.Recommendation`
(``mode`` and ``compilation_config`` at the top level, which ``graphmode launch --selector-url`` reads).
"""

from __future__ import annotations

import shlex
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from graphmode.core.errors import ConfigError, ObjectiveError
from graphmode.core.fingerprint import shape_of_config
from graphmode.core.modes import CudaGraphMode, parse_mode

# the scraped features' rules (core.records, no profile extra needed): one place for both paths
from graphmode.core.records import FEATURE_MAX, FEATURE_MAX_BY_NAME, ObservedFeatures, StepSizes, feature_range_error  # noqa: F401 (API)
from graphmode.profiling.grid import Grid
from graphmode.selector.capture import CaptureBudget
from graphmode.selector.card import ModelCard
from graphmode.selector.describe import WorkloadDescription
from graphmode.selector.live import metrics_url
from graphmode.selector.objective import (
    ALIASES,
    METRICS,
    Constraint,
    Objective,
    make_objective,
    resolve_metric,
)
from graphmode.selector.recommend import Recommendation
from graphmode.selector.registry import FingerprintMatch

MODEL_ID_PATTERN = r"^[A-Za-z0-9_.\-+]+$"
MAX_WINDOW_S = 300.0
MAX_CONSTRAINTS = 16
# Features that say something about the traffic (window_s / n_samples alone do not, nor the API server's CPU,
# which only adds a note, nor speculative decoding's acceptance, which the profiles record but no model reads).
TRAFFIC_FEATURES = tuple(
    n for n in ObservedFeatures.model_fields
    if n not in ("window_s", "n_samples", "frontend_cpu_cores", "spec_acceptance_rate", "spec_accept_length"))


class _Strict(BaseModel):
    # strict: "8" and true are not numbers (pydantic would coerce them otherwise)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


# ---------------------------------------------------------------------------------------------- inputs
class FeaturesIn(ObservedFeatures):
    """Observed features of a server's traffic (as ``graphmode.profiling.features`` computes them).

    Every field is optional (a missing one is imputed with the training median and the answer says so);
    every given value must be a finite number in [0, :data:`FEATURE_MAX`] (KV-cache usage: [0, 100]),
    and at least one traffic feature must be given.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True, title="Features")

    @field_validator("*")
    @classmethod
    def _in_range(cls, v: Any, info: ValidationInfo) -> Any:
        # the rules scraped features are held to (graphmode.profiling.features)
        why = feature_range_error(info.field_name or "", v) if isinstance(v, int | float) else None
        if why is not None:
            raise ValueError(why)
        return v

    @model_validator(mode="after")
    def _some_traffic(self) -> FeaturesIn:
        if all(getattr(self, n) is None for n in TRAFFIC_FEATURES):
            raise ValueError(
                "features: give at least one traffic feature (e.g. arrival_rate, mean_input_tokens, "
                "mean_output_tokens, batch_mean)"
            )
        return self


class WorkloadIn(WorkloadDescription):
    """Traffic as a person would describe it: rate, burstiness, mean token lengths, concurrency cap."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True, title="Workload")


def _check_constraint(text: str) -> str:
    try:
        Constraint.parse(text)
    except ObjectiveError as exc:
        raise ValueError(str(exc)) from None
    return text


ConstraintText = Annotated[
    str,
    Field(max_length=200, examples=["ttft_p99<=200ms", "graph_gib<=512MiB"]),
    AfterValidator(_check_constraint),
]


def known_metrics() -> list[str]:
    """Every metric name (and alias) an objective or a constraint accepts."""
    return [*METRICS, *ALIASES]


class ObjectiveIn(_Strict):
    """What "best" means: a metric to optimise, constraints, and weights on graph memory and start-up."""

    metric: str | None = Field(
        None,
        max_length=64,
        description="metric to optimise (default: the model's default objective's metric); "
        "one of " + ", ".join(known_metrics()),
        examples=["itl_p50", "ttft_p99", "throughput"],
    )
    constraints: list[ConstraintText] = Field(
        default_factory=list, max_length=MAX_CONSTRAINTS, description="'METRIC OP VALUE[UNIT]' each"
    )
    memory_weight: float = Field(0.0, ge=0, le=1e6, description="relative cost of one GiB of graph memory")
    startup_weight: float = Field(0.0, ge=0, le=1e6, description="relative cost of one second of start-up")
    max_graph_gib: float | None = Field(None, gt=0, description="constraint: graph memory <= this, GiB")
    max_startup_s: float | None = Field(None, gt=0, description="constraint: start-up <= this, seconds")
    prefer_default_on_tie: bool = Field(True, description="keep vLLM's default when it is within noise")

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, v: str | None) -> str | None:
        if v is None:
            return None
        try:
            return resolve_metric(v)
        except ObjectiveError as exc:
            raise ValueError(str(exc)) from None

    def is_default(self) -> bool:
        """True when nothing is set: the model's own default objective applies."""
        return not self.model_fields_set - {"prefer_default_on_tie"} and self.prefer_default_on_tie

    def build(self, default_metric: str) -> Objective:
        """The :class:`Objective`; raises :class:`ObjectiveError` (every part was validated already)."""
        return make_objective(
            self.metric or default_metric,
            self.constraints,
            memory_weight=self.memory_weight,
            startup_weight=self.startup_weight,
            max_graph_gib=self.max_graph_gib,
            max_startup_s=self.max_startup_s,
            prefer_default_on_tie=self.prefer_default_on_tie,
        )

    def cache_key(self) -> tuple[Any, ...]:
        return (
            self.metric,
            tuple(self.constraints),
            self.memory_weight,
            self.startup_weight,
            self.max_graph_gib,
            self.max_startup_s,
            self.prefer_default_on_tie,
        )


def _check_server_url(v: str | None) -> str | None:
    if v is None:
        return None
    try:
        metrics_url(v)  # scheme://host[:port][/metrics] only: the service fetches nothing else
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return v.strip()


_Count = Annotated[int, Field(ge=0, le=10_000_000)]


class ServedModelConfig(BaseModel):
    """A served model's config.json. The keys graphmode reads (architecture, layer and width counts,
    heads, experts) are typed and bounded; other keys are kept as given (they enter the config's hash)."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False, title="ServedModelConfig")

    architectures: list[Annotated[str, Field(max_length=200)]] | None = Field(None, max_length=16)
    model_type: str | None = Field(None, max_length=200)
    num_hidden_layers: _Count | None = None
    n_layer: _Count | None = None
    num_layers: _Count | None = None
    hidden_size: _Count | None = None
    n_embd: _Count | None = None
    d_model: _Count | None = None
    vocab_size: _Count | None = None
    num_attention_heads: _Count | None = None
    n_head: _Count | None = None
    num_key_value_heads: _Count | None = None
    head_dim: _Count | None = None
    intermediate_size: _Count | None = None
    n_inner: _Count | None = None
    num_local_experts: _Count | None = None
    num_experts: _Count | None = None
    n_routed_experts: _Count | None = None
    moe_intermediate_size: _Count | None = None
    shared_expert_intermediate_size: _Count | None = None
    n_shared_experts: _Count | None = None
    tie_word_embeddings: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        """The config as the caller gave it (unset keys left out, extra keys kept)."""
        return self.model_dump(mode="json", exclude_unset=True)


class RecommendRequest(_Strict):
    """Exactly one input (``features``, ``workload`` or ``server_url``) and an optional objective."""

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "workload": {"rate": 8, "burstiness": 1.0, "input_tokens": 512, "output_tokens": 128},
                    "objective": {"metric": "itl_p50", "constraints": ["ttft_p99<=200ms"]},
                },
                {"features": {"arrival_rate": 8, "mean_input_tokens": 512, "mean_output_tokens": 128}},
                {"server_url": "http://127.0.0.1:8000", "window_s": 30},
            ]
        },
    )

    features: FeaturesIn | None = Field(None, description="observed features (ObservedFeatures fields)")
    workload: WorkloadIn | None = Field(None, description="a workload description")
    server_url: Annotated[str | None, AfterValidator(_check_server_url)] = Field(
        None,
        max_length=2048,
        description="a live vLLM server: the service scrapes its /metrics for window_s seconds",
    )
    window_s: float = Field(
        30.0,
        gt=0,
        le=MAX_WINDOW_S,
        description="server_url only: seconds to scrape; above settings.service.open_max_window_s (5 s) "
        "only with the bearer token",
    )
    interval_s: float = Field(1.0, gt=0, le=60, description="server_url only: seconds between scrapes")
    objective: ObjectiveIn | None = None
    model_id: str | None = Field(
        None, max_length=200, pattern=MODEL_ID_PATTERN, description="a loaded model (default: the service's)"
    )
    served_model_config: ServedModelConfig | None = Field(
        None,
        description="config.json of the model the deployment serves, as an object: its architecture, "
        "layers, hidden size and parameter count pick the shape to predict for (default: the service's "
        "target shape). A shape unlike any the model was trained on is answered with a warning.",
    )

    vllm_version: str | None = Field(
        None, max_length=64, pattern=r"^[0-9A-Za-z.+_-]+$",
        description="the deployment's vLLM release (e.g. 0.33.0): without model_id, the loaded model trained on "
        "that release answers (as a server_url's GET /version picks it; that wins when both are given)",
    )

    # Optional: the whole graph configuration (selector.graphconfig). Without them the answer has no capture block.
    step_sizes: StepSizes | None = Field(None, description="tokens per engine step (StepSizes): asks for capture sizes")
    vllm_args: list[str] | None = Field(
        None, max_length=200, description="the deployment's vLLM args: modes vLLM would downgrade are not "
        "recommended, and its configuration (TP size, attention backend, quantization, speculative decoding, "
        "max_num_seqs) is compared with the trained ones: an unlike one is answered with a warning"
    )
    capture_budget: CaptureBudget | None = Field(
        None, description="limits on graph count, capture s, graph GiB; given ({} for none), a workload "
        "description's capture list is predicted from the model's profiled cells")

    @field_validator("served_model_config")
    @classmethod
    def _a_model_config(cls, v: ServedModelConfig | None) -> ServedModelConfig | None:
        if v is None:
            return v
        shape = shape_of_config(v.as_dict())
        if not (shape["model_architecture"] or shape["num_layers"] or shape["hidden_size"]):
            raise ValueError("no architectures, num_hidden_layers or hidden_size: not a model's config.json")
        return v

    @field_validator("vllm_args")
    @classmethod
    def _readable_configuration(cls, v: list[str] | None) -> list[str] | None:
        from graphmode.core.deployment import DeploymentConfig, DeploymentError

        if v is not None:
            try:
                DeploymentConfig.from_vllm_args(v)
            except DeploymentError as exc:
                raise ValueError(str(exc)) from None
        return v

    def deployment(self) -> Any:
        """The :class:`~graphmode.core.deployment.DeploymentConfig` of ``vllm_args`` (+ served_model_config),
        None without vllm_args. The service's own environment is not the deployment's: it is not read."""
        from graphmode.core.deployment import DeploymentConfig

        if self.vllm_args is None:
            return None
        served = self.served_model_config.as_dict() if self.served_model_config is not None else None
        return DeploymentConfig.from_vllm_args(self.vllm_args, {}, served)

    def served_shape(self) -> dict[str, Any] | None:
        """Shape fields of ``served_model_config`` (None when the request gave none)."""
        return None if self.served_model_config is None else shape_of_config(self.served_model_config.as_dict())

    @model_validator(mode="after")
    def _exactly_one_input(self) -> RecommendRequest:
        given = [n for n in ("features", "workload", "server_url") if getattr(self, n) is not None]
        if len(given) != 1:
            got = ", ".join(given) if given else "none"
            raise ValueError(f"give exactly one of features, workload, server_url (got: {got})")
        if self.server_url is None:
            extra = sorted({"window_s", "interval_s"} & self.model_fields_set)
            if extra:
                raise ValueError(f"{' and '.join(extra)}: only with server_url")
        elif self.interval_s > self.window_s:
            raise ValueError("interval_s must not exceed window_s")
        return self


# ---------------------------------------------------------------------------------------------- outputs
class RecommendResponse(Recommendation):
    """The answer: the mode, the ``--compilation-config`` JSON, per-mode predictions, gain vs vLLM's
    default, confidence, the model that answered (id, fingerprint match) and warnings.

    It adds no field to :class:`~graphmode.selector.recommend.Recommendation` (the endpoint serializes the
    selector's object directly); ``mode`` and ``compilation_config`` stay at the top level.
    """

    model_config = ConfigDict(extra="forbid", title="RecommendResponse")


class ModelSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_id: str
    loaded: bool = Field(description="in memory and able to answer")
    default: bool = Field(description="answers requests that name no model_id")
    error: str | None = Field(None, description="why the model could not be loaded")
    synthetic: bool | None = None
    created_at: str | None = None
    gpu_name: str | None = None
    vllm_version: str | None = None
    architectures: list[str] = Field(default_factory=list)
    rows_used: int | None = None
    n_workloads: int | None = None
    modes: list[str] = Field(default_factory=list)
    default_objective: str | None = None
    regressor_kind: str | None = None
    cv_mean_regret_pct: float | None = None
    cv_mean_gain_vs_default_pct: float | None = None
    match: FingerprintMatch | None = Field(None, description="how the model fits the service's target")

    @classmethod
    def of(
        cls,
        model_id: str,
        card: ModelCard | None,
        *,
        loaded: bool,
        default: bool,
        match: FingerprintMatch | None = None,
        error: str | None = None,
    ) -> ModelSummary:
        if card is None:
            return cls(model_id=model_id, loaded=loaded, default=default, error=error)
        s = card.cv.summaries[0] if card.cv.summaries else None
        return cls(
            model_id=model_id,
            loaded=loaded,
            default=default,
            error=error,
            synthetic=card.synthetic,
            created_at=card.created_at,
            gpu_name=card.gpu_name,
            vllm_version=card.vllm_version,
            architectures=[str(x.get("model_architecture")) for x in card.shapes],
            rows_used=card.dataset.rows_used,
            n_workloads=card.dataset.n_workloads,
            modes=list(card.modes),
            default_objective=card.default_objective.describe(),
            regressor_kind=card.regressor_kind,
            cv_mean_regret_pct=s.mean_regret_pct if s else None,
            cv_mean_gain_vs_default_pct=s.mean_gain_vs_default_pct if s else None,
            match=match,
        )


class ModelList(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models_dir: str
    default_model_id: str | None
    loaded_at: float | None = Field(description="unix time of the last (re)load")
    models: list[ModelSummary]


class Health(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: Literal["ok", "no_models"]
    version: str
    models_loaded: int
    models_broken: int
    default_model_id: str | None
    synthetic_model: bool | None = Field(description="the default model was trained on SYNTHETIC data")
    models_dir: str
    loaded_at: float | None
    uptime_s: float
    job_running: str | None = Field(None, description="id of the running background job, if any")
    load_error: str | None = Field(None, description="why no model is loaded")


class ReloadResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    default_model_id: str | None
    models_loaded: int
    models_broken: int
    previous_default_model_id: str | None
    loaded_at: float
    warnings: list[str] = Field(default_factory=list)


# ---------------------------------------------------------------------------------------------- retrain
def _mode(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return parse_mode(v)
        except ValueError as exc:
            raise ValueError(str(exc)) from None
    return v


ModeIn = Annotated[CudaGraphMode, BeforeValidator(_mode)]
RegressorIn = Literal["auto", "ridge", "knn", "extra_trees", "mean"]


class RetrainRequest(_Strict):
    """Profile (resuming) every mode over a workload grid with a real vLLM, then train and reload.

    Whoever holds the token can make the service run ``vllm_command``: treat the token like shell access.
    """

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "vllm_command": "/opt/vllm/bin/vllm serve",
                    "vllm_args": ["--model", "/models/llama-3.2-1b", "--max-model-len", "4096"],
                    "modes": ["FULL_AND_PIECEWISE", "PIECEWISE", "NONE"],
                    "workloads": ["chat-r8-b1", "decode-heavy-r32-b1"],
                }
            ]
        },
    )

    vllm_command: str | list[str] | None = Field(
        None, description="command prefix that starts vLLM (default: settings.vllm.command)"
    )
    vllm_args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list, max_length=256, description="arguments for vLLM; must name the model"
    )
    grid: Grid | None = Field(None, description="an inline workload grid (default: settings.profile.grid)")
    grid_path: str | None = Field(
        None,
        max_length=255,
        description="a grid file of the registry's grids folder (<models_dir>/grids/NAME.yaml); any other "
        "grid goes inline, as grid",
    )
    workloads: list[Annotated[str, Field(max_length=120)]] | None = Field(
        None, max_length=1000, description="only these workloads of the grid"
    )
    modes: list[ModeIn] | None = Field(None, min_length=1, description="modes to profile (default: all five)")
    repeats: int | None = Field(None, ge=1, le=20, description="override every workload's repeats")
    resume: bool = Field(True, description="skip cells that already have an ok row")
    port: int | None = Field(None, ge=1, le=65535, description="port for the vLLM server")
    objective: ObjectiveIn | None = Field(None, description="the new model's default objective")
    regressor: RegressorIn = "auto"
    reload: bool = Field(True, description="reload the service's models when the job succeeds")

    @model_validator(mode="after")
    def _one_grid(self) -> RetrainRequest:
        if self.grid is not None and self.grid_path is not None:
            raise ValueError("give grid or grid_path, not both")
        return self

    def command(self, default: list[str]) -> list[str]:
        if self.vllm_command is None:
            return default
        if isinstance(self.vllm_command, str):
            return shlex.split(self.vllm_command)
        return list(self.vllm_command)


JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
JobPhase = Literal["queued", "profiling", "training", "reloading", "done"]


class JobProgress(BaseModel):
    model_config = ConfigDict(extra="forbid")

    phase: JobPhase = "queued"
    cells_done: int = 0
    cells_failed: int = 0
    cells_planned: int | None = Field(None, description="cells in the plan (resumed cells are never run)")
    current: str | None = Field(None, description="what the job is doing now")
    messages: list[str] = Field(default_factory=list, description="the latest progress lines")


class ProfileOutcome(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    profile_key: str
    ok: int
    failed: int
    skipped: int
    engine_starts: int
    wall_s: float
    failures: list[str] = Field(default_factory=list)


class JobResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_id: str
    model_dir: str
    dataset: str
    profile: ProfileOutcome | None = None
    cv_mean_regret_pct: float | None = None
    reloaded: bool = False
    reload_error: str | None = None


class JobStatus(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    kind: str = Field(description="retrain")
    status: JobState
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    cancel_requested: bool = False
    progress: JobProgress
    result: JobResult | None = None
    error: str | None = None
    request: dict[str, Any] = Field(default_factory=dict, description="the request, as accepted")


class JobList(BaseModel):
    model_config = ConfigDict(extra="forbid")

    jobs: list[JobStatus]
