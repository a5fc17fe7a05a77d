"""Objectives: what "best mode" means, and the ranking of modes under one.

An :class:`Objective` is a metric to minimise or maximise (its direction comes from the metric),
optional constraints (SLOs such as ``ttft_p99 <= 200ms``, ``graph_gib <= 1``, ``startup_s <= 60``) and
optional weights that charge graph memory and start-up time against the metric. :func:`rank` applies
one to a per-mode table of values, measured or predicted, so a new objective never needs retraining.

Scores. With memory weight ``wm`` and start-up weight ``ws`` the score of a mode is::

    penalty = 1 + wm * graph_gib + ws * startup_s
    score   = value * penalty     (metric to minimise)
    score   = value / penalty     (metric to maximise)

so ``wm = 0.05`` means one GiB of graph memory costs as much as a 5 % worse metric.

Ties. Each value comes with a noise (one standard deviation, absolute units): the standard error of a
measured mean, or the run-to-run noise of a prediction. A mode whose score is within
``TIE_Z * sqrt(noise_best**2 + noise_mode**2)`` of the best is *tied* with it, not beaten by it. When
vLLM's default mode is among the tied, it is the answer (``prefer_default_on_tie``): a change of mode
must buy a difference that the measurements can tell apart.

Feasibility. A mode meets a constraint, violates it, or cannot be checked (the value is unknown).
Modes rank: every constraint met, then some unverifiable, then violating (least relative violation
first); within a class, by score.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from graphmode.core.errors import ObjectiveError

Direction = Literal["min", "max"]
MetricKind = Literal["workload", "constant"]
TIE_Z = 2.0


@dataclass(frozen=True)
class MetricDef:
    name: str
    direction: Direction
    unit: str
    kind: MetricKind
    description: str


_DEFS: tuple[MetricDef, ...] = (
    MetricDef("ttft_p50", "min", "s", "workload", "time to first token, median"),
    MetricDef("ttft_p90", "min", "s", "workload", "time to first token, 90th percentile"),
    MetricDef("ttft_p99", "min", "s", "workload", "time to first token, 99th percentile"),
    MetricDef("itl_p50", "min", "s", "workload", "inter-token latency, median"),
    MetricDef("itl_p90", "min", "s", "workload", "inter-token latency, 90th percentile"),
    MetricDef("itl_p99", "min", "s", "workload", "inter-token latency, 99th percentile"),
    MetricDef("tpot_p50", "min", "s", "workload", "time per output token after the first, median over requests"),
    MetricDef("e2e_p50", "min", "s", "workload", "end-to-end request latency, median"),
    MetricDef("e2e_p90", "min", "s", "workload", "end-to-end request latency, 90th percentile"),
    MetricDef("e2e_p99", "min", "s", "workload", "end-to-end request latency, 99th percentile"),
    MetricDef("output_tok_s", "max", "tok/s", "workload", "generated tokens per second"),
    MetricDef("request_throughput", "max", "req/s", "workload", "finished requests per second"),
    MetricDef("startup_s", "min", "s", "constant", "wall clock from spawn to /health OK"),
    MetricDef("capture_s", "min", "s", "constant", "CUDA graph capture time"),
    MetricDef("graph_gib", "min", "GiB", "constant", "GPU memory the captured graphs take"),
    MetricDef("kv_cache_tokens", "max", "tokens", "constant", "KV-cache capacity in tokens"),
    MetricDef("kv_cache_gib", "max", "GiB", "constant", "KV-cache size"),
)
METRICS: dict[str, MetricDef] = {d.name: d for d in _DEFS}
WORKLOAD_METRICS: tuple[str, ...] = tuple(d.name for d in _DEFS if d.kind == "workload")
CONSTANT_METRICS: tuple[str, ...] = tuple(d.name for d in _DEFS if d.kind == "constant")
ALIASES: dict[str, str] = {
    "throughput": "output_tok_s",
    "tok_s": "output_tok_s",
    "tokens_per_s": "output_tok_s",
    "req_s": "request_throughput",
    "ttft": "ttft_p50",
    "itl": "itl_p50",
    "tpot": "tpot_p50",
    "e2e": "e2e_p50",
    "latency": "e2e_p50",
    "startup": "startup_s",
    "graph_memory": "graph_gib",
    "graph_mem": "graph_gib",
    "memory": "graph_gib",
    "capture": "capture_s",
    "kv_tokens": "kv_cache_tokens",
}
# Unit suffixes accepted in constraint values, as factors to the metric's base unit.
_UNITS: dict[str, dict[str, float]] = {
    "s": {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "min": 60.0},
    "GiB": {"gib": 1.0, "gb": 1.0, "g": 1.0, "mib": 1 / 1024, "mb": 1 / 1024, "m": 1 / 1024},
    "tok/s": {"tok/s": 1.0, "tokens/s": 1.0},
    "req/s": {"req/s": 1.0, "rps": 1.0},
    "tokens": {"tokens": 1.0, "tok": 1.0, "k": 1e3},
}


def resolve_metric(name: str) -> str:
    """The canonical metric name for ``name`` (aliases such as ``throughput`` accepted)."""
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    if key not in METRICS:
        known = ", ".join([*METRICS, *ALIASES])
        raise ObjectiveError(f"unknown metric {name!r}; known: {known}")
    return key


_CONSTRAINT_RE = re.compile(r"^\s*([A-Za-z_][\w\-]*)\s*(<=|>=|<|>|=<|=>)\s*([-+0-9.eE]+)\s*([A-Za-zµ/]*)\s*$")


class Constraint(BaseModel):
    """``metric op value``, value in the metric's base unit (seconds, GiB, tok/s, req/s, tokens)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: str
    op: Literal["<=", "<", ">=", ">"]
    value: float

    @classmethod
    def parse(cls, text: str) -> Constraint:
        """``'ttft_p99<=0.2'``, ``'ttft_p99 <= 200ms'``, ``'graph_gib<=512MiB'``, ``'startup_s<60'``."""
        m = _CONSTRAINT_RE.match(text)
        if not m:
            raise ObjectiveError(
                f"cannot read constraint {text!r}; write METRIC OP VALUE[UNIT], e.g. 'ttft_p99<=200ms'"
            )
        name, op, number, unit = m.groups()
        op = {"=<": "<=", "=>": ">="}.get(op, op)
        metric = resolve_metric(name)
        try:
            value = float(number)
        except ValueError:
            raise ObjectiveError(f"constraint {text!r}: {number!r} is not a number") from None
        if unit:
            base = METRICS[metric].unit
            factors = _UNITS.get(base, {})
            factor = factors.get(unit.lower()) or factors.get(unit)
            if factor is None:
                allowed = ", ".join(factors) or "none"
                raise ObjectiveError(
                    f"constraint {text!r}: unit {unit!r} does not fit {metric} ({base}); "
                    f"use one of: {allowed}"
                )
            value *= factor
        if not math.isfinite(value):
            raise ObjectiveError(f"constraint {text!r}: value must be finite")
        return cls(metric=metric, op=op, value=value)

    def holds(self, v: float) -> bool:
        if self.op == "<=":
            return v <= self.value
        if self.op == "<":
            return v < self.value
        if self.op == ">=":
            return v >= self.value
        return v > self.value

    def violation(self, v: float) -> float:
        """How far ``v`` is outside the bound, relative to the bound (0 when it holds)."""
        if self.holds(v):
            return 0.0
        scale = abs(self.value) if self.value else 1.0
        return abs(v - self.value) / scale

    def __str__(self) -> str:
        unit = METRICS[self.metric].unit
        return f"{self.metric} {self.op} {self.value:g} {unit}"


