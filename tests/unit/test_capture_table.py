"""bench/capture_table.py on a small SYNTHETIC dataset: a race of vLLM's default list against a sizes arm over
two loads (two engine starts each), plus lone profile starts of both lists, as bench/gpu/capture_chain.sh
writes them. Not measurements."""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
from pathlib import Path
from types import ModuleType

from graphmode.core.dataset import ProfileStore
from graphmode.core.records import (
    CellRecord,
    Fingerprint,
    LatencyStats,
    ObservedFeatures,
    RaceInfo,
    RunConditions,
    StartupInfo,
)
from graphmode.selector.capture_costs import default_capture_sizes
from tests.support.bench import load_bench

BENCH = Path(__file__).resolve().parents[2] / "bench"
LOW = [1, 2, 4, 8]
DEFAULT = default_capture_sizes(256)
SPEC = {"rate": 2.0}


def _load() -> ModuleType:
    return load_bench("capture_table")


def _args(sizes: list[int] | None) -> list[str]:
    args = ["--model", "/m", "--max-model-len", "4096"]
    if sizes:
        args += ["--compilation-config", json.dumps({"cudagraph_capture_sizes": sizes})]
    return args


def _startup(sizes: list[int], lone: bool, jitter: float) -> StartupInfo:
    n = len(sizes)
    # a lone start is the chain's cold first start (compile): never the start-up column's source
    return StartupInfo(startup_s=(240 if lone else 40) + n * 0.2 + jitter, capture_s=0.1 * n + jitter / 10,
                       graph_gib=(0.01 * n if lone else -3.0), kv_cache_tokens=(2_000_000 - 800 * n) if lone
                       else 700_000, capture_sizes=sizes)


def _row(run: str, arm: str, sizes: list[int] | None, workload: str, rnd: int, itl: float, start: str | None,
         lone: bool = False, batch: float = 2.0) -> CellRecord:
    resolved = sizes or DEFAULT
    race = RaceInfo() if lone else RaceInfo(id="race-synth", round=rnd, arm=arm, requested_mode="FULL_AND_PIECEWISE",
                                            start_id=start, capture_sizes=sizes)
    return CellRecord(
        run_id=run, profile_key="p", mode="FULL_AND_PIECEWISE", workload=workload, workload_spec=SPEC, repeat=rnd,
        status="ok", started_at=1000.0 + rnd, finished_at=1001.0 + rnd,
        latency=LatencyStats(itl_p50=itl, ttft_p50=itl * 5),
        startup=_startup(resolved, lone, jitter=(hash(start) % 7) / 10 if start else 0.0),
        fingerprint=Fingerprint(model_architecture="Qwen2ForCausalLM", num_params_b=0.5,
                                vllm_args=_args(sizes)),
        features=ObservedFeatures(batch_max=batch, frontend_cpu_cores=0.97 if batch > 50 else 0.2),
        conditions=RunConditions(gpu_util_pct_mean=12.0 if batch > 50 else 30.0), race=race)


def write_dataset(path: Path) -> None:
    rng = random.Random(7)
    with ProfileStore(path) as store:
        for sizes, run in ((None, "lone-d"), (LOW, "lone-low")):
            store.append(_row(run, "", sizes, "cap-low-r2", 0, 0.002, None, lone=True), "h")
        for rnd in range(24):
            w = ("cap-low-r2", "cap-high-r32")[rnd % 2]
            # two starts of each arm in the race's chain of blocks: (A1, D1), (A1, D2), (A2, D2)
            kd, ka = 1 + (rnd >= 8), 1 + (rnd >= 16)
            base = 0.002 if w == "cap-low-r2" else 0.004
            noise = math.exp(rng.gauss(0, 0.002))
            store.append(_row("race-run", "FULL_AND_PIECEWISE", None, w, rnd, base, f"r:FULL_AND_PIECEWISE:{kd}",
                              batch=3 if w == "cap-low-r2" else 60), "h")
            # the short list: equivalent at low load, un-graphed decode steps (1.5x) at high load
            arm_itl = base * noise * (1.0 if w == "cap-low-r2" else 1.5)
            store.append(_row("race-run", "low", LOW, w, rnd, arm_itl, f"r:low:{ka}"), "h")


