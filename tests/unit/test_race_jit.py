"""A kernel vLLM JIT-compiles during a cell: the cell is marked and its round pairs with nothing; the
engine warm-up moves the compile out of the measured cells."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphmode.core.dataset import ProfileStore
from graphmode.core.modes import CudaGraphMode
from graphmode.profiling.jitlog import jit_events, jit_kernels
from graphmode.profiling.race import Racer
from graphmode.profiling.race_rounds import DEFAULT_ARM, jit_tainted, table_from_rows
from tests.support.bench import load_bench
from tests.unit.test_race_fake import race_config

pytestmark = pytest.mark.timeout(120)

# the line as vLLM 0.33 printed it on the H200 (docs/results/cfg-h200-2026-12-03/, moe30b-full)
REAL = ("(EngineCore pid=2450) WARNING 12-03 13:13:38 [jit_monitor.py:140] Triton kernel JIT compilation "
        "during inference: fused_moe_kernel. This causes a latency spike; consider extending warmup to cover "
        "this shape/config.")


def test_jit_lines_parse() -> None:
    text = "\n".join([REAL, "(EngineCore pid=2450) INFO 12-03 13:13:39 [core.py:1] fine",
                      REAL.replace("fused_moe_kernel", "_gumbel_sample_kernel").replace("13:13:38", "13:13:40"),
                      REAL])
    assert jit_events(text) == [("12-03 13:13:38", "fused_moe_kernel"), ("12-03 13:13:40", "_gumbel_sample_kernel"),
                                ("12-03 13:13:38", "fused_moe_kernel")]
    assert jit_kernels(text) == ["fused_moe_kernel", "_gumbel_sample_kernel"]
    assert jit_kernels("JIT compilation of the model\nINFO nothing here") == []
    assert jit_kernels("\x00\xff garbage") == []


def test_tainted_rows_pair_with_nothing() -> None:
    rows = [
        {"status": "ok", "race_round": 0, "race_arm": DEFAULT_ARM, "workload": "w", "itl_p50": 1.0,
         "engine_jit_kernels": "_gumbel_sample_kernel"},
        {"status": "ok", "race_round": 0, "race_arm": "FULL", "workload": "w", "itl_p50": 2.0,
         "engine_jit_kernels": ""},
        {"status": "ok", "race_round": 1, "race_arm": DEFAULT_ARM, "workload": "w", "itl_p50": 1.0},
        {"status": "ok", "race_round": 1, "race_arm": "FULL", "workload": "w", "itl_p50": 1.1,
         "engine_jit_kernels": None},
    ]
    assert [jit_tainted(r) for r in rows] == [True, False, False, False]
    table = table_from_rows(rows, ("itl_p50",))
    assert [r for r, _, _ in table.pairs("FULL", "itl_p50")] == [1]  # round 0: the default compiled
    assert table.rounds_per_workload() == {"w": 2}  # the round still happened


def _race(tmp_path: Path, warmup_s: float) -> tuple[list[dict], str, int]:
    # every engine logs the warning at its 2nd request: in the first measured cell without a warm-up
    config = race_config(tmp_path, [CudaGraphMode.FULL], env={"FAKE_VLLM_JIT_AT": "2"}, max_rounds=4,
                         engine_warmup_s=warmup_s)
    with ProfileStore(tmp_path / "race.sqlite") as store:
        racer = Racer(config, store)
        summary = racer.run()
        rows = store.race_rows(racer.key)
    assert summary.rounds_run >= 3, summary.stop_reason  # the fake's FULL may be decided before round 4
    return rows, f"{summary.warmup_wall_s:.2f}", summary.rounds_run


def test_a_jit_compile_in_a_cell_marks_it_and_drops_its_round(tmp_path: Path) -> None:
    rows, warm, rounds = _race(tmp_path, warmup_s=0.0)
    assert warm == "0.00"
    marked = {(r["race_arm"], r["race_round"]) for r in rows if r["engine_jit_kernels"]}
    assert marked == {(DEFAULT_ARM, 0), ("FULL", 0)}, marked
    assert all(r["engine_jit_kernels"] == "" for r in rows if (r["race_arm"], r["race_round"]) not in marked)
    pairs = table_from_rows(rows, ("itl_p50",)).pairs("FULL", "itl_p50")
    assert [r for r, _, _ in pairs] == list(range(1, rounds))
    # the load generator's own CPU is measured per cell (near a core it may be what limits the load)
    assert all(r["loadgen_cpu_cores"] is not None and 0 <= r["loadgen_cpu_cores"] < 4 for r in rows)


def test_the_engine_warm_up_takes_the_compile(tmp_path: Path) -> None:
    rows, warm, rounds = _race(tmp_path, warmup_s=0.5)
    assert float(warm) >= 0.5 * 2 * 2 * 0.9  # two workloads on two engines
    assert not any(r["engine_jit_kernels"] for r in rows)
    assert len(table_from_rows(rows, ("itl_p50",)).pairs("FULL", "itl_p50")) == rounds


def test_mark_jit_reads_old_logs_by_time_stamp(tmp_path: Path) -> None:
    import datetime as dt

    mark_jit = load_bench("mark_jit")
    t = dt.datetime(2026, 12, 3, 13, 13, 30, tzinfo=dt.UTC).timestamp()
    rows = [
        {"id": 1, "run_id": "run1", "race_arm": "FULL", "started_at": t + 0.4, "finished_at": t + 5.9,
         "engine_jit_kernels": None},  # 13:13:30.4-35.9 holds the 13:13:32 warning
        {"id": 2, "run_id": "run1", "race_arm": "FULL", "started_at": t + 11.2, "finished_at": t + 16.0,
         "engine_jit_kernels": None},
        {"id": 3, "run_id": "run1", "race_arm": DEFAULT_ARM, "started_at": t + 6.0, "finished_at": t + 11.0,
         "engine_jit_kernels": None},  # its engine has no log
        {"id": 4, "run_id": "run1", "race_arm": "FULL", "started_at": t + 20, "finished_at": t + 25,
         "engine_jit_kernels": ""},  # marked by the profiler: left alone
    ]
    (tmp_path / "run1-FULL.log").write_text(REAL.replace("13:13:38", "13:13:32") + "\n")
    marks, missing = mark_jit.marks_for(rows, tmp_path)
    assert marks == {1: "fused_moe_kernel", 2: ""}
    assert missing == [f"run1-{DEFAULT_ARM}"]


def test_cell_line_texts() -> None:
    from graphmode.cli.common import jit_text, loadgen_text
    from graphmode.core.records import CellRecord, RunConditions

    rec = CellRecord(run_id="r", profile_key="k", mode="FULL", workload="w", workload_spec={}, repeat=0,
                     status="ok", started_at=0.0, finished_at=1.0,
                     conditions=RunConditions(engine_jit_kernels="fused_moe_kernel,_gumbel_sample_kernel",
                                              loadgen_cpu_cores=0.93))
    assert jit_text(rec, race=True) == (", JIT-compiled fused_moe_kernel, _gumbel_sample_kernel during the cell: "
                                        "its round is left out of the verdicts")
    assert loadgen_text(rec) == ", load generator at 0.93 CPU cores: it may limit the load"
    clean = rec.model_copy(update={"conditions": RunConditions(engine_jit_kernels="", loadgen_cpu_cores=0.2)})
    assert jit_text(clean) == "" and loadgen_text(clean) == ""


def test_a_client_that_fell_behind_says_so() -> None:
    from graphmode.cli.common import client_reads_text
    from graphmode.core.records import CellRecord, LatencyStats, ObservedFeatures

    def rec(tokens: float | None, server_itl: float | None = 0.0041, accept: float | None = None) -> CellRecord:
        return CellRecord(run_id="r", profile_key="k", mode="FULL", workload="w", workload_spec={}, repeat=0,
                          status="ok", started_at=0.0, finished_at=1.0,
                          latency=LatencyStats(chunk_tokens_mean=tokens, server_itl_mean=server_itl),
                          features=ObservedFeatures(spec_accept_length=accept))

    assert client_reads_text(rec(2.14)) == ", 2.1 tokens a read: the client fell behind (vLLM's mean ITL 4.10 ms)"
    assert client_reads_text(rec(1.6, None)) == ", 1.6 tokens a read: the client fell behind"
    assert client_reads_text(rec(1.49)) == client_reads_text(rec(None)) == ""
    assert client_reads_text(rec(2.5, accept=2.4)) == ""  # speculative decoding: several tokens an event by design


def test_race_table_says_how_many_cells_compiled() -> None:
    race_table = load_bench("race_table")
    ok = {"status": "ok", "race_id": "r", "race_arm": "FULL"}
    rows = [{**ok, "race_round": 0, "engine_jit_kernels": "fused_moe_kernel,_gumbel_sample_kernel"},
            {**ok, "race_round": 0, "race_arm": DEFAULT_ARM, "engine_jit_kernels": "_gumbel_sample_kernel"},
            {**ok, "race_round": 1, "engine_jit_kernels": ""},
            {**ok, "race_round": 2, "engine_jit_kernels": None}]
    assert race_table.jit_line(rows) == (
        "JIT compiles during cells (vLLM's jit_monitor): in 2 of the 3 cells whose engine log was read, "
        "1 rounds left out for the arms concerned (_gumbel_sample_kernel, fused_moe_kernel); 1 cells not read")
    assert race_table.jit_line([{**ok, "race_round": 0, "engine_jit_kernels": None}]) is None
