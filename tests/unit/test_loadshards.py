"""A cell's load from several processes (profiling.loadshards) against the fake vLLM: the same requests,
in the plans' order, one time base, the window cut where the one-process path cuts it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from graphmode.core.dataset import ProfileStore
from graphmode.core.modes import CudaGraphMode
from graphmode.profiling.loadshards import LoadShards, split_concurrency
from graphmode.profiling.race import Racer
from graphmode.profiling.runner import Profiler
from tests.unit.test_race_fake import W1, race_config

pytestmark = pytest.mark.timeout(180)


def test_a_concurrency_cap_is_split_without_loss() -> None:
    assert split_concurrency(10, 4) == [3, 3, 2, 2]
    assert split_concurrency(1024, 4) == [256] * 4
    assert split_concurrency(None, 3) == [None, None, None]
    assert sum(c for c in split_concurrency(7, 3) if c) == 7
    with pytest.raises(ValueError, match="at least 2"):
        LoadShards(1)


def test_a_race_with_two_load_processes(tmp_path: Path) -> None:
    config = race_config(tmp_path, [CudaGraphMode.FULL], max_rounds=3)
    config.profile = dataclasses.replace(config.profile, loadgen_processes=2)
    with ProfileStore(tmp_path / "race.sqlite") as store:
        racer = Racer(config, store)
        summary = racer.run()
        rows = store.race_rows(racer.key)
        assert racer.profiler._shards is None, "the race stops its load processes"
    assert summary.rounds_run == 3 and summary.cells_ok == 6, summary.stop_reason
    for r in rows:
        assert r["status"] == "ok" and r["n_ok"] > 0 and r["itl_p50"] is not None
        assert r["stopped_by"] == "max" and r["warmup_used_s"] == pytest.approx(0.3, abs=0.05)
        assert r["loadgen_cpu_cores"] is not None and 0 <= r["loadgen_cpu_cores"] < 4
    # both arms of a round sent the same window of the same plan (a fixed window, as with one process)
    by_round: dict[int, set[int]] = {}
    for r in rows:
        by_round.setdefault(r["race_round"], set()).add(r["n_sent"])
    assert all(len(sent) == 1 or max(sent) - min(sent) <= 1 for sent in by_round.values()), by_round


def test_a_fixed_grid_cell_sends_every_planned_request(tmp_path: Path) -> None:
    config = race_config(tmp_path, [CudaGraphMode.FULL]).profile
    w = W1.model_copy(update={"duration_s": 1.0, "warmup_s": 0.2, "max_concurrency": 3})
    one = dataclasses.replace(config, workloads=[w], modes=[CudaGraphMode.FULL], dataset=tmp_path / "one.sqlite")
    two = dataclasses.replace(one, dataset=tmp_path / "two.sqlite", loadgen_processes=2,
                              log_dir=tmp_path / "logs2")
    sent = []
    for cfg in (one, two):
        with ProfileStore(cfg.dataset) as store:
            summary = Profiler(cfg, store).run()
            (row,) = store.rows()
        assert summary.ok == 1 and row["status"] == "ok", row.get("reason")
        sent.append((row["n_sent"], row["n_ok"]))
    assert sent[0] == sent[1], sent  # the same seeded plan: every request sent and finished both ways


def test_a_fixed_cell_above_its_cap_from_two_processes_leaves_its_backlog_unsent(tmp_path: Path) -> None:
    config = race_config(tmp_path, [CudaGraphMode.FULL]).profile
    w = W1.model_copy(update={"rate": 2000.0, "duration_s": 1.0, "warmup_s": 0.2, "max_concurrency": 4})
    cfg = dataclasses.replace(config, workloads=[w], modes=[CudaGraphMode.FULL], dataset=tmp_path / "two.sqlite",
                              loadgen_processes=2, drain_grace_s=30.0)
    with ProfileStore(cfg.dataset) as store:
        summary = Profiler(cfg, store).run()
        (row,) = store.rows()
    assert summary.ok == 1 and row["status"] == "ok", row.get("reason")
    assert row["n_ok"] > 0 and row["n_err"] == 0 and row["n_sent"] == row["n_ok"]
    assert row["finished_at"] - row["started_at"] < 20  # not held open to the deadline by the backlog
