"""``bench/start_effect_stats.py --series`` on synthetic two-engine series whose truth is known: a linear trend,
a drift common to both engines, a fixed gap between two starts, AR(1) noise, and none of these."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
import pytest

from tests.support.bench import load_bench

ROOT = Path(__file__).resolve().parents[2]


def load() -> ModuleType:
    return load_bench("start_effect_stats")


S = load()


def ar1(rng: np.random.Generator, n: int, rho: float, sd: float) -> np.ndarray:
    """AR(1) noise with marginal sd *sd*."""
    e = rng.normal(0, sd * math.sqrt(1 - rho**2), n)
    x = np.empty(n)
    x[0] = rng.normal(0, sd)
    for i in range(1, n):
        x[i] = rho * x[i - 1] + e[i]
    return x


def series(seed: int, *, minutes: float = 20.0, loops: int = 200, slope10: float = 0.0, common_sd: float = 0.0,
           gap: float = 0.0, noise: float = 0.10, rho: float = 0.0) -> pd.DataFrame:
    """Rows like bench/gpu/series.py's: per loop A then B (ABBA), cells c1 and c8; y = ln(itl) =
    ln 1.5 (+ gap on A) + slope10·t/10 + a common drift (a smooth random walk, both engines) + own noise."""
    rng = np.random.default_rng(seed)
    per_loop = minutes * 60 / loops
    # the common drift: a random walk over minutes, interpolated, scaled to sd common_sd
    knots = np.cumsum(rng.normal(0, 1, int(minutes) + 2))
    knots = (knots - knots.mean()) / (knots.std() or 1) * common_sd
    noise_by = {(e, c): ar1(rng, loops, rho, noise) for e in "AB" for c in ("c1", "c8")}
    temp_by_min = 40 + 4 * knots / (common_sd or 1)
    rows = []
    for loop in range(loops):
        for pos, eng in enumerate("AB" if loop % 2 == 0 else "BA"):
            for k, cell in enumerate(("c1", "c8")):
                t = loop * per_loop + pos * per_loop / 2 + k * per_loop / 4
                m = t / 60
                drift = float(np.interp(m, np.arange(len(knots)), knots))
                y = math.log(1.5) + (gap if eng == "A" else 0.0) + slope10 * m / 10 + drift \
                    + noise_by[(eng, cell)][loop]
                rows.append({"loop": loop, "pos": pos, "engine": eng, "slot": "AB".index(eng), "start_no": 2,
                             "cell": cell, "elapsed_s": t, "t": 1.8e9 + t, "itl_p50_ms": math.exp(y),
                             "ttft_p50_ms": math.exp(y) * 10, "gpu_sm_clock_mhz_mean": 1980.0,
                             "gpu_temp_c_max": float(np.interp(m, np.arange(len(knots)), temp_by_min)),
                             "host_mhz": 2100.0})
    return pd.DataFrame(rows)


def test_a_known_trend_is_inside_its_interval_and_no_trend_is_not_found() -> None:
    r = S.analyse_series(series(1, slope10=math.log(1.10)), "c1", "itl_p50_ms")
    for eng in "AB":
        tr = r["engines"][eng]["trend"]
        assert tr["lo"] <= math.log(1.10) <= tr["hi"]
        assert tr["lo"] > 0 and tr["p"] < 0.001
    flat = S.analyse_series(series(2), "c1", "itl_p50_ms")
    for eng in "AB":
        tr = flat["engines"][eng]["trend"]
        assert tr["lo"] <= 0 <= tr["hi"]


def test_the_trend_interval_keeps_its_coverage_under_serially_correlated_noise() -> None:
    # AR(1) noise with ρ = 0.6 makes the plain OLS interval far too narrow; the n_eff one should cover the
    # true slope in about 95% of series (tolerance for 200 draws and the approximation).
    rng = np.random.default_rng(7)
    t = np.linspace(0, 20, 200)
    truth = 0.05
    hits = plain_hits = 0
    for _ in range(200):
        y = truth * t / 10 + ar1(rng, len(t), 0.6, 0.1)
        tr = S.trend(t, y)
        hits += tr["lo"] <= truth <= tr["hi"]
        b = np.polyfit(t, y, 1)[0]
        resid = y - np.polyval(np.polyfit(t, y, 1), t)
        se = math.sqrt(float(resid @ resid) / (len(t) - 2) / float(((t - t.mean()) ** 2).sum()))
        plain_hits += abs(10 * b - truth) <= 1.97 * 10 * se
    assert hits / 200 >= 0.88
    assert plain_hits / 200 < 0.85  # the correction is needed, not cosmetic


def test_lag1_interval_covers_the_true_autocorrelation() -> None:
    rng = np.random.default_rng(3)
    r, lo, hi, n = S.lag1_interval(ar1(rng, 400, 0.5, 1.0))
    assert n == 400 and abs(r - 0.5) < 0.15 and lo <= 0.5 <= hi and lo > 0.3
    _r, lo, hi, _ = S.lag1_interval(rng.normal(0, 1, 400))
    assert lo <= 0 <= hi


def test_a_common_drift_correlates_the_engines_minute_means() -> None:
    r = S.analyse_series(series(4, common_sd=0.08), "c1", "itl_p50_ms")
    rr, lo, _hi, n = r["r_ab"]
    # the clock moves both engines: detected (the expected r is about 0.8: drift sd 0.08 against a minute
    # mean's noise of 0.10/sqrt(10))
    assert n >= 19 and rr > 0.6 and lo > 0.25
    for eng in "AB":
        mm = r["engines"][eng]["minutes"]
        assert mm["p"] < 0.001 and mm["excess_sd"] > 0.04
    # GPU temperature was made to follow the drift; the SM clock and host MHz never moved
    assert r["corr"]["temp"][1] > 0.5
    assert r["constant"] == {"sm": 1980.0, "mhz": 2100.0}


def test_without_a_common_drift_the_engines_do_not_correlate_and_minute_means_are_noise() -> None:
    r = S.analyse_series(series(5), "c8", "itl_p50_ms")
    _rr, lo, hi, _n = r["r_ab"]
    assert lo <= 0 <= hi
    for eng in "AB":
        mm = r["engines"][eng]["minutes"]
        # 10 cells a minute with sd 0.10: the true sd of a minute mean is 0.10 / sqrt(10)
        truth = 0.10 / math.sqrt(10)
        assert mm["ci"][0] <= truth <= mm["ci"][1]
        assert mm["p"] > 0.01


def test_the_paired_ratio_recovers_a_fixed_gap_between_two_starts_through_a_common_drift() -> None:
    gap = math.log(1.06)
    r = S.analyse_series(series(6, gap=gap, common_sd=0.08), "c1", "itl_p50_ms")
    q = r["ratio"]
    assert q["n"] == 200
    assert q["lo"] <= gap <= q["hi"] and q["lo"] > 0  # pairing in time takes the drift out
    same = S.analyse_series(series(8), "c1", "itl_p50_ms")["ratio"]
    assert same["lo"] <= 0 <= same["hi"]


def test_paired_ratio_interval_widens_for_serially_correlated_pairs() -> None:
    rng = np.random.default_rng(9)
    d = ar1(rng, 200, 0.7, 0.1)
    q = S.paired_ratio(d)
    assert q["n_eff"] < 60
    assert q["lo"] <= 0 <= q["hi"]


def write(dir_: Path, cells: pd.DataFrame) -> None:
    dir_.mkdir(parents=True, exist_ok=True)
    with (dir_ / "cells.jsonl").open("w") as f:
        for rec in cells.to_dict(orient="records"):
            f.write(json.dumps(rec) + "\n")
    starts = [{"slot": i, "arm": e, "start_no": n, "wave": n - 1, "cold": n == 1, "ok": True, "error": None,
               "wall_s": 60.0, "startup_s": 55.0, "compile_s": 20.0 if n == 1 else 3.0, "capture_s": 4.0}
              for n in (1, 2) for i, e in enumerate("AB")]
    (dir_ / "starts.jsonl").write_text("".join(json.dumps(s) + "\n" for s in starts))


def test_main_prints_both_tables_and_the_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "run", series(10, common_sd=0.05))
    assert S.main(["--series", str(tmp_path / "run"), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.count("| A | c1 | itl_p50_ms | 200 |") == 1 and "| B | c8 | ttft_p50_ms | 200 |" in out
    assert "| c1 | itl_p50_ms | +0." in out  # r(A, B) row
    assert "| A | 1 | compile | yes |" in out and "| B | 2 | measured, warm | yes |" in out
    assert "constant (1980)" in out


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert S.main(["--series", str(tmp_path / "missing")]) == 2
    assert "cannot read" in capsys.readouterr().err
    # a start_effect.py run (rounds, no engines) is not a series
    d = tmp_path / "rounds"
    d.mkdir()
    (d / "cells.jsonl").write_text(json.dumps({"round": 0, "slot": 0, "cell": "c1", "itl_p50_ms": 1.0}) + "\n")
    assert S.main(["--series", str(d)]) == 2
    assert "not a series" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        S.main(["--series", str(d), "--window-min", "0"])
