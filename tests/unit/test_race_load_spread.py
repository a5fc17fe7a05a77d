"""bench/race_table.py's load line: whether capped cells kept their cap running, and a round's arms agree."""

from __future__ import annotations

import json

from tests.support.bench import load_bench

race_table = load_bench("race_table")


def _rows(batches_by_round: list[list[float | None]], cap: int | None = 768,
          max_num_seqs: int | None = 1024) -> list[dict[str, object]]:
    spec = json.dumps({"name": "w", "max_concurrency": cap})
    return [{"status": "ok", "race_id": "r", "race_round": i, "race_arm": f"arm{j}", "obs_batch_mean": b,
             "workload_spec": spec, "dep_max_num_seqs": max_num_seqs}
            for i, batches in enumerate(batches_by_round) for j, b in enumerate(batches)]


def test_the_h200_as4_rounds_are_flagged() -> None:
    # lease 6's as4 race, rounds 0 and 3 (2026-12-03): all four engines near the cap, then one at 98 of 768
    line = race_table.load_line(_rows([[733, 731, 728, 731], [98, 521, 643, 723]]))
    assert line == ("capped cells: the engine ran >= 80% of the cap in 6 of 8; 1 of 2 rounds mix held and not "
                    "held (those compare a saturated engine with one that kept up: saturate the load or lower it)")


def test_rounds_that_agree_are_not_flagged() -> None:
    assert race_table.load_line(_rows([[733, 731, 728], [300, 250, 420]])) == (
        "capped cells: the engine ran >= 80% of the cap in 3 of 6; 0 of 2 rounds mix held and not held")


def test_the_engine_limit_bounds_the_cap() -> None:
    # a cap of 1024 on an engine of --max-num-seqs 512 is held at 470 running
    assert "in 2 of 2" in str(race_table.load_line(_rows([[470, 500]], cap=1024, max_num_seqs=512)))


def test_open_loops_small_caps_and_missing_samples_say_nothing() -> None:
    assert race_table.load_line(_rows([[700.0, 100.0]], cap=None)) is None
    # concurrency 1 is a latency probe: a running mean of 0.83 is the gap between its requests
    assert race_table.load_line(_rows([[1.0, 0.83]], cap=1)) is None
    assert race_table.load_line(_rows([[None, None]])) is None
    rows = _rows([[700.0, 100.0]])
    rows[1]["status"] = "failed"
    assert race_table.load_line(rows) == (
        "capped cells: the engine ran >= 80% of the cap in 1 of 1; 0 of 1 rounds mix held and not held")
    rows[0]["workload_spec"] = "{not json"
    assert race_table.load_line(rows) is None


def test_the_cell_line_says_how_much_of_the_cap_ran() -> None:
    from graphmode.cli.common import running_text
    from graphmode.core.records import CellRecord, Fingerprint, ObservedFeatures

    def rec(cap: int | None, batch: float | None, args: list[str]) -> CellRecord:
        return CellRecord(run_id="r", profile_key="k", mode="FULL", workload="w",
                          workload_spec={"max_concurrency": cap}, repeat=0, status="ok", started_at=0.0,
                          finished_at=1.0, features=ObservedFeatures(batch_mean=batch),
                          fingerprint=Fingerprint(vllm_args=args))

    seqs = ["--max-num-seqs", "1024"]
    assert running_text(rec(768, 733.4, seqs)) == ", 733 of 768 running"
    # lease 6's round 3: FULL kept up with its arrivals while its neighbours ran the cap
    assert running_text(rec(768, 98.0, seqs)) == ", 98 of 768 running: below the cap"
    # the engine's own limit bounds a larger cap (vLLM's default max_num_seqs is not assumed)
    assert running_text(rec(1024, 470.0, ["--max-num-seqs", "512"])) == ", 470 of 512 running"
    assert running_text(rec(1024, 470.0, [])) == ", 470 of 1024 running: below the cap"
    for quiet in (rec(None, 700.0, seqs), rec(1, 0.8, seqs), rec(768, None, seqs)):
        assert running_text(quiet) == ""


def test_the_cell_line_names_a_vllm_process_at_a_full_core() -> None:
    from graphmode.cli.common import engine_process_text
    from graphmode.core.records import CellRecord, RunConditions

    def rec(cores: float | None, title: str | None) -> CellRecord:
        return CellRecord(run_id="r", profile_key="k", mode="FULL", workload="w", workload_spec={}, repeat=0,
                          status="ok", started_at=0.0, finished_at=1.0,
                          conditions=RunConditions(engine_busiest_cores=cores, engine_busiest_process=title))

    assert engine_process_text(rec(0.97, "VLLM::EngineCore")) == ", VLLM::EngineCore at 0.97 CPU cores"
    assert engine_process_text(rec(0.97, None)) == ", a vLLM process at 0.97 CPU cores"
    assert engine_process_text(rec(0.4, "VLLM::APIServer_0")) == "" and engine_process_text(rec(None, None)) == ""


def test_the_cpu_line_names_the_process_that_set_the_pace() -> None:
    # the saturated 1B race (2026-12-03): the engine core at a full core, the GPU half idle
    rows = [{"status": "ok", "race_round": i, "engine_busiest_cores": c, "engine_busiest_process": t,
             "gpu_util_pct_mean": g}
            for i, (c, t, g) in enumerate([(0.98, "VLLM::EngineCore", 31.0), (0.92, "VLLM::EngineCore", 48.0),
                                           (0.87, "python3", 67.0), (0.30, "VLLM::EngineCore", 90.0)])]
    assert race_table.cpu_line(rows) == (
        "CPU-bound cells: a vLLM process ran at 0.87-0.98 cores in 3 of 4 (VLLM::EngineCore in 2, python3 in 1), "
        "the GPU 31-67% busy: there a process's CPU time sets the step, and a mode only shortens its launches")
    assert race_table.cpu_line(rows[3:]) is None
    assert race_table.cpu_line([{"status": "ok", "race_round": 0, "engine_busiest_cores": None}]) is None
