"""Leave-one-workload-out cross-validation of the selector, and of the candidate estimators.

Each fold holds one workload out (under every model shape), fits the whole selector on the rest
(feature spec included) and lets it choose a mode for the held-out workload. The choice is then
scored on what was *measured* for that workload:

* **regret %**: how much worse the chosen mode's measured score is than the best measured mode (the
  per-workload oracle); 0 when the choice is the oracle;
* **correct**: the choice is the oracle or tied with it (inside the measured noise);
* **gain vs default %**: how much better the chosen mode measured than vLLM's default
  ``FULL_AND_PIECEWISE``;
* **gain vs static %**: the same against the best single static mode, the one mode with the lowest mean
  regret over *all* workloads, chosen in hindsight (a stricter baseline than one picked per fold).

Objectives other than the default are evaluated from the same fitted regressors: that is the claim
"a new objective needs no retraining", tested.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from graphmode.core.modes import DEFAULT_MODE
from graphmode.selector.aggregate import TrainingSet
from graphmode.selector.card import CandidateSummary, CVReport, CVSummary, WorkloadResult
from graphmode.selector.estimators import REGRESSOR_KINDS, RegressorKind
from graphmode.selector.model import SelectorModel, _design, fit_model, measured_ranking
from graphmode.selector.objective import Objective, Ranking, rank, regret, relative_gain

DEFAULT_EVAL_METRICS: tuple[str, ...] = ("itl_p50", "ttft_p99", "e2e_p50", "output_tok_s")
TIE_RMSE = 0.05  # regressors within this relative log-RMSE of the best are compared on the next criterion


@dataclass
class _Truth:
    rankings: list[Ranking | None]
    static_mode: str | None


def _score(r: Ranking, mode: str) -> float | None:
    s = r.scores.get(mode)
    return None if s is None else s.score


def _static_mode(ts: TrainingSet, rankings: Sequence[Ranking | None], metric: str) -> str | None:
    regrets: dict[str, list[float]] = defaultdict(list)
    for r in rankings:
        if r is None or r.top is None:
            continue
        oracle = _score(r, r.top)
        for m in ts.modes:
            g = regret(_score(r, m), oracle, metric)
            if g is not None:
                regrets[m].append(g)
    if not regrets:
        return None
    coverage = max(len(v) for v in regrets.values())
    full = {m: v for m, v in regrets.items() if len(v) == coverage}
    return min(full, key=lambda m: (float(np.mean(full[m])), m != DEFAULT_MODE.value))


def truth_for(ts: TrainingSet, objective: Objective) -> _Truth:
    rankings = [measured_ranking(ts, u, objective) for u in range(len(ts.units))]
    return _Truth(rankings, _static_mode(ts, rankings, objective.metric))


def summarize(
    ts: TrainingSet, objective: Objective, truth: _Truth, choices: dict[int, str]
) -> tuple[CVSummary, list[WorkloadResult]]:
    metric = objective.metric
    rows: list[WorkloadResult] = []
    default = DEFAULT_MODE.value
    for u, chosen in sorted(choices.items()):
        r = truth.rankings[u]
        if r is None or r.top is None:
            continue
        oracle = _score(r, r.top)
        cv, dv = _score(r, chosen), _score(r, default)
        sv = _score(r, truth.static_mode) if truth.static_mode else None
        rows.append(
            WorkloadResult(
                objective=objective.describe(),
                workload=ts.units[u].workload,
                shape=ts.units[u].shape_key,
                oracle=r.best or r.top,
                ties=r.ties,
                chosen=chosen,
                regret_pct=regret(cv, oracle, metric),
                gain_vs_default_pct=relative_gain(cv, dv, metric),
                gain_vs_static_pct=relative_gain(cv, sv, metric),
                chosen_value=cv,
                oracle_value=oracle,
                default_value=dv,
                static_value=sv,
                correct=None if cv is None else chosen in r.ties,
            )
        )
    return _summary(objective, rows, truth, ts), rows


def _mean(xs: Sequence[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return float(np.mean(v)) if v else None


def _summary(
    objective: Objective, rows: Sequence[WorkloadResult], truth: _Truth, ts: TrainingSet
) -> CVSummary:
    regrets = [r.regret_pct for r in rows if r.regret_pct is not None]
    correct = [r.correct for r in rows if r.correct is not None]
    metric = objective.metric
    default_reg, static_reg = [], []
    for r in truth.rankings:
        if r is None or r.top is None:
            continue
        oracle = _score(r, r.top)
        default_reg.append(regret(_score(r, DEFAULT_MODE.value), oracle, metric))
        if truth.static_mode:
            static_reg.append(regret(_score(r, truth.static_mode), oracle, metric))
    return CVSummary(
        objective=objective.describe(),
        n=len(rows),
        mean_regret_pct=float(np.mean(regrets)) if regrets else None,
        median_regret_pct=float(np.median(regrets)) if regrets else None,
        max_regret_pct=float(np.max(regrets)) if regrets else None,
        correct_pct=100.0 * sum(correct) / len(correct) if correct else None,
        mean_gain_vs_default_pct=_mean([r.gain_vs_default_pct for r in rows]),
        mean_gain_vs_static_pct=_mean([r.gain_vs_static_pct for r in rows]),
        static_mode=truth.static_mode,
        default_regret_pct=_mean(default_reg),
        static_regret_pct=_mean(static_reg),
    )


def _choose(model: SelectorModel, x: np.ndarray, objective: Objective) -> str | None:
    table = model.tables(x[None, :])[0]
    if not table:
        return None
    try:
        return rank(table, model.noise_for(table, objective.metric), objective, model.default_mode).best
    except Exception:
        return None


def _log_rmse(ts: TrainingSet, preds: dict[int, np.ndarray]) -> dict[str, float]:
    out: dict[str, float] = {}
    for j, metric in enumerate(ts.metrics):
        errs = []
        for u, p in preds.items():
            meas, pred = ts.mean[u, :, j], p[:, j]
            ok = np.isfinite(meas) & np.isfinite(pred) & (meas > 0) & (pred > 0)
            errs.extend((np.log(pred[ok]) - np.log(meas[ok])).tolist())
        if errs:
            out[metric] = float(np.sqrt(np.mean(np.square(errs))))
    return out


def _time_us(fn: object, x: np.ndarray, n: int = 50) -> float:
    f = fn  # a compiled one-row predictor
    t0 = time.perf_counter()
    for _ in range(n):
        f(x)  # type: ignore[operator]
    return (time.perf_counter() - t0) / n * 1e6


def cross_validate(
    ts: TrainingSet,
    *,
    default_objective: Objective,
    objectives: Sequence[Objective] = (),
    regressor_kinds: Sequence[RegressorKind] = REGRESSOR_KINDS,
    chosen_regressor: RegressorKind | None = None,
    random_state: int = 0,
) -> CVReport:
    """Leave-one-workload-out CV; picks the regressor kind unless it is given."""
    groups = ts.groups
    all_objs = [default_objective, *[o for o in objectives if o != default_objective]]
    if len(groups) < 2:
        return CVReport(
            folds=0,
            skipped=f"{len(groups)} workload(s): leave-one-workload-out needs two or more",
            chosen_regressor=chosen_regressor or "ridge",
            reason="no cross-validation possible; defaults used",
        )
    truths = {o: truth_for(ts, o) for o in all_objs}
    reg_choices: dict[tuple[str, Objective], dict[int, str]] = defaultdict(dict)
    reg_preds: dict[str, dict[int, np.ndarray]] = defaultdict(dict)
    reg_us: dict[str, float] = {}
    r_kinds = [chosen_regressor] if chosen_regressor else list(regressor_kinds)
    for g in groups:
        held = [i for i, u in enumerate(ts.units) if u.group == g]
        train = [i for i, u in enumerate(ts.units) if u.group != g]
        sub = ts.subset(train)
        for kind in r_kinds:
            model = fit_model(sub, regressor_kind=kind, random_state=random_state)
            for u in held:
                x = model.spec.vectorize(ts.units[u].features, ts.units[u].shape)[0]
                reg_preds[kind][u] = np.concatenate([model.predict_metrics(x[None, :])[0]], axis=1)
                for o in all_objs:
                    choice = _choose(model, x, o)
                    if choice is not None:
                        reg_choices[(kind, o)][u] = choice
            if kind not in reg_us and held:
                f = model.regressor.compile()
                reg_us[kind] = _time_us(
                    f,
                    _design(
                        model.spec.vectorize(ts.units[held[0]].features, ts.units[held[0]].shape)[0][None, :]
                    )[0],
                )

    d_truth = truths[default_objective]
    reg_cands = []
    for kind in r_kinds:
        s, _ = summarize(ts, default_objective, d_truth, reg_choices[(kind, default_objective)])
        rm = _log_rmse(ts, reg_preds[kind])
        reg_cands.append(
            CandidateSummary(
                kind=kind,
                mean_regret_pct=s.mean_regret_pct,
                median_regret_pct=s.median_regret_pct,
                max_regret_pct=s.max_regret_pct,
                correct_pct=s.correct_pct,
                mean_log_rmse=float(np.mean(list(rm.values()))) if rm else None,
                log_rmse=rm,
                predict_us=reg_us.get(kind),
            )
        )
    best_reg = chosen_regressor or _pick_regressor(reg_cands, list(r_kinds))
    summaries, workloads = [], []
    for o in all_objs:
        s, rows = summarize(ts, o, truths[o], reg_choices[(best_reg, o)])
        summaries.append(s)
        workloads.extend(rows)
    reason = _reason(reg_cands, best_reg, chosen_regressor)
    report = CVReport(
        folds=len(groups),
        regressor_candidates=reg_cands,
        chosen_regressor=best_reg,
        reason=reason,
        summaries=summaries,
        workloads=workloads,
    )
    if len(ts.shape_keys) >= 2:
        report.shape_cv = [_shape_cv(ts, default_objective, best_reg, random_state)]
    return report


def _pick_regressor(cands: Sequence[CandidateSummary], order: Sequence[str]) -> str:
    """Lowest LOWO log-RMSE (every cell, every metric: the regressors serve every objective); within
    TIE_RMSE of it, the lowest mean regret; then the listed order (simpler first).

    Regret over a handful of held-out workloads moves by whole workloads and can favour even the
    no-information ``mean`` baseline by luck; the prediction error is the steadier signal.
    """
    scored = [c for c in cands if c.mean_log_rmse is not None]
    if not scored:
        return order[0]
    best = min(c.mean_log_rmse or 0.0 for c in scored)
    close = [c for c in scored if (c.mean_log_rmse or 0.0) <= best * (1 + TIE_RMSE)]
    return min(
        close,
        key=lambda c: (
            round(c.mean_regret_pct if c.mean_regret_pct is not None else math.inf, 4),
            order.index(c.kind),
        ),
    ).kind


def _fmt(v: float | None, unit: str = "%") -> str:
    return "n/a" if v is None else f"{v:.2f}{unit}"


def _reason(regs: Sequence[CandidateSummary], reg: str, forced: str | None) -> str:
    if forced:
        return f"regressor {reg} was given"
    return f"regressor {reg}: lowest LOWO log-RMSE (within {TIE_RMSE:.0%}: lowest regret); " + ", ".join(
        f"{c.kind} {_fmt(c.mean_regret_pct)} regret / RMSE {_fmt(c.mean_log_rmse, '')}" for c in regs
    )


def _shape_cv(ts: TrainingSet, objective: Objective, kind: str, random_state: int) -> CVSummary:
    """Leave-one-*shape*-out: how the selector does on a model shape it was not trained on."""
    truth = truth_for(ts, objective)
    choices: dict[int, str] = {}
    for skey in ts.shape_keys:
        held = [i for i, u in enumerate(ts.units) if u.shape_key == skey]
        train = [i for i, u in enumerate(ts.units) if u.shape_key != skey]
        if not train:
            continue
        model = fit_model(ts.subset(train), regressor_kind=kind, random_state=random_state)  # type: ignore[arg-type]
        for u in held:
            c = _choose(model, model.spec.vectorize(ts.units[u].features, ts.units[u].shape)[0], objective)
            if c is not None:
                choices[u] = c
    s, _ = summarize(ts, objective, truth, choices)
    return s.model_copy(update={"objective": s.objective + " (leave-one-shape-out)"})
