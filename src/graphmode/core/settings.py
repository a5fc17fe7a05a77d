"""One settings object for the whole tool: nested groups, env prefix ``GRAPHMODE_``.

``GRAPHMODE_VLLM__COMMAND="/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server"`` sets
``settings.vllm.command``; ``GRAPHMODE_SERVICE__TOKEN`` the service's bearer token, and so on.
"""

from __future__ import annotations

import ipaddress
import shlex
from pathlib import Path

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # src/graphmode
DEFAULT_GRID = PACKAGE_DIR / "data" / "default_grid.yaml"
RACE_GRID = PACKAGE_DIR / "data" / "race_grid.yaml"


BUNDLED_MODELS = PACKAGE_DIR / "bundled_models"  # a wheel's copy of the repository's models/ (setup.py)


def _default_models_dir(package_dir: Path = PACKAGE_DIR, cwd: Path | None = None) -> Path:
    """Where the model registry is when no setting names it.

    A source checkout keeps its models beside the package (``models/``). An installed wheel uses
    ``./models`` where the working directory has one (a user's own registry), else the trained models the
    wheel bundles, so ``graphmode recommend`` answers from any directory right after ``pip install``.
    """
    repo_models = package_dir.parent.parent / "models"
    if repo_models.is_dir():
        return repo_models
    local = (cwd if cwd is not None else Path.cwd()) / "models"
    bundled = package_dir / BUNDLED_MODELS.name
    return local if local.is_dir() or not bundled.is_dir() else bundled


class VllmSettings(BaseModel):
    command: str = Field(
        default="vllm serve",
        description="Command prefix that starts vLLM; model and args follow. Lets vLLM live in its own venv.",
    )
    host: str = Field(default="127.0.0.1", description="Address the profiled vLLM server binds to.")
    port: int = Field(default=8000, ge=1, le=65535, description="Port of the profiled vLLM server.")
    startup_timeout_s: float = Field(
        default=900.0, gt=0, description="How long a vLLM start may take to answer /health before it counts as failed."
    )
    stop_timeout_s: float = Field(
        default=30.0, gt=0, description="Grace between terminate and kill when a vLLM server is stopped."
    )
    connect_timeout_s: float = Field(default=5.0, gt=0, description="Load generator: connect timeout per request.")
    read_timeout_s: float = Field(
        default=300.0, gt=0, description="Load generator: longest silence on a streaming response before it fails."
    )

    def argv(self) -> list[str]:
        return shlex.split(self.command)


class ProfileSettings(BaseModel):
    grid: Path = Field(default=DEFAULT_GRID, description="Workload grid (YAML or TOML) that `profile` runs.")
    dataset: Path = Field(
        default=Path("profile.sqlite"), description="SQLite dataset `profile` appends to (one row per cell)."
    )
    scrape_interval_s: float = Field(
        default=0.5, gt=0, description="How often vLLM's /metrics is scraped during a cell."
    )
    log_dir: Path = Field(
        default=Path("graphmode-logs"), description="Where vLLM's server logs go, one per engine start."
    )
    loadgen_processes: int = Field(
        default=1, ge=1, le=32,
        description="Processes that send a fixed-window cell's load (>1 where one Python process may set the pace: "
                    "hundreds of streams).",
    )


