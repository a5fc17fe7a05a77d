"""The SQLite profile dataset: roundtrip, resume bookkeeping, migration, corruption and crash safety."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from graphmode.core.dataset import COLUMNS, ProfileStore, flatten
from graphmode.core.errors import DatasetError
from graphmode.core.records import CellRecord, Fingerprint, LatencyStats, ObservedFeatures, StartupInfo


def record(mode: str = "FULL", workload: str = "w1", repeat: int = 0, status: str = "ok",
           key: str = "key-a", **kw: Any) -> CellRecord:
    base: dict[str, Any] = dict(
        run_id="run-1", profile_key=key, mode=mode, workload=workload,
        workload_spec={"name": workload, "rate": 2.0, "input": {"mean": 64, "spread": 0.1}},
        repeat=repeat, status=status, reason=None if status == "ok" else "vLLM exited with status 1",
        started_at=1000.0, finished_at=1012.5,
        features=ObservedFeatures(window_s=10.0, n_samples=21, arrival_rate=2.1, batch_mean=3.5),
        latency=LatencyStats(n_sent=24, n_ok=24, ttft_p50=0.031, itl_p50=0.0042, first_error=None),
        startup=StartupInfo(startup_s=42.0, vllm_version="0.24.0", capture_s=3.0, graph_gib=0.45,
                            capture_labels=["mixed prefill-decode, PIECEWISE", "decode, FULL"],
                            non_default_args={"model": "/m", "compilation_config": {"cudagraph_mode": mode}}),
        fingerprint=Fingerprint(gpu_name="NVIDIA H200", gpu_count=1, vllm_version="0.24.0",
                                vllm_args=["--model", "/m", "--max-model-len", "4096"]),
        gpu_mem_used_gib_max=70.5,
    )
    base.update(kw)
    return CellRecord(**base)


def test_columns_cover_every_record_field() -> None:
    assert "obs_arrival_rate" in COLUMNS and COLUMNS["obs_arrival_rate"] == "REAL"
    assert COLUMNS["fp_gpu_count"] == "INTEGER" and COLUMNS["fp_vllm_args"] == "TEXT"
    assert COLUMNS["capture_labels"] == "TEXT" and COLUMNS["kv_cache_tokens"] == "INTEGER"
    assert "vllm_version" not in COLUMNS  # the fingerprint's fp_vllm_version holds it
    assert COLUMNS["gpu_numa_node"] == "INTEGER" and COLUMNS["engine_numa_nodes"] == "TEXT"  # run conditions
    assert set(flatten(record(), "h")) <= set(COLUMNS)


def test_append_rows_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "profile.sqlite"  # parent directories are created
    with ProfileStore(path) as store:
        assert store.count() == 0 and store.rows() == []
        store.append(record(), "hash1")
        store.append(record(mode="NONE", status="failed"), "hash1")
        assert store.count() == 2
        rows = store.rows()
    assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)
    row = rows[0]
    assert (row["mode"], row["workload"], row["workload_hash"], row["repeat"], row["status"]) == (
        "FULL", "w1", "hash1", 0, "ok")
    assert row["run_id"] == "run-1" and row["profile_key"] == "key-a"
    assert json.loads(row["workload_spec"]) == {"name": "w1", "rate": 2.0, "input": {"mean": 64, "spread": 0.1}}
    assert row["obs_arrival_rate"] == 2.1 and row["obs_n_samples"] == 21 and row["obs_queue_mean"] is None
    assert row["ttft_p50"] == 0.031 and row["n_ok"] == 24
    assert row["startup_s"] == 42.0 and row["capture_s"] == 3.0 and row["graph_gib"] == 0.45
    assert json.loads(row["capture_labels"]) == ["mixed prefill-decode, PIECEWISE", "decode, FULL"]
    assert json.loads(row["non_default_args"]) == {"model": "/m", "compilation_config": {"cudagraph_mode": "FULL"}}
    assert row["fp_gpu_name"] == "NVIDIA H200" and row["fp_vllm_version"] == "0.24.0"
    assert json.loads(row["fp_vllm_args"]) == ["--model", "/m", "--max-model-len", "4096"]
    assert row["gpu_mem_used_gib_max"] == 70.5 and row["gpu_mem_used_gib_mean"] is None
    assert rows[1]["reason"] == "vLLM exited with status 1"


def test_rows_by_status(tmp_path: Path) -> None:
    with ProfileStore(tmp_path / "p.sqlite") as store:
        store.append(record(status="failed"), "h")
        store.append(record(), "h")
        store.append(record(workload="w2"), "h")
        assert [r["workload"] for r in store.rows(status="ok")] == ["w1", "w2"]
        assert len(store.rows(status="failed")) == 1
        assert store.rows(status="weird") == []


def test_done_cells_counts_only_ok_rows_of_the_key(tmp_path: Path) -> None:
    with ProfileStore(tmp_path / "p.sqlite") as store:
        store.append(record(mode="FULL", workload="w1", repeat=0), "h1")
        store.append(record(mode="FULL", workload="w1", repeat=0), "h1")  # a duplicate counts once
        store.append(record(mode="FULL", workload="w1", repeat=1), "h1")
        store.append(record(mode="NONE", workload="w1", repeat=0, status="failed"), "h1")
        store.append(record(mode="PIECEWISE", workload="w2", repeat=0, key="key-b"), "h2")
        assert store.done_cells("key-a") == {("FULL", "w1", "h1", 0), ("FULL", "w1", "h1", 1)}
        assert store.done_cells("key-b") == {("PIECEWISE", "w2", "h2", 0)}
        assert store.done_cells("nope") == set()


def test_failed_then_ok_retry(tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    with ProfileStore(path) as store:
        store.append(record(mode="NONE", status="failed"), "h")
        assert store.done_cells("key-a") == set()
    with ProfileStore(path) as store:  # the retry happens in a later run
        store.append(record(mode="NONE", run_id="run-2"), "h")
        assert store.done_cells("key-a") == {("NONE", "w1", "h", 0)}
        rows = store.rows()
    # rows are never updated: both attempts stay
    assert [(r["run_id"], r["status"]) for r in rows] == [("run-1", "failed"), ("run-2", "ok")]


def test_readonly(tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    with ProfileStore(path) as store:
        store.append(record(), "h")
    with ProfileStore(path, readonly=True) as ro:
        assert ro.count() == 1
        assert ro.done_cells("key-a") == {("FULL", "w1", "h", 0)}
        with pytest.raises(DatasetError, match="read-only"):
            ro.append(record(), "h")


def test_readonly_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no profile dataset"):
        ProfileStore(tmp_path / "missing.sqlite", readonly=True)
    assert not (tmp_path / "missing.sqlite").exists()


@pytest.mark.parametrize("readonly", [False, True])
def test_corrupt_file(tmp_path: Path, readonly: bool) -> None:
    path = tmp_path / "corrupt.sqlite"
    path.write_bytes(random.Random(1234).randbytes(8192))
    with pytest.raises(DatasetError, match=r"corrupt\.sqlite"):
        ProfileStore(path, readonly=readonly)


def test_truncated_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    with ProfileStore(path) as store:
        for i in range(50):
            store.append(record(workload=f"w{i}", reason="x" * 500), "h")
    # checkpoint the WAL into the main file, drop the WAL, then cut the file in half
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    for suffix in ("-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError):
        ProfileStore(path, readonly=True).rows()


@pytest.mark.parametrize("readonly", [False, True])
def test_sqlite_without_cells_table(tmp_path: Path, readonly: bool) -> None:
    path = tmp_path / "other.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE something (x INTEGER)")
    db.commit()
    db.close()
    with pytest.raises(DatasetError, match="no 'cells' table"):
        ProfileStore(path, readonly=readonly)
    db = sqlite3.connect(path)  # the foreign file was not touched
    assert {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")} == {"something"}
    db.close()


def test_empty_file_becomes_a_dataset(tmp_path: Path) -> None:
    path = tmp_path / "empty.sqlite"
    path.touch()
    with ProfileStore(path) as store:
        store.append(record(), "h")
        assert store.count() == 1


def test_schema_migration_adds_missing_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    added = {"obs_kv_usage_mean", "capture_labels", "fp_torch_version"}
    old_columns = {k: v for k, v in COLUMNS.items() if k not in added}
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE cells (" + ", ".join(f'"{k}" {t}' for k, t in old_columns.items()) + ")")
    db.execute(
        "INSERT INTO cells (run_id, profile_key, mode, workload, workload_hash, repeat, status, started_at,"
        " finished_at, workload_spec, ttft_p50)"
        " VALUES ('old', 'key-a', 'FULL', 'w1', 'h', 0, 'ok', 1, 2, '{}', 0.5)"
    )
    db.commit()
    db.close()

    with ProfileStore(path) as store:
        have = {r[1] for r in store._db.execute("PRAGMA table_info(cells)")}
        assert set(COLUMNS) <= have
        (old,) = store.rows()
        assert old["ttft_p50"] == 0.5
        assert all(old[c] is None for c in added)
        assert store.done_cells("key-a") == {("FULL", "w1", "h", 0)}
        store.append(record(workload="w2", features=ObservedFeatures(kv_usage_mean=0.25)), "h")
        new = store.rows()[-1]
        assert new["obs_kv_usage_mean"] == 0.25 and json.loads(new["capture_labels"])[0].startswith("mixed")
    with ProfileStore(path, readonly=True) as ro:  # reopening an already migrated file is a no-op
        assert ro.count() == 2


def test_a_renamed_column_reads_under_its_new_name(tmp_path: Path) -> None:
    """engine_nvcsw_per_s held involuntary switches: it is engine_nivcsw_per_s now, in old datasets too."""
    old_path = tmp_path / "old.sqlite"
    with ProfileStore(old_path) as store:
        store.append(record(), "h")
        store._db.execute('ALTER TABLE cells RENAME COLUMN "engine_nivcsw_per_s" TO "engine_nvcsw_per_s"')
        store._db.execute("UPDATE cells SET engine_nvcsw_per_s = 12.5")
    with ProfileStore(old_path, readonly=True) as ro:  # read-only: renamed as it is read
        (row,) = ro.rows()
        assert row["engine_nivcsw_per_s"] == 12.5 and "engine_nvcsw_per_s" not in row
    with ProfileStore(old_path) as rw:  # opened for writing: the column itself is renamed
        have = {r[1] for r in rw._db.execute("PRAGMA table_info(cells)")}
        assert "engine_nivcsw_per_s" in have and "engine_nvcsw_per_s" not in have
        assert rw.rows()[0]["engine_nivcsw_per_s"] == 12.5


def test_the_committed_datasets_load_under_the_current_names() -> None:
    paths = sorted((Path(__file__).resolve().parents[2] / "models").rglob("*.sqlite"))
    assert paths
    for path in paths:
        with ProfileStore(path, readonly=True) as ro:
            rows = ro.rows()
        assert rows and "engine_nvcsw_per_s" not in rows[0]
        if path.parent.name == "profiles":  # the H200 campaign recorded the switches
            assert any(r["engine_nivcsw_per_s"] is not None for r in rows)


_APPENDER = textwrap.dedent(
    """
    import sys
    from graphmode.core.dataset import ProfileStore
    from graphmode.core.records import CellRecord

    store = ProfileStore(sys.argv[1])
    i = 0
    while True:
        store.append(CellRecord(run_id="child", profile_key="key-a", mode="FULL", workload=f"c{i}",
                                workload_spec={"i": i}, repeat=0, status="ok", started_at=0.0,
                                finished_at=1.0), "h")
        i += 1
        print(i, flush=True)
    """
)


def test_crash_mid_run_keeps_earlier_rows(tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    with ProfileStore(path) as store:
        store.append(record(), "h")
    script = tmp_path / "appender.py"
    script.write_text(_APPENDER, encoding="utf-8")
    child = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    reported = 0
    try:
        for line in child.stdout:
            reported = int(line)
            if reported >= 25:
                break
        os.kill(child.pid, signal.SIGKILL)
        # what the child reported committed before it died (it may have run ahead of our reading)
        for line in child.stdout:
            reported = int(line)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)
        child.stdout.close()
    assert reported >= 25, "the child never got going"
    assert child.returncode == -signal.SIGKILL

    with ProfileStore(path) as store:  # integrity check passes; the WAL is recovered
        n = store.count()
        rows = store.rows()
        # every row the child reported committed is there; at most the one between commit and print is extra
        assert reported + 1 <= n <= reported + 2
        assert rows[0]["run_id"] == "run-1"
        assert [r["workload"] for r in rows[1:]] == [f"c{i}" for i in range(n - 1)]
        store.append(record(workload="after"), "h")
        assert store.count() == n + 1
