"""bench/race_windows.py on synthetic race rows: the window check of the fixed warm-up."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.bench import load_bench


def _load() -> ModuleType:
    return load_bench("race_windows")


rw = _load()


def _row(race: str, rnd: int, arm: str, warm: float, itl: float, sent: int, t: float = 0.0) -> dict[str, Any]:
    return {"race_id": race, "race_round": rnd, "workload": "w", "race_arm": arm, "status": "ok",
            "warmup_used_s": warm, "itl_p50": itl, "ttft_p50": itl * 10, "n_sent": sent, "started_at": t + rnd}


def test_a_first_finish_warm_up_shows_and_a_fixed_one_does_not() -> None:
    rows = []
    for rnd in range(6):
        shift = 0.1 * (rnd % 3)  # the arm's window starts later: more running, slower tokens
        rows.append(_row("old", rnd, "FULL_AND_PIECEWISE", 0.8, 0.003, 100))
        rows.append(_row("old", rnd, "FULL", 0.8 + shift, 0.003 * math.exp(shift), 100 + 2 * (rnd % 3)))
        rows.append(_row("new", rnd, "FULL_AND_PIECEWISE", 2.0, 0.003, 100, t=100))
        rows.append(_row("new", rnd, "FULL", 2.0, 0.003 * (1 + 0.01 * (rnd % 2)), 100, t=100))
    (old,) = rw.arm_windows(rows, "d.sqlite", "old")
    assert old.arm == "FULL" and old.pairs == 6
    assert old.sd_dwarm == pytest.approx(0.0816, abs=1e-3) and old.r_itl == pytest.approx(1.0)
    assert old.mean_dsent == pytest.approx(2.0) and old.share_dsent == pytest.approx(2 / 3)
    # within-group sd of ln ratio (shifts 0, 0.1, 0.2 twice: sqrt(0.04 / 5)), and ~0 with Δwarm-up regressed out
    assert old.sd_itl == pytest.approx(math.sqrt(0.04 / 5)) and old.sd_itl_fixed == pytest.approx(0.0, abs=1e-9)
    (new,) = rw.arm_windows(rows, "d.sqlite", "new")
    assert new.sd_dwarm == 0.0 and new.mean_dsent == 0.0 and new.r_itl is None  # fixed: no spread to correlate
    assert rw.races_of(rows, "latest") == ["new"] and rw.races_of(rows, "all") == ["old", "new"]
    assert rw.races_of(rows, "nope") == []
    text = rw.render([old, new], markdown=True)
    assert "| d.sqlite | old | FULL | 6 | 0.08 | 2.0 | 67% | 1.00 |" in text and "| - | - |" in text


def test_a_start_effect_is_not_read_as_a_window_effect() -> None:
    """Two starts of the arm: the second is 5% slower and happened to warm up longer. Within each start
    the warm-up does not move the ratio, so the correlation (within start groups) is ~0, not ~1."""
    rows = []
    for rnd in range(8):
        second = rnd >= 4
        warm = 1.0 + (0.5 if second else 0.0) + 0.01 * (rnd % 2)
        ratio = (1.05 if second else 1.0) * (1.0 + 0.02 * ((rnd // 2) % 2))
        rows.append({**_row("r", rnd, "FULL_AND_PIECEWISE", 1.0, 0.003, 100), "race_start_id": "d1"})
        rows.append({**_row("r", rnd, "FULL", warm, 0.003 * ratio, 100), "race_start_id": f"a{int(second)}"})
    (line,) = rw.arm_windows(rows, "d.sqlite", "r")
    assert line.r_itl is not None and abs(line.r_itl) < 0.2, line
    assert line.sd_dwarm is not None and line.sd_dwarm > 0.2  # the raw spread is there: the groups remove it


def test_an_open_loop_feedback_shows_as_itl_following_the_batch() -> None:
    """One plan per round; the arm's engine is a little slower in some rounds and so holds more requests,
    and its steps slow with the batch (step ∝ batch^0.8): the paired log ratios line up, slope 0.8."""
    rows = []
    for rnd in range(8):
        lb = 0.3 * ((rnd * 5) % 7 - 3) / 3  # ln(arm's batch / default's), -0.3 .. 0.3
        d = {**_row("r", rnd, "FULL_AND_PIECEWISE", 2.0, 0.003, 90), "obs_batch_mean": 40.0}
        a = {**_row("r", rnd, "low", 2.0, 0.003 * math.exp(0.8 * lb), 90), "obs_batch_mean": 40.0 * math.exp(lb)}
        rows += [d, a]
    rows.append({**_row("r", 9, "FULL_AND_PIECEWISE", 2.0, 0.003, 90), "obs_batch_mean": 0.0})  # no batch: skipped
    rows.append({**_row("r", 9, "low", 2.0, 0.003, 90), "obs_batch_mean": 0.0})
    (line,) = rw.arm_windows(rows, "d.sqlite", "r")
    assert line.r_batch == pytest.approx(1.0) and line.slope_batch == pytest.approx(0.8)
    assert "| 1.00 | 0.80 |" in rw.render([line], markdown=True)
    # closed loop: the batch is held, nothing to correlate
    held = [{**r, "obs_batch_mean": 40.0} for r in rows]
    (line,) = rw.arm_windows(held, "d.sqlite", "r")
    assert line.r_batch is None and line.slope_batch is None


def test_bad_paths_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert rw.main([str(tmp_path / "missing.sqlite")]) == 2
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not sqlite")
    assert rw.main([str(junk)]) == 2
    assert "cannot read" in capsys.readouterr().err
