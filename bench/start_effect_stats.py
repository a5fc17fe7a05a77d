#!/usr/bin/env python3
"""Tables for issue 17's step-1 experiments: start vs clock and the three factors (bench/gpu/start_effect.py),
and the long two-engine time series (bench/gpu/series.py, ``--series``).

usage: bench/start_effect_stats.py DIR [--markdown]      (DIR holds cells.jsonl and starts.jsonl)
       bench/start_effect_stats.py --series DIR [--window-min 1] [--markdown]

Model, per cell type and metric, on y = ln(metric) of every cell:
    y = start effect + round effect + residual        (ordinary least squares, dummy-coded)
A start is one engine start (slot, start number): 12 here. Rounds are the clock: every live engine measures the
same cell once per round, so a round effect is what moved every engine at once. The start effects are then
compared:

* **clock**: F test of the round effects (full model against starts only); their sd;
* **start, beyond its arm**: F test of start effects nested in arms (full model against arm + round); the
  between-start sd within an arm, with the residual's share removed (σ²_start = var(start means within arm) −
  σ²_resid / rounds per start), and a 95% interval from the χ² law of the within-arm variance (df = starts − arms);
* **residual**: sd of a cell around its start and round (χ² interval), and its lag-1 autocorrelation within a
  start (a drift of one engine that the round effects do not take);
* **arms** (pinned, sync against base): the ratio of geometric means over their starts' adjusted levels, Welch t
  interval over starts (n = 4 and 4): the start, not the cell, is the unit of replication;
* **warm vs cold compile cache**: per slot, the second start's level minus the first's (paired by slot, n = 6),
  t interval. Rounds are in the model, so the clock between the two starts is taken out;
* **conditions**: Pearson r of the round effects with the round's mean GPU SM clock, GPU temperature and host
  CPU MHz (Fisher-z 95% interval).

Ratios are exp(difference); a CV is 100·sqrt(exp(σ²) − 1).

``--series`` (two warm engines A and B of one mode, the same cells in ABBA loops for N minutes), per engine,
cell type and metric, on y = ln(metric) against t = minutes since the first cell:

* **trend**: OLS slope of y on t, as a ratio per 10 minutes; its 95% t interval allows for serial correlation
  the way Santer et al. (2000) do: with r₁ the lag-1 autocorrelation of the residuals (when positive),
  n_eff = n·(1 − r₁)/(1 + r₁), s² = RSS/(n_eff − 2), se(b) = s/sqrt(Σ(t − t̄)²), t quantile on n_eff − 2 df;
  the p value tests slope = 0 on the same law;
* **lag-1 autocorrelation** of the detrended residuals in time order, 95% interval by Fisher's z with
  se 1/sqrt(n − 3) (approximate for a serial correlation); clearly above 0 means a slow wander the line does not
  take, near 0 cell-to-cell noise only;
* **minute means**: the mean of y per window (``--window-min``, windows with ≥ 2 cells), their sd as a CV
  with a χ² interval on k − 1 df (exact for independent normal window means; a drift makes them dependent,
  and then the interval is too narrow), the part beyond the cell noise's share (σ²_between = s²_windows −
  MS_within/n̄, as a CV) and the one-way ANOVA F test of "every window has the same mean";

per cell type and metric, across the engines:

* **r(A, B)**: Pearson correlation of A's and B's window means over the windows both have, Fisher-z 95%
  interval (n − 3): a drift that follows the clock moves both engines (r well above 0); a level fixed per
  start does not (r near 0). Cell noise in a window mean pulls r towards 0, so a small r with wide
  windows of few cells is weak evidence;
* **A/B**: per loop the paired log-ratio y_A − y_B of the same cell; its mean with a t interval
  (n_eff from the pairs' own lag-1 autocorrelation as above), as a ratio: how far two warm starts of one
  mode sit apart, the number the race's A/A arm estimates;
* **conditions**: Pearson r (Fisher z) of the window's mean y over both engines with the window's mean GPU
  SM clock, GPU temperature and host CPU MHz ("constant" where the reading never moved).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

METRICS = ("itl_p50_ms", "ttft_p50_ms")


def cv(sd: float) -> float:
    return 100.0 * math.sqrt(math.expm1(max(sd, 0.0) ** 2))


def _design(df: pd.DataFrame, terms: list[str]) -> np.ndarray:
    cols = [np.ones(len(df))]
    for term in terms:
        dummies = pd.get_dummies(df[term].astype(str), drop_first=True, dtype=float)
        cols += [dummies[c].to_numpy() for c in dummies.columns]
    return np.column_stack(cols)


def _fit(df: pd.DataFrame, y: np.ndarray, terms: list[str]) -> tuple[float, int, np.ndarray]:
    x = _design(df, terms)
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ beta
    rank = int(np.linalg.matrix_rank(x))
    return float(resid @ resid), len(y) - rank, resid


def _f_test(df: pd.DataFrame, y: np.ndarray, small: list[str], big: list[str]) -> tuple[float, float, int, int]:
    rss0, df0, _ = _fit(df, y, small)
    rss1, df1, _ = _fit(df, y, big)
    num = (rss0 - rss1) / max(df0 - df1, 1)
    den = rss1 / df1
    f = num / den
    return f, float(stats.f.sf(f, df0 - df1, df1)), df0 - df1, df1


def _t_interval(values: np.ndarray) -> tuple[float, float, float]:
    m = float(np.mean(values))
    half = float(stats.t.ppf(0.975, len(values) - 1) * np.std(values, ddof=1) / math.sqrt(len(values)))
    return m, m - half, m + half


def _welch(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float, float]:
    d = float(np.mean(a) - np.mean(b))
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    se = math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(stats.t.ppf(0.975, dof)) * se
    p = float(2 * stats.t.sf(abs(d) / se, dof)) if se > 0 else float("nan")
    return d, d - half, d + half, p


def _r_interval(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, int]:
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    n = len(x)
    if n < 4 or np.std(x) == 0 or np.std(y) == 0:
        return float("nan"), float("nan"), float("nan"), n
    r = float(np.corrcoef(x, y)[0, 1])
    z, half = math.atanh(max(min(r, 0.999999), -0.999999)), 1.96 / math.sqrt(n - 3)
    return r, math.tanh(z - half), math.tanh(z + half), n


def analyse(cells: pd.DataFrame, cell: str, metric: str) -> dict[str, Any]:
    df = cells[(cells.cell == cell) & cells[metric].notna() & (cells[metric] > 0)].copy()
    df["start"] = df.slot.astype(str) + "." + df.start_no.astype(str)
    y = np.log(df[metric].to_numpy(float))
    out: dict[str, Any] = {"cell": cell, "metric": metric, "n_cells": len(df), "n_starts": df.start.nunique(),
                              "n_rounds": df["round"].nunique()}
    # Clock: rounds on top of starts.
    f, p, d1, d2 = _f_test(df, y, ["start"], ["start", "round"])
    out["clock_F"], out["clock_p"], out["clock_df"] = f, p, (d1, d2)
    # Start beyond its arm and its compile-cache state: starts on top of arm, cold/warm and round.
    df["state"] = df.arm + np.where(df.start_no == 1, ":cold", ":warm")
    f, p, d1, d2 = _f_test(df, y, ["state", "round"], ["start", "round"])
    out["start_F"], out["start_p"], out["start_df"] = f, p, (d1, d2)
    rss, dof, resid = _fit(df, y, ["start", "round"])
    sigma_e = math.sqrt(rss / dof)
    out["resid_sd"] = sigma_e
    out["resid_ci"] = (math.sqrt(rss / stats.chi2.ppf(0.975, dof)), math.sqrt(rss / stats.chi2.ppf(0.025, dof)))
    df["resid"] = resid
    lag = [float(np.corrcoef(g.resid.to_numpy()[:-1], g.resid.to_numpy()[1:])[0, 1])
           for _, g in df.sort_values("round").groupby("start") if len(g) >= 4]
    out["resid_lag1"] = float(np.nanmean(lag)) if lag else float("nan")
    # Start levels adjusted for the clock: y minus the round effects of the full model.
    x = _design(df, ["start", "round"])
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    round_cols = pd.get_dummies(df["round"].astype(str), drop_first=True, dtype=float)
    round_effect = round_cols.to_numpy() @ beta[-round_cols.shape[1]:]
    df["adj"] = y - round_effect
    starts = df.groupby("start").agg(arm=("arm", "first"), state=("state", "first"), slot=("slot", "first"),
                                     start_no=("start_no", "first"),
                                     lvl=("adj", "mean"), rounds=("adj", "size"))
    out["starts"] = starts
    within = starts["lvl"] - starts.groupby("state")["lvl"].transform("mean")
    k = len(starts) - starts.state.nunique()
    s2 = float((within**2).sum() / k)
    share = sigma_e**2 / float(starts.rounds.mean())
    out["start_sd"] = math.sqrt(max(s2 - share, 0.0))
    lo2, hi2 = s2 * k / stats.chi2.ppf(0.975, k), s2 * k / stats.chi2.ppf(0.025, k)
    out["start_ci"] = (math.sqrt(max(lo2 - share, 0.0)), math.sqrt(max(hi2 - share, 0.0)))
    # Round effects, centred, and their sd beyond the residual's share.
    rounds = df.groupby("round").agg(t=("t", "mean"), sm=("gpu_sm_clock_mhz_mean", "mean"),
                                     temp=("gpu_temp_c_max", "mean"), mhz=("host_mhz", "mean"))
    labels = sorted(df["round"].astype(str).unique())  # get_dummies' order; the first is the reference
    by_label = dict(zip(round_cols.columns, beta[-round_cols.shape[1]:], strict=True))
    eff = pd.Series({int(lab): float(by_label.get(lab, 0.0)) for lab in labels}).sort_index()
    rounds["effect"] = eff - eff.mean()
    per_round = len(df) / rounds.shape[0]
    out["round_sd"] = math.sqrt(max(float(rounds.effect.var(ddof=1)) - sigma_e**2 / per_round, 0.0))
    out["rounds"] = rounds
    out["corr"] = {c: _r_interval(rounds.effect.to_numpy(), rounds[c].to_numpy(float)) for c in ("sm", "temp", "mhz")}
    out["constant"] = {c: float(rounds[c].iloc[0]) for c in ("sm", "temp", "mhz")
                       if rounds[c].notna().all() and rounds[c].nunique() == 1}
    # Cell-to-cell noise per arm against base: F test of residual variances (df: cells − starts per arm,
    # an approximation that ignores the round effects' share of the degrees of freedom).
    noise = {}
    for arm in sorted(set(df.arm)):
        g = df[df.arm == arm]
        noise[arm] = (float((g.resid**2).sum()), len(g) - g.start.nunique())
    out["noise"] = {}
    for arm in sorted(set(noise) - {"base"}):
        (ra, da), (rb, db) = noise[arm], noise["base"]
        ratio_v = (ra / da) / (rb / db)
        lo, hi = ratio_v / stats.f.ppf(0.975, da, db), ratio_v / stats.f.ppf(0.025, da, db)
        p = 2 * min(stats.f.sf(ratio_v, da, db), stats.f.cdf(ratio_v, da, db))
        out["noise"][arm] = (math.sqrt(ratio_v), math.sqrt(lo), math.sqrt(hi), float(p))
    # Arms against base (start is the unit).
    base = starts.loc[starts.arm == "base", "lvl"].to_numpy()
    out["arms"] = {arm: _welch(starts.loc[starts.arm == arm, "lvl"].to_numpy(), base)
                   for arm in sorted(set(starts.arm) - {"base"})}
    # Warm vs cold, paired by slot.
    wide = starts.pivot_table(index="slot", columns="start_no", values="lvl")
    if {1, 2} <= set(wide.columns):
        diffs = (wide[2] - wide[1]).dropna().to_numpy()
        out["warm"] = (*_t_interval(diffs), len(diffs)) if len(diffs) >= 2 else None
    return out


def ratio(d: float) -> str:
    return f"{math.exp(d):.3f}×"


def _arm(r: dict[str, Any], name: str) -> str:
    if name not in r["arms"]:
        return "—"
    d, lo, hi, p = r["arms"][name]
    return f"{ratio(d)} [{ratio(lo)}–{ratio(hi)}] ({p:.2g})"


def _noise(r: dict[str, Any], name: str) -> str:
    if name not in r["noise"]:
        return "—"
    v, lo, hi, p = r["noise"][name]
    return f"{v:.2f} [{lo:.2f}–{hi:.2f}] (p {p:.2g})"


def _corr(r: dict[str, Any], name: str) -> str:
    if name in r["constant"]:
        return f"constant ({r['constant'][name]:g})"
    rr, lo, hi, n = r["corr"][name]
    return "—" if math.isnan(rr) else f"{rr:+.2f} [{lo:+.2f}, {hi:+.2f}] (n {n})"


def report(res: list[dict[str, Any]], starts_file: pd.DataFrame | None, md: bool) -> str:
    lines: list[str] = []
    sep = "|" if md else " "

    def row(*cells: object) -> None:
        lines.append((f"| {' | '.join(map(str, cells))} |") if md else "  ".join(map(str, cells)))

    row("cell", "metric", "n cells/starts/rounds", "start CV % within arm and cache state [95%]", "start F (p)",
        "clock CV % (round sd)", "clock F (p)", "residual CV % [95%]", "resid lag-1 r")
    if md:
        row(*["---"] * 9)
    for r in res:
        s_lo, s_hi = r["start_ci"]
        e_lo, e_hi = r["resid_ci"]
        row(r["cell"], r["metric"], f"{r['n_cells']}/{r['n_starts']}/{r['n_rounds']}",
            f"{cv(r['start_sd']):.1f} [{cv(s_lo):.1f}–{cv(s_hi):.1f}]", f"{r['start_F']:.2f} ({r['start_p']:.2g})",
            f"{cv(r['round_sd']):.1f}", f"{r['clock_F']:.2f} ({r['clock_p']:.2g})",
            f"{cv(r['resid_sd']):.1f} [{cv(e_lo):.1f}–{cv(e_hi):.1f}]", f"{r['resid_lag1']:.2f}")
    lines.append("")
    row("cell", "metric", "pinned / base [95%] (p)", "sync / base [95%] (p)", "warm / cold start [95%] (n)",
        "cell noise sd pinned / base [95%]", "cell noise sd sync / base [95%]",
        "r(round, SM clock)", "r(round, GPU °C)", "r(round, host MHz)")
    if md:
        row(*["---"] * 10)
    for r in res:
        warm = r.get("warm")
        w = f"{ratio(warm[0])} [{ratio(warm[1])}–{ratio(warm[2])}] ({warm[3]})" if warm else "—"
        row(r["cell"], r["metric"], _arm(r, "pinned"), _arm(r, "sync"), w, _noise(r, "pinned"), _noise(r, "sync"),
            _corr(r, "sm"), _corr(r, "temp"), _corr(r, "mhz"))
    lines.append("")
    first = res[0]["starts"]
    row("start (slot.n)", "arm", "cold", *[f"{r['cell']} {r['metric'].split('_')[0]} level" for r in res])
    if md:
        row(*["---"] * (3 + len(res)))
    for key in first.index:
        arm_name = first.loc[key, "arm"]
        levels = []
        for r in res:
            st = r["starts"]
            levels.append(f"{math.exp(st.loc[key, 'lvl']):.3f}" if key in st.index else "—")
        row(key, arm_name, "yes" if key.endswith(".1") else "no", *levels)
    if starts_file is not None and not starts_file.empty:
        lines.append("")
        row("wave", "engines", "started in s (wall)", "compile s (mean)", "capture s (mean)", "failed")
        if md:
            row(*["---"] * 6)
        for wave, g in starts_file.groupby("wave"):
            row(wave, len(g), f"{g.wall_s.max():.0f}", f"{g.compile_s.mean():.1f}", f"{g.capture_s.mean():.1f}",
                int((~g.ok).sum()))
    del sep
    return "\n".join(lines)


# ---- the long two-engine series (--series) ----------------------------------------------------------------

CONDITIONS = (("sm", "gpu_sm_clock_mhz_mean"), ("temp", "gpu_temp_c_max"), ("mhz", "host_mhz"))


def lag1(x: np.ndarray) -> float:
    """Lag-1 autocorrelation of *x* around its mean (the usual estimator: lagged products over the variance)."""
    e = x - x.mean()
    den = float(e @ e)
    return float(e[:-1] @ e[1:]) / den if len(x) >= 3 and den > 0 else float("nan")


def n_effective(n: int, r1: float) -> float:
    """Samples an AR(1) series of *n* is worth (Santer et al. 2000); no gain from a negative r₁."""
    if math.isnan(r1) or r1 <= 0:
        return float(n)
    return max(n * (1 - r1) / (1 + r1), 3.0)


def lag1_interval(x: np.ndarray) -> tuple[float, float, float, int]:
    r, n = lag1(x), len(x)
    if math.isnan(r) or n < 5:
        return float("nan"), float("nan"), float("nan"), n
    z, half = math.atanh(max(min(r, 0.999999), -0.999999)), 1.96 / math.sqrt(n - 3)
    return r, math.tanh(z - half), math.tanh(z + half), n


def trend(t_min: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """OLS slope per 10 minutes with a 95% interval widened for AR(1) residuals (see the module docstring)."""
    n = len(y)
    tc = t_min - t_min.mean()
    sxx = float(tc @ tc)
    if n < 4 or sxx == 0:
        nan = float("nan")
        return {"b10": nan, "lo": nan, "hi": nan, "p": nan, "r1": nan, "n_eff": float(n)}
    b = float(tc @ (y - y.mean())) / sxx
    resid = y - y.mean() - b * tc
    r1 = lag1(resid)
    n_eff = n_effective(n, r1)
    dof = max(n_eff - 2, 1.0)
    se = math.sqrt(float(resid @ resid) / dof / sxx)
    q = float(stats.t.ppf(0.975, dof))
    p = float(2 * stats.t.sf(abs(b) / se, dof)) if se > 0 else float("nan")
    return {"b10": 10 * b, "lo": 10 * (b - q * se), "hi": 10 * (b + q * se), "p": p, "r1": r1, "n_eff": n_eff}


def minute_means(t_min: np.ndarray, y: np.ndarray, window_min: float) -> dict[str, Any]:
    """Window means of *y*, their sd (χ² interval), the sd beyond the cell noise, and the ANOVA F test."""
    df = pd.DataFrame({"w": np.floor(t_min / window_min).astype(int), "y": y})
    sizes = df.groupby("w").y.transform("size")
    df = df[sizes >= 2]
    groups = [g.y.to_numpy() for _, g in df.groupby("w")]
    k = len(groups)
    out: dict[str, Any] = {"k": k, "means": df.groupby("w").y.mean()}
    if k < 3:
        out.update(sd=float("nan"), ci=(float("nan"), float("nan")), excess_sd=float("nan"), F=float("nan"),
                   p=float("nan"))
        return out
    means = np.array([g.mean() for g in groups])
    s2 = float(np.var(means, ddof=1))
    out["sd"] = math.sqrt(s2)
    out["ci"] = (math.sqrt(s2 * (k - 1) / stats.chi2.ppf(0.975, k - 1)),
                 math.sqrt(s2 * (k - 1) / stats.chi2.ppf(0.025, k - 1)))
    within = sum(float(((g - g.mean()) ** 2).sum()) for g in groups) / (len(df) - k)
    n_bar = len(df) / k
    out["excess_sd"] = math.sqrt(max(s2 - within / n_bar, 0.0))
    f, p = stats.f_oneway(*groups)
    out["F"], out["p"] = float(f), float(p)
    return out


def paired_ratio(d: np.ndarray) -> dict[str, float]:
    """Mean paired log-ratio with a t interval on n_eff (the pairs' own AR(1) serial correlation)."""
    n = len(d)
    if n < 3:
        nan = float("nan")
        return {"d": nan, "lo": nan, "hi": nan, "n": float(n), "n_eff": float(n)}
    n_eff = n_effective(n, lag1(d))
    m = float(d.mean())
    se = float(np.std(d, ddof=1)) / math.sqrt(n_eff)
    q = float(stats.t.ppf(0.975, max(n_eff - 1, 1.0)))
    return {"d": m, "lo": m - q * se, "hi": m + q * se, "n": float(n), "n_eff": n_eff}


def _series_cells(cells: pd.DataFrame) -> pd.DataFrame:
    need = {"engine", "cell", "elapsed_s", "loop"}
    if not need <= set(cells.columns):
        raise ValueError(f"not a series: cells.jsonl lacks {sorted(need - set(cells.columns))} "
                         f"(bench/gpu/series.py writes them)")
    df = cells.copy()
    df["t_min"] = df.elapsed_s.astype(float) / 60.0
    for _, col in CONDITIONS:
        if col not in df.columns:
            df[col] = np.nan
    return df


def analyse_series(cells: pd.DataFrame, cell: str, metric: str, window_min: float = 1.0) -> dict[str, Any]:
    """Every --series statistic of one cell type and metric (module docstring); engines in name order."""
    if metric not in cells.columns:
        raise ValueError(f"cells.jsonl has no {metric}")
    df = _series_cells(cells)
    df = df[(df.cell == cell) & df[metric].notna()]
    df = df[df[metric].astype(float) > 0].sort_values("t_min")
    df = df.assign(y=np.log(df[metric].to_numpy(float)))
    out: dict[str, Any] = {"cell": cell, "metric": metric, "engines": {}}
    for eng, g in df.groupby("engine"):
        t, y = g.t_min.to_numpy(float), g.y.to_numpy(float)
        out["engines"][str(eng)] = {"n": len(g), "level": float(np.exp(y.mean())), "trend": trend(t, y),
                                    "lag1": lag1_interval(y - (y.mean() + _slope(t, y) * (t - t.mean()))),
                                    "minutes": minute_means(t, y, window_min)}
    names = sorted(out["engines"])
    out["pair"] = names
    if len(names) == 2:
        a, b = (out["engines"][n]["minutes"]["means"] for n in names)
        both = pd.concat([a.rename("a"), b.rename("b")], axis=1).dropna()
        out["r_ab"] = _r_interval(both.a.to_numpy(), both.b.to_numpy())
        wide = df.pivot_table(index="loop", columns="engine", values="y", aggfunc="mean").dropna()
        out["ratio"] = paired_ratio((wide[names[0]] - wide[names[1]]).to_numpy(float))
    win = df.assign(w=np.floor(df.t_min / window_min).astype(int)).groupby("w")
    per_w = win.agg(y=("y", "mean"), n=("y", "size"), **{k: (col, "mean") for k, col in CONDITIONS})
    per_w = per_w[per_w.n >= 2]
    out["corr"], out["constant"] = {}, {}
    for k, _ in CONDITIONS:
        vals = per_w[k].to_numpy(float)
        finite = vals[np.isfinite(vals)]
        if len(finite) and len(finite) == len(vals) and np.unique(finite).size == 1:
            out["constant"][k] = float(finite[0])
        out["corr"][k] = _r_interval(per_w.y.to_numpy(float), vals)
    return out


def _slope(t: np.ndarray, y: np.ndarray) -> float:
    tc = t - t.mean()
    sxx = float(tc @ tc)
    return float(tc @ (y - y.mean())) / sxx if sxx > 0 else 0.0


def series_report(res: list[dict[str, Any]], starts_file: pd.DataFrame | None, md: bool,
                  window_min: float) -> str:
    lines: list[str] = []

    def row(*cells: object) -> None:
        lines.append((f"| {' | '.join(map(str, cells))} |") if md else "  ".join(map(str, cells)))

    def nan_or(x: float, text: str) -> str:
        return "—" if math.isnan(x) else text

    head = ("engine", "cell", "metric", "cells", "level (geo mean)", "trend per 10 min [95%] (p)",
            "lag-1 r of residuals [95%]", f"{window_min:g}-min means: CV % [95%] (windows)", "beyond cell noise CV %",
            "windows differ: F (p)")
    row(*head)
    if md:
        row(*["---"] * len(head))
    for r in res:
        for eng, e in sorted(r["engines"].items()):
            tr, (l1, l1lo, l1hi, _), mm = e["trend"], e["lag1"], e["minutes"]
            row(eng, r["cell"], r["metric"], e["n"], f"{e['level']:.3f}",
                nan_or(tr["b10"], f"{ratio(tr['b10'])} [{ratio(tr['lo'])}–{ratio(tr['hi'])}] ({tr['p']:.2g})"),
                nan_or(l1, f"{l1:+.2f} [{l1lo:+.2f}, {l1hi:+.2f}]"),
                nan_or(mm["sd"], f"{cv(mm['sd']):.1f} [{cv(mm['ci'][0]):.1f}–{cv(mm['ci'][1]):.1f}] ({mm['k']})"),
                nan_or(mm["excess_sd"], f"{cv(mm['excess_sd']):.1f}"),
                nan_or(mm["F"], f"{mm['F']:.2f} ({mm['p']:.2g})"))
    lines.append("")
    head = ("cell", "metric", "r(A, B minute means) [95%] (n)", "A/B [95%] (pairs, n_eff)", "r(minute, SM clock)",
            "r(minute, GPU °C)", "r(minute, host MHz)")
    row(*head)
    if md:
        row(*["---"] * len(head))
    for r in res:
        if "r_ab" not in r:
            row(r["cell"], r["metric"], f"one engine only ({', '.join(r['pair'])})", "—", "—", "—", "—")
            continue
        rr, lo, hi, n = r["r_ab"]
        q = r["ratio"]
        row(r["cell"], r["metric"], "—" if math.isnan(rr) else f"{rr:+.2f} [{lo:+.2f}, {hi:+.2f}] ({n})",
            nan_or(q["d"], f"{ratio(q['d'])} [{ratio(q['lo'])}–{ratio(q['hi'])}] ({q['n']:.0f}, {q['n_eff']:.0f})"),
            _corr(r, "sm"), _corr(r, "temp"), _corr(r, "mhz"))
    if starts_file is not None and not starts_file.empty:
        lines.append("")
        head = ("engine", "start", "kind", "ok", "startup s", "compile s", "capture s", "wall s (wave)")
        row(*head)
        if md:
            row(*["---"] * len(head))
        for _, s in starts_file.sort_values(["start_no", "slot"]).iterrows():
            def num(key: str, s: pd.Series = s) -> str:
                v = s.get(key)
                return "—" if v is None or pd.isna(v) else f"{float(v):.1f}"
            kind = "compile" if s.get("wave") == 0 else ("measured, cold" if s.get("cold") else "measured, warm")
            row(s.get("arm"), s.get("start_no"), kind, "yes" if s.get("ok") else f"no: {s.get('error')}",
                num("startup_s"), num("compile_s"), num("capture_s"), num("wall_s"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--series", action="store_true", help="DIR is a bench/gpu/series.py run")
    ap.add_argument("--window-min", type=float, default=1.0, help="--series: minutes per window (default 1)")
    args = ap.parse_args(argv)
    if not args.window_min > 0:
        ap.error("--window-min must be positive")
    try:
        cells = pd.read_json(args.dir / "cells.jsonl", lines=True)
    except (OSError, ValueError) as exc:
        print(f"cannot read {args.dir / 'cells.jsonl'}: {exc}", file=sys.stderr)
        return 2
    starts_file = None
    if (args.dir / "starts.jsonl").exists():
        starts_file = pd.read_json(args.dir / "starts.jsonl", lines=True)
    if "cell" not in cells.columns or cells.empty:
        print(f"{args.dir / 'cells.jsonl'}: no cells", file=sys.stderr)
        return 2
    if args.series:
        try:
            sres = [analyse_series(cells, cell, metric, args.window_min)
                    for cell in sorted(cells.cell.unique()) for metric in METRICS]
        except ValueError as exc:
            print(f"{args.dir}: {exc}", file=sys.stderr)
            return 2
        print(series_report(sres, starts_file, args.markdown, args.window_min))
        return 0
    res = [analyse(cells, cell, metric) for cell in sorted(cells.cell.unique()) for metric in METRICS]
    print(report(res, starts_file, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