class RaceSettings(BaseModel):
    """``graphmode profile --race`` (graphmode.profiling.race): resident engines measured in paired rounds."""

    grid: Path = Field(default=RACE_GRID, description="The race design: workloads cycled through in rounds.")
    delta: float = Field(default=0.03, gt=0, lt=1, description="margin of worse/better/equivalent, relative")
    confidence: float = Field(default=0.95, ge=0.5, lt=1, description="Two-sided level of the t interval.")
    min_rounds: int = Field(default=3, ge=2, description="Paired rounds before any verdict.")
    budget_min: float = Field(default=10.0, gt=0, description="GPU-minutes, engine starts included")
    max_rounds: int = Field(default=200, ge=1, description="Stop after this many rounds in all.")
    metrics: list[str] = Field(default_factory=lambda: ["itl_p50", "ttft_p50"], description="Metrics decided per mode.")
    cell_s: float = Field(default=3.0, gt=0, le=600, description="measured window of one cell")
    warmup_s: float = Field(default=2.0, ge=0, le=600, description="most warm-up before a cell's window")
    stagger_s: float = Field(default=0.0, ge=0, le=600, description="delay between overlapped engine starts")
    kv_cache_memory_bytes: str | None = Field(default=None, description="vLLM --kv-cache-memory-bytes per engine")
    gpu_memory_utilization: float = Field(
        default=0.05, gt=0, le=1,
        description="replaces --gpu-memory-utilization when a KV share is given (vLLM's start-up free-memory check)",
    )
    idle_probe_s: float = Field(default=0.5, ge=0, description="GPU utilisation sampled with every engine idle")
    starts: int = Field(
        default=2, ge=1, le=10,
        description="engine starts behind every arm's rounds; 'better'/'equivalent' need two (start effect)",
    )
    block_rounds: int = Field(default=2, ge=1, description="rounds per (arm start, default start) before a restart")
    replicas: int = Field(
        default=1, ge=1, le=16,
        description="engines of every arm resident side by side (R starts in one wave, no restarts); starts: 1 or R",
    )
    warm_compile: bool = Field(
        default=True,
        description="start each arm whose compile cache is cold once, unmeasured, before its first round",
    )
    engine_warmup_s: float = Field(
        default=1.5, ge=0, le=60,
        description="after each engine start, every workload runs this long unmeasured (0: none), so the "
                    "kernels vLLM compiles on first use compile before a measured cell",
    )
    start_margin: float = Field(
        default=0.10, ge=0, lt=1, description="added to ln(1+δ) for a 'worse' verdict from fewer starts than wanted",
    )


class SelectorSettings(BaseModel):
    models_dir: Path = Field(
        default_factory=_default_models_dir,
        description="Model registry: one folder per trained model.",
        json_schema_extra={
            "doc_default": "`models/` of a source checkout, else `./models` if it exists, else the wheel's models"
        },
    )
    objective: str = Field(default="itl_p50", description="Metric the recommendation optimises when none is given.")
    model_id: str | None = Field(
        default=None, description="Use this model instead of the one matched by fingerprint."
    )


