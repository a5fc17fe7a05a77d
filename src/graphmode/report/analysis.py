"""What the views say: per-workload verdicts, the headline (wins and the default's loss), the Pareto front."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from graphmode.report.views import (
    DEFAULT,
    HEADLINE_METRICS,
    PARETO_METRICS,
    HeadlineRow,
    ParetoPoint,
    ReportData,
    ShapeView,
    Verdict,
    WorkloadView,
)
from graphmode.selector.aggregate import (
    ITL_COALESCED_RATIO,
)
from graphmode.selector.model import measured_ranking
from graphmode.selector.objective import make_objective, regret


def verdict(shape: ShapeView, w: WorkloadView, metric: str, default_mode: str = DEFAULT) -> Verdict | None:
    """The measured ranking of ``w`` under ``metric`` with the selector's noise and tie rule."""
    if shape.ts is None or w.unit is None or metric not in shape.ts.metrics:
        return None
    ranking = measured_ranking(shape.ts, w.unit, make_objective(metric), default_mode)
    if ranking is None or ranking.top is None or ranking.best is None:
        return None
    values = {m: s.value for m, s in ranking.scores.items() if s.value is not None}
    if ranking.top not in values:
        return None
    ties = [ranking.top, *[m for m in ranking.ties if m != ranking.top]]
    loss = regret(values.get(default_mode), values[ranking.top], metric) if default_mode in values else None
    return Verdict(metric, ranking.top, ranking.best, ties, values, loss)


def headline(data: ReportData, metrics: Sequence[str] = HEADLINE_METRICS) -> list[HeadlineRow]:
    """Per shape and metric: wins per mode, ties, and the default's median / max loss vs the best."""
    out: list[HeadlineRow] = []
    for s in data.shapes:
        for metric in metrics:
            vs = [(w, w.verdicts[metric]) for w in s.workloads if metric in w.verdicts]
            if not vs:
                continue
            wins = {m: 0 for m in s.modes}
            for _, v in vs:
                wins[v.best] = wins.get(v.best, 0) + 1
            losses = [(v.default_loss_pct, w.label, v) for w, v in vs if v.default_loss_pct is not None]
            worst = max(losses, key=lambda x: x[0]) if losses else None
            out.append(
                HeadlineRow(
                    shape=s.short,
                    metric=metric,
                    n=len(vs),
                    wins=wins,
                    ties=sum(1 for _, v in vs if v.tied),
                    default_median_loss_pct=float(np.median([x for x, _, _ in losses])) if losses else None,
                    default_max_loss_pct=worst[0] if worst else None,
                    default_max_loss_workload=worst[1] if worst else None,
                    default_ok=sum(1 for _, v in vs if DEFAULT in v.ties),
                    worst_best_mode=worst[2].best if worst else None,
                    worst_best_value=worst[2].values.get(worst[2].best) if worst else None,
                    worst_default_value=worst[2].values.get(DEFAULT) if worst else None,
                )
            )
    return out


def _front(points: Sequence[tuple[float, ...]]) -> list[bool]:
    """Which points no other point dominates (every coordinate minimised)."""
    out = []
    for i, p in enumerate(points):
        dominated = any(
            all(q[k] <= p[k] for k in range(len(p))) and any(q[k] < p[k] for k in range(len(p)))
            for j, q in enumerate(points)
            if j != i
        )
        out.append(not dominated)
    return out


def pareto(data: ReportData, metrics: Sequence[str] = PARETO_METRICS) -> list[ParetoPoint]:
    """One point per (shape, mode): median relative latency over workloads, graph memory, start-up."""
    out: list[ParetoPoint] = []
    for s in data.shapes:
        pts = [
            ParetoPoint(s.short, m, {}, {}, s.constants[m].get("graph_gib"), s.constants[m].get("startup_s"),
                        s.constants[m].get("capture_s"), {}, {})
            for m in s.modes
        ]
        for metric in metrics:
            rel: dict[str, list[float]] = defaultdict(list)
            for w in s.workloads:
                means = {m: c.mean(metric) for m, c in w.cells.items()}
                known = {m: v for m, v in means.items() if v is not None and v > 0}
                if len(known) < 2:
                    continue
                best = min(known.values())
                for m, v in known.items():
                    rel[m].append(v / best)
            for p in pts:
                p.rel[metric] = float(np.median(rel[p.mode])) if rel.get(p.mode) else None
                p.n[metric] = len(rel.get(p.mode, []))
            full = [p for p in pts if p.rel[metric] is not None and p.graph_gib is not None]
            two = _front([(p.rel[metric] or 0.0, p.graph_gib or 0.0) for p in full])
            with_start = [p for p in full if p.startup_s is not None]
            three = _front([(p.rel[metric] or 0.0, p.graph_gib or 0.0, p.startup_s or 0.0) for p in with_start])
            for p in pts:
                p.pareto[metric] = any(p is q and f for q, f in zip(full, two, strict=True))
                p.pareto3[metric] = any(p is q and f for q, f in zip(with_start, three, strict=True))
        out += pts
    return out


def coalesced_rule() -> str:
    return (f"ITL ignored where ITL p50 < {ITL_COALESCED_RATIO:g} × TPOT p50 (the client read coalesced chunks; "
            "the selector does the same, aggregate.py metric_value; docs/method.md “ITL under overload”)")
