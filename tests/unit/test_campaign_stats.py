"""``bench/campaign_stats.py`` on the committed H200 datasets and on bad input."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.bench import load_bench

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "models" / "profiles"


def load() -> ModuleType:
    return load_bench("campaign_stats")


def test_tables_from_the_committed_datasets(capsys: pytest.CaptureFixture[str]) -> None:
    stats = load()
    paths = sorted(PROFILES.glob("h200-*.sqlite"))
    assert len(paths) == 3
    assert stats.main([str(p) for p in paths]) == 0
    out = capsys.readouterr().out
    slices = [line for line in out.splitlines() if line.startswith("| llama-3.1-8b | 2026")]
    assert "| 0 | 120 | 5 |" in slices[0]  # repeat 0 came first: 120 cells, one start per mode
    assert "| 1 | 120 | 5 |" in slices[1]  # repeat 1: a fresh start per mode
    # every mode of every shape has a median row; NONE never captures graphs
    section = out.split("Medians")[1].split("Paired")[0]
    medians = [line for line in section.splitlines() if line.startswith("| ")][2:]
    assert len(medians) == 15
    assert all(" | 0 | " in line for line in medians if "| NONE |" in line)
    # paired inside a round on one GPU: the 8B shape's repeats 0 and 1 each pair all four modes with the default
    paired = [line for line in out.split("Paired")[1].split("Across paired rounds")[0].splitlines()
              if line.startswith("| llama-3.1-8b |")]
    assert len(paired) >= 8 and all("| 24 |" in line for line in paired if "| FULL |" in line)
    # whether the rounds agree: NONE loses to the default on ITL in every paired round of every shape
    verdicts = [line for line in out.split("Across paired rounds")[1].split("Conditions")[0].splitlines()
                if line.startswith("| ")][2:]
    assert len(verdicts) == 3 * 4 * 2  # shapes × modes other than the default × (ITL, TTFT)
    assert all(line.endswith("| higher |") for line in verdicts if "| NONE | itl_p50 |" in line)


def test_noise_pairs_starts_of_the_same_cell(tmp_path: Path) -> None:
    stats = load()
    rows = [
        {"mode": "FULL", "workload": "w", "repeat": r, "itl_p50": v, "ttft_p50": 2 * v}
        for r, v in enumerate([0.010, 0.012, 0.011])
    ] + [{"mode": "NONE", "workload": "w", "repeat": 0, "itl_p50": 0.05, "ttft_p50": 0.1}]
    (line,) = stats.noise("s", rows)  # NONE has one start: no noise row
    assert line[:4] == ["s", "FULL", 1, 3]
    assert line[4].startswith("1.15 (1.10–1.20)")
    assert line[5].startswith("9.1%")


def test_bad_dataset_is_a_clear_error(tmp_path: Path) -> None:
    stats = load()
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(SystemExit, match="not a graphmode profile dataset"):
        stats.main([str(junk)])
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()
    with pytest.raises(SystemExit, match="not a graphmode profile dataset"):
        stats.main([str(empty)])
    with pytest.raises(SystemExit, match="no such dataset"):
        stats.main([str(tmp_path / "missing.sqlite")])


def test_conditions_per_engine_start() -> None:
    stats = load()
    base = {"run_id": "r", "repeat": 0, "mode": "FULL", "workload": "w", "started_at": 1.0}
    rows = [
        {**base, "itl_p50": 0.002, "gpu_sm_clock_mhz_mean": 1980.0, "gpu_power_w_mean": 300.0,
         "gpu_util_pct_mean": 50.0, "host_load_1m": 4.0, "engine_numa_nodes": "1", "gpu_numa_node": 0},
        {**base, "itl_p50": 0.004, "gpu_sm_clock_mhz_mean": 1960.0, "gpu_power_w_mean": 320.0,
         "gpu_util_pct_mean": 70.0, "host_load_1m": 6.0, "engine_numa_nodes": "0,1", "gpu_numa_node": 0},
        {**base, "mode": "NONE", "itl_p50": 0.01},  # an older row: no conditions, no line
    ]
    rows[0] |= {"gpu_uuid": "GPU-8c509d5a-1234", "host_probe_ms": 7.0, "host_steal_pct": 0.5, "host_busy_pct": 10.0,
                "engine_cpu_cores": 1.5, "engine_nivcsw_per_s": 20.0}
    rows[1] |= {"host_probe_ms": 9.0, "host_steal_pct": 1.5, "host_busy_pct": 20.0, "engine_cpu_cores": 2.5}
    assert stats.conditions("s", rows) == [
        ["s", "r", 0, "FULL", "8c509d5a", 2, "3.00", "1970", "310", "60", "5", "0,1 1", 0, "8.00", "1.00", "15",
         "2.00", "20"]]


def test_repeat_filter_compares_modes_over_the_same_rounds(capsys: pytest.CaptureFixture[str]) -> None:
    stats = load()
    path = PROFILES / "h200-llama-3.1-8b.sqlite"
    assert stats.main([str(path), "--repeats", "0"]) == 0
    out = capsys.readouterr().out
    slices = [line for line in out.splitlines() if line.startswith("| llama-3.1-8b | 2026")]
    assert len(slices) == 1 and "| 0 | 120 | 5 |" in slices[0]
    assert "Noise between" in out and "| llama-3.1-8b | FULL |" not in out.split("Noise")[1].split("Medians")[0]
    for bad in ("x", "-1", ","):
        with pytest.raises(SystemExit):
            stats.main([str(path), "--repeats", bad])
    assert "expected repeats like 0,1" in capsys.readouterr().err