def test_latest_keeps_each_datasets_newest_race(tmp_path: Path) -> None:
    """A dataset seeded into a later lease holds the old race too; --latest shows only the newest."""
    ds = tmp_path / "cap.sqlite"
    write_dataset(ds)
    with ProfileStore(ds) as store:  # the same race again, later, under a new key (a changed cell design)
        store._db.execute(
            "INSERT INTO cells (run_id, profile_key, mode, workload, workload_hash, repeat, status, started_at, "
            "finished_at, workload_spec, race_id, race_round, race_arm, race_start_id, race_capture_sizes, "
            "itl_p50, ttft_p50, fp_vllm_args, capture_sizes) SELECT run_id || '-2', profile_key, mode, workload, "
            "workload_hash, repeat, status, started_at + 1e6, finished_at + 1e6, workload_spec, 'race-synth2', "
            "race_round, race_arm, race_start_id, race_capture_sizes, itl_p50, ttft_p50, fp_vllm_args, "
            "capture_sizes FROM cells WHERE race_id = 'race-synth'")
    mod = _load()
    every = mod.table_lines(ds, mod.SequentialRule(min_starts=2))
    newest = mod.table_lines(ds, mod.SequentialRule(min_starts=2), latest=True)
    assert {ln.race for ln in every} == {"race-synth", "race-synth2"}
    assert {ln.race for ln in newest} == {"race-synth2"} and len(newest) == len(every) // 2


def test_capture_table_on_a_synthetic_race(tmp_path: Path) -> None:
    ds = tmp_path / "cap.sqlite"
    write_dataset(ds)
    mod = _load()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert mod.main([str(ds), "--markdown"]) == 0
    out = buf.getvalue()
    lines = [ln for ln in out.splitlines() if ln.startswith("| Qwen2ForCausalLM 0.5B")]
    by_workload = {ln.split(" | ")[1]: ln for ln in lines}
    assert set(by_workload) == {"cap-low-r2", "cap-high-r32", "(pooled)"}, out
    low, high = by_workload["cap-low-r2"], by_workload["cap-high-r32"]
    assert "| 4 (≤8) / 51 (≤512) |" in low
    # lone starts: graph GiB 0.04 vs 0.51, KV tokens 1,996,800 vs 1,959,200, no '~' mark
    assert "| 0.04 / 0.51 |" in low and "| 1,996,800 / 1,959,200 |" in low and "~" not in low
    # settled when the third block (A2, D2) is complete: its last low-load round, the 12th
    assert "| equivalent 1.000× [0.997–1.003] n=12 |" in low, low
    # start-up from the race's warm starts (4 sizes: 40.8 s + jitter < 1; 51 sizes: 50.2 s + jitter)
    arm_up, default_up = (float(x) for x in low.split(" | ")[4].split(" / "))
    assert 40.8 <= arm_up < 41.8 and 50.2 <= default_up < 51.2, low
    assert "warm start-up s" in out  # decided at its first crossing
    # rows without engine_busiest_*: the API server's cores
    assert "worse 1.5" in high and "| 60 | 12 | API server 0.97 |" in high, high  # the host-bound signature
    assert "| 3 | 30 | API server 0.20 |" in low, low
    assert ("| itl_p50 arm/default | ttft_p50 arm/default | tpot_p50 arm/default | running max | GPU util % | "
            "busiest process, cores |") in out
    assert mod.main([str(ds), "--metrics", "goodput"]) == 2

    # without lone starts the race's overlapped numbers are shown, marked
    with ProfileStore(ds) as store:
        store._db.execute("DELETE FROM cells WHERE race_id IS NULL")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert mod.main([str(ds)]) == 0
    assert "~-3.00 / -3.00" in buf.getvalue()
    assert mod.main([str(tmp_path / "missing.sqlite")]) == 2


def test_busiest_process_names_the_process_most_cells_had_busiest() -> None:
    mod = _load()
    # the 1B at 32 req/s on the H200 (2026-12-03): the engine core at a full core, the API server at 0.6
    cells = [{"engine_busiest_process": "VLLM::EngineCore", "engine_busiest_cores": c, "obs_frontend_cpu_cores": 0.6}
             for c in (1.0, 1.04)]
    cells.append({"engine_busiest_process": "python3", "engine_busiest_cores": 0.7, "obs_frontend_cpu_cores": 0.7})
    assert mod.busiest_process(cells) == "VLLM::EngineCore 1.02"
    assert mod.busiest_process([{"obs_frontend_cpu_cores": 0.5}]) == "API server 0.50"
    assert mod.busiest_process([{}]) is None
    assert mod.busiest_process([{"engine_busiest_cores": 0.9}]) == "vLLM 0.90"
    root = {"engine_busiest_process": "python3", "engine_busiest_cores": 0.83}
    assert mod.busiest_process([root]) == "API server 0.83"


def test_a_metric_no_cell_yields_reads_not_measured() -> None:
    """Steady-decode cells (lease 13) start no request inside a cell, so TTFT has no pairs: the table says so
    instead of calling it undecided; a metric with a few rounds and no ratio stays undecided."""
    mod = _load()
    assert mod._decision(mod.Decision("undecided", 0, None, None, None, "no rounds")) == "not measured (n=0)"
    assert mod._decision(mod.Decision("undecided", 1, None, None, None, "one round")) == "undecided (n=1)"
    assert mod._decision(mod.Decision("better", 12, 0.73, 0.582, 0.915, "")) == "better 0.730× [0.582–0.915] n=12"