class ServiceSettings(BaseModel):
    """``graphmode serve``. Scrapes (``server_url``): only ``scheme://host:port/metrics`` of a host in
    ``scrape_hosts`` (loopback by default) on a port in ``scrape_ports`` (empty, the default: any port,
    since vLLM's port varies; the service never quotes what a scrape fetched, so other local services
    reveal nothing but whether they answer Prometheus text), at most 8 at once (429 + Retry-After beyond),
    ``window_s`` above ``open_max_window_s`` only with the token. Slow or oversized clients: request head
    within ``header_timeout_s``, body within ``body_timeout_s`` (408 and close), heads up to
    ``max_header_bytes`` (else 431, or 400 from uvicorn when the head comes in several reads), idle keep-alive
    ``keep_alive_s``, at most ``max_connections`` (503), at most ``max_connections_per_client`` from one
    address (503 and close). Overload: at most ``max_in_flight`` requests in progress and the event loop at
    most ``max_queue_s`` behind, else ``/v1/recommend`` gets 503 with Retry-After at once (other paths never)."""

    host: str = Field(default="127.0.0.1", description="Address `graphmode serve` binds to.")
    port: int = Field(default=8080, ge=1, le=65535, description="Port `graphmode serve` listens on.")
    token: SecretStr | None = Field(
        default=None,
        description="Bearer token for reload, retrain and jobs; unset or empty disables them (403).",
    )
    max_body_bytes: int = Field(default=64 * 1024, gt=0, description="Largest request body; a larger one gets 413.")
    # /v1/recommend with server_url makes the service GET that server's /metrics: on a non-loopback bind,
    # an open target list would let any caller probe the network behind the service (SSRF).
    scrape_hosts: list[str] = Field(
        default_factory=lambda: ["127.0.0.1", "::1", "localhost"],
        description="Hosts a request's server_url may name: host names (exact), IPs or CIDR networks; '*' = any.",
    )
    # Only http(s)://host:port/metrics is ever fetched and no response body is ever quoted back, so a
    # caller learns nothing from other local services but whether /metrics answered Prometheus text;
    # vLLM's port varies by deployment, hence any port by default. List ports to narrow it.
    scrape_ports: list[int] = Field(
        default_factory=list,
        description="ports server_url may name (empty: any port on an allowed host)",
    )
    # A scrape holds one of a few slots for window_s; a caller without the token may hold one briefly only.
    open_max_window_s: float = Field(default=5.0, gt=0, description="longest window_s without the token")
    # Slow clients: a request's head must arrive within header_timeout_s of its first byte (or of the
    # connection), its body within body_timeout_s per read; heads larger than max_header_bytes get 431 (400).
    header_timeout_s: float = Field(default=10.0, gt=0, description="Seconds for a request head to arrive.")
    body_timeout_s: float = Field(default=10.0, gt=0, description="Seconds per read of a request body.")
    keep_alive_s: float = Field(default=5.0, gt=0, description="idle keep-alive connections close after this")
    max_header_bytes: int = Field(default=16 * 1024, ge=1024, description="Largest request head; larger gets 431.")
    max_connections: int = Field(default=1000, ge=1, description="open connections and requests at once")
    # One client (one IP address) may not hold every connection: past this many, its new ones are answered
    # 503 and closed, so /healthz and other clients still get in.
    max_connections_per_client: int = Field(
        default=100, ge=1, description="open connections from one client address; more get 503 and close")
    # Load shedding: past capacity, a fast 503 + Retry-After instead of a queue that grows to timeouts.
    max_in_flight: int = Field(default=256, ge=1, description="recommend requests in progress at once; more get 503")
    max_queue_s: float = Field(
        default=0.025, gt=0, allow_inf_nan=False,
        description="seconds the event loop may run behind before new recommend requests get 503 (+ Retry-After)")
    # `serve --workers N`: each worker polls the models dir's reload stamp and follows another's reload.
    reload_poll_s: float = Field(
        default=1.0, ge=0, allow_inf_nan=False,
        description="seconds between checks for another worker's reload (0: never)",
    )

    @field_validator("scrape_hosts")
    @classmethod
    def _valid_hosts(cls, v: list[str]) -> list[str]:
        out = []
        for item in v:
            item = item.strip().lower()
            if not item:
                continue
            if item != "*" and "/" in item:
                ipaddress.ip_network(item, strict=False)  # ValueError names the bad entry
            out.append(item)
        return out

    @field_validator("token")
    @classmethod
    def _non_empty(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and not v.get_secret_value():
            return None
        return v


class ControlSettings(BaseModel):
    state_dir: Path = Field(
        default=Path("graphmode-state"),
        description="Where `watch` keeps one state file per deployment (`launch` reads its last features).",
    )
    window_s: float = Field(default=60.0, gt=0, description="Sliding /metrics window `watch` computes features over.")
    min_dwell_s: float = Field(default=600.0, ge=0, description="Least time on a mode before `watch` switches again.")
    cooldown_s: float = Field(default=300.0, ge=0, description="Least time between two switch attempts.")
    min_gain: float = Field(default=0.05, ge=0, description="Relative gain the new mode must predict.")
    horizon_s: float = Field(
        default=1800.0, gt=0, description="How long a switch is expected to pay; gain × horizon must beat restart cost."
    )
    max_attempts: int = Field(default=3, ge=1, description="Failed switches allowed inside attempts_window_s.")
    attempts_window_s: float = Field(default=3600.0, gt=0, description="Window that max_attempts counts failures in.")
    retry_in_s: float = Field(
        default=120.0, ge=0, description="After max_attempts failures: no attempt before the last failure + this."
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GRAPHMODE_", env_nested_delimiter="__", env_file=None, extra="ignore"
    )

    vllm: VllmSettings = Field(default_factory=VllmSettings)
    profile: ProfileSettings = Field(default_factory=ProfileSettings)
    race: RaceSettings = Field(default_factory=RaceSettings)
    selector: SelectorSettings = Field(default_factory=SelectorSettings)
    service: ServiceSettings = Field(default_factory=ServiceSettings)
    control: ControlSettings = Field(default_factory=ControlSettings)


def load_settings() -> Settings:
    from pydantic import ValidationError

    from graphmode.core.errors import ConfigError

    try:
        return Settings()
    except ValidationError as exc:
        raise ConfigError(f"invalid GRAPHMODE_* settings: {exc}") from exc
