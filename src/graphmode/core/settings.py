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


def _default_models_dir() -> Path:
    # A source checkout keeps its models next to the package; an installed wheel has none.
    repo_models = PACKAGE_DIR.parent.parent / "models"
    return repo_models if repo_models.is_dir() else Path.cwd() / "models"


class VllmSettings(BaseModel):
    command: str = Field(
        default="vllm serve",
        description="Command prefix that starts vLLM; model and args follow. Lets vLLM live in its own venv.",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    startup_timeout_s: float = Field(default=900.0, gt=0)
    stop_timeout_s: float = Field(default=30.0, gt=0)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    read_timeout_s: float = Field(default=300.0, gt=0)

    def argv(self) -> list[str]:
        return shlex.split(self.command)


class ProfileSettings(BaseModel):
    grid: Path = DEFAULT_GRID
    dataset: Path = Path("profile.sqlite")
    scrape_interval_s: float = Field(default=0.5, gt=0)
    log_dir: Path = Path("graphmode-logs")
    gpu_sample_interval_s: float = Field(default=0.5, gt=0)


class RaceSettings(BaseModel):
    """``graphmode profile --race`` (graphmode.profiling.race): resident engines measured in paired rounds."""

    grid: Path = RACE_GRID
    delta: float = Field(default=0.03, gt=0, lt=1, description="margin of worse/better/equivalent, relative")
    confidence: float = Field(default=0.95, ge=0.5, lt=1)
    min_rounds: int = Field(default=3, ge=2)
    budget_min: float = Field(default=10.0, gt=0, description="GPU-minutes, engine starts included")
    max_rounds: int = Field(default=200, ge=1)
    metrics: list[str] = Field(default_factory=lambda: ["itl_p50", "ttft_p50"])
    cell_s: float = Field(default=3.0, gt=0, le=600, description="measured window of one cell")
    warmup_s: float = Field(default=2.0, ge=0, le=600, description="most warm-up before a cell's window")
    stagger_s: float = Field(default=0.0, ge=0, le=600, description="delay between overlapped engine starts")
    kv_cache_memory_bytes: str | None = Field(default=None, description="vLLM --kv-cache-memory-bytes per engine")
    gpu_memory_utilization: float = Field(
        default=0.05, gt=0, le=1,
        description="replaces --gpu-memory-utilization when a KV share is given (vLLM's start-up free-memory check)",
    )
    idle_probe_s: float = Field(default=0.5, ge=0, description="GPU utilisation sampled with every engine idle")


class SelectorSettings(BaseModel):
    models_dir: Path = Field(default_factory=_default_models_dir)
    objective: str = "itl_p50"
    model_id: str | None = None


class ServiceSettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    token: SecretStr | None = None
    max_body_bytes: int = Field(default=64 * 1024, gt=0)
    # /v1/recommend with server_url makes the service GET that server's /metrics: on a non-loopback bind,
    # an open target list would let any caller probe the network behind the service (SSRF).
    scrape_hosts: list[str] = Field(
        default_factory=lambda: ["127.0.0.1", "::1", "localhost"],
        description="hosts server_url may name: host names (exact), IP addresses or CIDR networks; '*' = any",
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
    state_dir: Path = Path("graphmode-state")
    window_s: float = Field(default=60.0, gt=0)
    min_dwell_s: float = Field(default=600.0, ge=0)
    cooldown_s: float = Field(default=300.0, ge=0)
    min_gain: float = Field(default=0.05, ge=0, description="relative gain the new mode must predict")
    horizon_s: float = Field(default=1800.0, gt=0, description="how long a switch is expected to pay")
    max_attempts: int = Field(default=3, ge=1)
    attempts_window_s: float = Field(default=3600.0, gt=0)
    retry_in_s: float = Field(default=120.0, ge=0)


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