class Objective(BaseModel):
    """A metric to optimise, constraints, and weights on graph memory and start-up time."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: str = "itl_p50"
    constraints: tuple[Constraint, ...] = ()
    memory_weight: float = Field(default=0.0, ge=0, description="relative cost of one GiB of graph memory")
    startup_weight: float = Field(default=0.0, ge=0, description="relative cost of one second of start-up")
    prefer_default_on_tie: bool = True

    @property
    def direction(self) -> Direction:
        return METRICS[self.metric].direction

    def required_metrics(self) -> set[str]:
        need = {self.metric, *(c.metric for c in self.constraints)}
        if self.memory_weight:
            need.add("graph_gib")
        if self.startup_weight:
            need.add("startup_s")
        return need

    def describe(self) -> str:
        text = f"{self.direction} {self.metric}"
        if self.constraints:
            text += " s.t. " + ", ".join(str(c) for c in self.constraints)
        if self.memory_weight:
            text += f"; memory weight {self.memory_weight:g}/GiB"
        if self.startup_weight:
            text += f"; startup weight {self.startup_weight:g}/s"
        return text


def make_objective(
    metric: str | None = None,
    constraints: Sequence[str | Constraint] = (),
    *,
    memory_weight: float = 0.0,
    startup_weight: float = 0.0,
    max_graph_gib: float | None = None,
    max_startup_s: float | None = None,
    prefer_default_on_tie: bool = True,
    default_metric: str = "itl_p50",
) -> Objective:
    """Build an :class:`Objective` from CLI/API pieces; every problem is an :class:`ObjectiveError`."""
    parsed = [c if isinstance(c, Constraint) else Constraint.parse(c) for c in constraints]
    if max_graph_gib is not None:
        parsed.append(Constraint(metric="graph_gib", op="<=", value=max_graph_gib))
    if max_startup_s is not None:
        parsed.append(Constraint(metric="startup_s", op="<=", value=max_startup_s))
    if (
        memory_weight < 0
        or startup_weight < 0
        or not (math.isfinite(memory_weight) and math.isfinite(startup_weight))
    ):
        raise ObjectiveError("memory and startup weights must be finite and >= 0")
    return Objective(
        metric=resolve_metric(metric or default_metric),
        constraints=tuple(parsed),
        memory_weight=memory_weight,
        startup_weight=startup_weight,
        prefer_default_on_tie=prefer_default_on_tie,
    )


@dataclass
class ModeScore:
    mode: str
    value: float | None
    score: float | None
    noise: float | None
    status: Literal["ok", "unverified", "violates", "unknown"]
    violation: float = 0.0
    violations: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)


@dataclass
class Ranking:
    """Modes from best to worst under one objective, with the tie set of the chosen mode."""

    best: str | None
    top: str | None  # the best score before the tie rule; ``best`` differs only when it is tied
    order: list[str]
    scores: dict[str, ModeScore]
    ties: list[str]
    margin_sigma: float | None
    runner_up: str | None
    constraints_met: bool
    notes: list[str] = field(default_factory=list)
    tie_note: str | None = None  # the tie rule kept the default over ``top`` (None: it did not)

    def tied(self, mode: str) -> bool:
        return mode in self.ties


_CLASS = {"ok": 0, "unverified": 1, "violates": 2, "unknown": 3}


def rank(
    values: Mapping[str, Mapping[str, float | None]],
    noise: Mapping[str, float | None],
    objective: Objective,
    default_mode: str,
) -> Ranking:
    """Rank modes by ``objective``.

    ``values[mode][metric]`` holds every metric known for a mode (``None`` or absent when unknown);
    ``noise[mode]`` is one standard deviation of that mode's objective metric, absolute units.
    """
    scores: dict[str, ModeScore] = {}
    sign = 1.0 if objective.direction == "min" else -1.0
    notes: list[str] = []
    for mode, table in values.items():
        v = table.get(objective.metric)
        sigma = noise.get(mode)
        if v is None or not math.isfinite(v):
            scores[mode] = ModeScore(mode, None, None, None, "unknown")
            continue
        penalty = 1.0
        unverified: list[str] = []
        if objective.memory_weight:
            g = table.get("graph_gib")
            if g is None:
                unverified.append("graph_gib (memory weight)")
            else:
                penalty += objective.memory_weight * max(g, 0.0)
        if objective.startup_weight:
            st = table.get("startup_s")
            if st is None:
                unverified.append("startup_s (startup weight)")
            else:
                penalty += objective.startup_weight * max(st, 0.0)
        score = v * penalty if sign > 0 else v / penalty
        score_noise = None if sigma is None else (sigma * penalty if sign > 0 else sigma / penalty)
        violations: list[str] = []
        total_violation = 0.0
        for c in objective.constraints:
            cv = table.get(c.metric)
            if cv is None:
                unverified.append(str(c))
            elif not c.holds(cv):
                violations.append(f"{c} (is {cv:.4g})")
                total_violation += c.violation(cv)
        status: Literal["ok", "unverified", "violates"] = (
            "violates" if violations else "unverified" if unverified else "ok"
        )
        scores[mode] = ModeScore(mode, v, score, score_noise, status, total_violation, violations, unverified)

    known = [s for s in scores.values() if s.score is not None]
    if not known:
        missing = ", ".join(sorted(values)) or "no modes"
        raise ObjectiveError(f"no mode has a value for {objective.metric} ({missing})")
    order_scores = sorted(known, key=lambda s: (_CLASS[s.status], s.violation, sign * (s.score or 0.0)))
    order = [s.mode for s in order_scores] + sorted(m for m, s in scores.items() if s.score is None)
    top = order_scores[0]
    same_class = [
        s
        for s in order_scores
        if _CLASS[s.status] == _CLASS[top.status]
        and (top.status != "violates" or s.violation == top.violation)
    ]
    ties = [s.mode for s in same_class if _within_noise(top, s)]
    best = top.mode
    tie_note = None
    if objective.prefer_default_on_tie and default_mode in ties and default_mode != best:
        best = default_mode
        tie_note = f"{top.mode} scores best but is within noise of the default {default_mode}"
    chosen = scores[best]
    others = [s for s in order_scores if s.mode != best]
    runner = others[0] if others else None
    margin = None
    if runner is not None and chosen.score is not None and runner.score is not None:
        sd = math.hypot(chosen.noise or 0.0, runner.noise or 0.0)
        gap = sign * (runner.score - chosen.score)
        margin = gap / sd if sd > 0 else (math.inf if gap > 0 else -math.inf if gap < 0 else 0.0)
    constraints_met = chosen.status == "ok"
    if chosen.status == "violates":
        notes.append("no mode meets every constraint; chose the one that violates them least")
    elif chosen.status == "unverified":
        notes.append(
            "some constraints cannot be checked for the chosen mode: " + ", ".join(chosen.unverified)
        )
    return Ranking(
        best=best,
        top=top.mode,
        order=[best, *[m for m in order if m != best]],
        scores=scores,
        ties=[best, *[m for m in ties if m != best]],
        margin_sigma=margin,
        runner_up=runner.mode if runner else None,
        constraints_met=constraints_met,
        notes=notes,
        tie_note=tie_note,
    )


def _within_noise(a: ModeScore, b: ModeScore) -> bool:
    if a.score is None or b.score is None:
        return False
    if a.mode == b.mode:
        return True
    sd = math.hypot(a.noise or 0.0, b.noise or 0.0)
    return abs(a.score - b.score) <= TIE_Z * sd


def relative_gain(chosen: float | None, reference: float | None, metric: str) -> float | None:
    """How much better ``chosen`` is than ``reference`` on ``metric``, in % of the reference."""
    if chosen is None or reference is None or reference == 0:
        return None
    if METRICS[metric].direction == "min":
        return (reference - chosen) / abs(reference) * 100.0
    return (chosen - reference) / abs(reference) * 100.0


def regret(chosen: float | None, oracle: float | None, metric: str) -> float | None:
    """How much worse ``chosen`` is than the best achievable ``oracle``, in % of the oracle (>= 0)."""
    gain = relative_gain(chosen, oracle, metric)
    return None if gain is None else max(-gain, 0.0) + 0.0  # + 0.0: no "-0.0"
