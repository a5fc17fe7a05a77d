"""Declarative workload grid (YAML or TOML), validated before any server starts.

A grid file has ``defaults`` (applied to every workload), an explicit ``workloads`` list and/or a
``matrix`` whose cartesian product expands to workloads::

    defaults: {duration_s: 20, warmup_s: 3, repeats: 1}
    matrix:
      rate: [2, 8, 32]
      burstiness: [1.0, 0.25]
      shape:
        - {name: prefill, input: {mean: 1024, spread: 0.1}, output: {mean: 64, spread: 0.1}}
    workloads:
      - {name: spike, rate: 50, burstiness: 0.1, input: {mean: 128}, output: {mean: 128}}
"""

from __future__ import annotations

import hashlib
import itertools
import json
import tomllib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from graphmode.core.errors import GridError


class LengthDist(BaseModel):
    """Token lengths drawn uniformly from ``mean × [1 - spread, 1 + spread]`` (vLLM bench's range ratio)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mean: int = Field(gt=0, le=1_000_000)
    spread: float = Field(default=0.0, ge=0.0, lt=1.0)

    def bounds(self) -> tuple[int, int]:
        lo = max(1, round(self.mean * (1 - self.spread)))
        hi = max(lo, round(self.mean * (1 + self.spread)))
        return lo, hi


STOP_METRICS = ("itl_p50", "ttft_p50", "tpot_p50")


class AdaptiveWindow(BaseModel):
    """Stop a cell as soon as its metrics are known well enough, instead of after a fixed time.

    With this set, ``warmup_s`` and ``duration_s`` become upper bounds. Warm-up ends when the first
    request of the cell finishes (one request lifetime, about when an open-loop batch reaches steady
    state), but not before ``min_warmup_s``. Measurement then runs at least ``min_s`` and stops when the
    95% confidence interval of every metric in ``ci`` is within that relative half-width (0.03 = ±3%).
    Requests still in flight at the stop are cancelled (vLLM aborts them), so the next cell starts on an
    idle server without a drain.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_s: float = Field(default=2.0, gt=0, le=600)
    min_warmup_s: float = Field(default=0.5, ge=0, le=600)
    ci: dict[str, float] = Field(default_factory=lambda: {"itl_p50": 0.03, "ttft_p50": 0.10})
    check_every_s: float = Field(default=0.5, gt=0, le=60)

    @field_validator("ci")
    @classmethod
    def _known_metrics(cls, value: dict[str, float]) -> dict[str, float]:
        for metric, width in value.items():
            if metric not in STOP_METRICS:
                raise ValueError(f"ci metric {metric!r} is not one of {', '.join(STOP_METRICS)}")
            if not 0 < width < 1:
                raise ValueError(f"ci half-width for {metric} must be in (0, 1), got {width}")
        return value


class Workload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=120, pattern=r"^[A-Za-z0-9_.\-]+$")
    rate: float = Field(gt=0, le=10_000, description="open-loop arrival rate, req/s")
    burstiness: float = Field(
        default=1.0, gt=0, le=100, description="gamma shape of inter-arrival times; 1 = Poisson, < 1 bursty"
    )
    input: LengthDist
    output: LengthDist
    max_concurrency: int | None = Field(default=None, gt=0)
    duration_s: float = Field(default=20.0, gt=0, le=3600)
    max_requests: int | None = Field(default=None, gt=0, description="stop sending after this many")
    warmup_s: float = Field(default=3.0, ge=0, le=600)
    repeats: int = Field(default=1, ge=1, le=20)
    slo_ttft_s: float | None = Field(default=None, gt=0)
    slo_itl_s: float | None = Field(default=None, gt=0)
    seed: int = 0
    adaptive: AdaptiveWindow | None = None

    def spec(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def spec_hash(self) -> str:
        """Changes whenever anything that shapes the load changes, so --resume never mixes specs."""
        payload = self.model_dump(mode="json", exclude={"repeats"})
        if payload.get("adaptive") is None:
            payload.pop("adaptive", None)  # rows measured before adaptive windows existed keep their hash
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    input: LengthDist
    output: LengthDist


class _Matrix(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rate: list[float] = Field(min_length=1)
    burstiness: list[float] = Field(default_factory=lambda: [1.0], min_length=1)
    shape: list[_Shape] = Field(min_length=1)
    max_concurrency: list[int | None] = Field(default_factory=lambda: [None], min_length=1)  # type: ignore[arg-type]


class Grid(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "grid"
    defaults: dict[str, Any] = Field(default_factory=dict)
    matrix: _Matrix | None = None
    workloads: list[Workload] = Field(default_factory=list)

    @field_validator("workloads", mode="before")
    @classmethod
    def _apply_defaults(cls, value: Any, info: Any) -> Any:
        defaults = info.data.get("defaults") or {}
        if isinstance(value, list):
            return [{**defaults, **w} if isinstance(w, dict) else w for w in value]
        return value

    @model_validator(mode="after")
    def _expand(self) -> Grid:
        if self.matrix is not None:
            expanded = []
            m = self.matrix
            for rate, burst, shape, conc in itertools.product(m.rate, m.burstiness, m.shape, m.max_concurrency):
                name = f"{shape.name}-r{rate:g}-b{burst:g}" + (f"-c{conc}" if conc else "")
                raw = {
                    **self.defaults,
                    "name": name,
                    "rate": rate,
                    "burstiness": burst,
                    "input": shape.input,
                    "output": shape.output,
                    "max_concurrency": conc,
                }
                expanded.append(Workload.model_validate(raw))
            self.workloads = expanded + self.workloads
            self.matrix = None
        if not self.workloads:
            raise ValueError("grid has no workloads: give 'workloads' or 'matrix'")
        seen: set[str] = set()
        for w in self.workloads:
            if w.name in seen:
                raise ValueError(f"duplicate workload name {w.name!r}")
            seen.add(w.name)
        return self

    def select(self, names: list[str] | None) -> list[Workload]:
        if not names:
            return list(self.workloads)
        by_name = {w.name: w for w in self.workloads}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise GridError(f"workloads not in grid {self.name!r}: {', '.join(missing)}")
        return [by_name[n] for n in names]


def _format_validation_error(path: Path, exc: ValidationError) -> str:
    lines = [f"invalid grid file {path}:"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  {loc}: {err['msg']}")
    return "\n".join(lines)


def load_grid(path: str | Path) -> Grid:
    """Read and validate a grid file; every problem becomes a :class:`GridError` naming the field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise GridError(f"cannot read grid file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise GridError(f"cannot read grid file {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    try:
        raw = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise GridError(f"grid file {path} is not valid {'TOML' if path.suffix == '.toml' else 'YAML'}: {exc}") from exc
    if not isinstance(raw, dict):
        raise GridError(f"grid file {path} must hold a mapping at the top level, got {type(raw).__name__}")
    raw.setdefault("name", path.stem)
    try:
        return Grid.model_validate(raw)
    except ValidationError as exc:
        raise GridError(_format_validation_error(path, exc)) from None
