"""Resident replicas (``replicas``): R engines of every arm side by side, round k on replica_slot mod R.

Against ``tests/support/fake_vllm.py`` servers, like ``test_race_fake.py``: NONE is ~1.8× slower than the
default on ITL p50, so it is called "worse" once three rounds give three disjoint start blocks.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from graphmode.core.dataset import ProfileStore
from graphmode.core.errors import ConfigError
from graphmode.core.modes import CudaGraphMode
from graphmode.profiling.race import Racer, race_key, replica_slot
from graphmode.profiling.race_rounds import DEFAULT_ARM
from tests.unit.test_race_compile import COLD, COLD_S, Events
from tests.unit.test_race_fake import race_config
from tests.unit.test_runner_fake import TINY_LLAMA

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ProfileStore]:
    with ProfileStore(tmp_path / "race.sqlite") as s:
        yield s


def _replica(start_id: str) -> int:
    return int(start_id.rsplit(":", 1)[1]) - 1  # replica r's start is start r + 1 of its session


def test_three_replicas_a_workloads_round_k_uses_replica_k_mod_3_in_disjoint_blocks(tmp_path: Path,
                                                                                     store: ProfileStore) -> None:
    config = race_config(tmp_path, [CudaGraphMode.NONE, CudaGraphMode.FULL], replicas=3, max_rounds=6,
                         warm_compile=False)
    racer = Racer(config, store)
    assert racer.rule.min_starts == 2
    ports = [e.port for e in racer.engines]
    assert len(ports) == 9 and len(set(ports)) == 9, "two engines share a port"
    assert [e.port for e in racer.arms] == [config.profile.port + i for i in range(3)]  # replica 0: as without
    summary = racer.run()
    assert not summary.failures and not summary.replica_failures, (summary.failures, summary.replica_failures)
    assert summary.engine_starts == 9 and summary.restarts == 0, "one start wave of arms × R, no restart"
    v = summary.verdicts["NONE"].pooled["itl_p50"]
    assert v.verdict == "worse" and v.starts >= 2 and v.blocks == 3, v
    assert summary.arm_states["NONE"] == "decided"
    rows = store.race_rows(racer.key)
    assert all(r["status"] == "ok" for r in rows)
    ids: dict[str, set[str]] = defaultdict(set)
    by_round: dict[int, dict[str, str]] = defaultdict(dict)
    for r in rows:
        ids[r["race_arm"]].add(r["race_start_id"])
        by_round[r["race_round"]][r["race_arm"]] = r["race_start_id"]
        # two workloads in turn, R = 3 (coprime): round k measures replica k mod 3
        assert _replica(r["race_start_id"]) == r["race_round"] % 3, r
        # every resident replica counts, not one per arm: 9, or 6 once NONE is decided and its replicas stopped
        assert r["race_live_engines"] in (6, 9) and (r["race_round"] > 0 or r["race_live_engines"] == 9), r
    for arm in (DEFAULT_ARM, "NONE", "FULL"):
        assert ids[arm] == {f"{racer.run_id}:{arm}:{k}" for k in (1, 2, 3)}, ids[arm]
    # blocks (arm start, default start) are the diagonal pairs (A_r, D_r): each arm start meets one default start
    for arm in ("NONE", "FULL"):
        pairs = {(cells[arm], cells[DEFAULT_ARM]) for cells in by_round.values() if arm in cells}
        assert len(pairs) == 3 and len({a for a, _ in pairs}) == len({d for _, d in pairs}) == 3
    logs = {p.name for p in (tmp_path / "logs").glob("*.log")}
    assert {f"{racer.run_id}-NONE.log", f"{racer.run_id}-NONE-2.log", f"{racer.run_id}-NONE-3.log"} <= logs
    # a resume counts every replica start that measured a round as an earlier start
    again = Racer(config, store)
    assert again.key == racer.key and {a.name: a.starts_before for a in again.arms} == {
        arm: len(ids[arm]) for arm in (DEFAULT_ARM, "NONE", "FULL")}


def test_a_replica_that_dies_fails_alone_and_the_arm_is_decided_from_the_others(tmp_path: Path,
                                                                                store: ProfileStore) -> None:
    config = race_config(tmp_path, [CudaGraphMode.NONE], replicas=3, max_rounds=6, warm_compile=False)
    racer = Racer(config, store)
    doomed = racer.replicas["NONE"][1]
    config.profile.env.update({"FAKE_VLLM_EXIT_AFTER": "2", "FAKE_VLLM_EXIT_MODE": "NONE",
                               "FAKE_VLLM_EXIT_PORT": str(doomed.port)})
    summary = racer.run()
    assert "fake engine core died" in summary.replica_failures["NONE/r1"], summary.replica_failures
    assert "NONE" not in summary.failures and doomed.state == "failed"
    assert summary.arm_states["NONE"] == "decided"
    assert summary.verdicts["NONE"].pooled["itl_p50"].verdict == "worse"
    rows = store.race_rows(racer.key)
    failed = [r for r in rows if r["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["race_start_id"] == doomed.start_id
    assert "fake engine core died" in failed[0]["reason"]
    ok_none = [r for r in rows if r["status"] == "ok" and r["race_arm"] == "NONE"]
    assert doomed.start_id not in {r["race_start_id"] for r in ok_none}
    # every round NONE ran still has its cell: the next live replica took the dead one's turn
    rounds = {r["race_round"] for r in rows if r["race_arm"] == DEFAULT_ARM}
    assert {r["race_round"] for r in ok_none} == rounds
    assert "NONE/r1" in "\n".join(summary.lines())


def test_compile_start_compiles_replica_0_and_copies_its_cache(tmp_path: Path, store: ProfileStore) -> None:
    config = race_config(tmp_path, [CudaGraphMode.NONE], env=COLD, replicas=3, max_rounds=4)
    events = Events()
    racer = Racer(config, store, events)
    roots = {racer.cache_root(e) for e in racer.engines}
    assert len(roots) == 6 and not any(r.exists() for r in roots), "each replica its own compile cache"
    summary = racer.run()
    assert not summary.failures and not summary.replica_failures
    assert events.events[0] == ("compile", (DEFAULT_ARM, "NONE")), events.events
    assert sum(1 for e in events.events if e[0] == "compiled") == 2 and summary.compile_starts == 2
    starts = [e for e in events.events if e[0] == "start"]
    assert starts == [("start", (DEFAULT_ARM,) * 3 + ("NONE",) * 3)], "one overlapped measured wave"
    for e in racer.engines:
        root = racer.cache_root(e)
        assert root.is_dir() and any(f.is_file() for f in root.rglob("*")), root
    rows = store.race_rows(racer.key)
    assert {_replica(r["race_start_id"]) for r in rows} == {0, 1, 2}
    # no measured start compiled cold: the copied cache was warm for the other replicas
    assert all(float(r["startup_s"]) < COLD_S for r in rows if r["startup_s"] is not None)
    logs = {p.name for p in (tmp_path / "logs").glob("*-compile.log")}
    assert logs == {f"{racer.run_id}-{n}-compile.log" for n in (DEFAULT_ARM, "NONE")}


def test_starts_must_be_one_or_the_replicas_and_the_key_keeps_old_races(tmp_path: Path,
                                                                        store: ProfileStore) -> None:
    with pytest.raises(ConfigError, match="--starts 2 with --replicas 3"):
        Racer(race_config(tmp_path, [CudaGraphMode.NONE], replicas=3, starts=2), store)
    # two replicas are two start blocks: an interval only with the A/A arm's start variance
    with pytest.raises(ConfigError, match="add --control"):
        Racer(race_config(tmp_path, [CudaGraphMode.NONE], replicas=2), store)
    assert Racer(race_config(tmp_path, [CudaGraphMode.NONE], replicas=2, control=True), store).config.replicas == 2
    assert Racer(race_config(tmp_path, [CudaGraphMode.NONE], replicas=3, starts=3), store).rule.min_starts == 2
    one = race_config(tmp_path, [CudaGraphMode.NONE], starts=2)
    three = race_config(tmp_path, [CudaGraphMode.NONE], replicas=3)
    cells = Racer(one, store).cells
    assert race_key("p", one, cells) == race_key("p", race_config(tmp_path, [CudaGraphMode.NONE]), cells)
    assert race_key("p", three, cells) != race_key("p", one, cells)
    # R = 1 keeps one engine per arm on port + i
    assert [e.label for e in Racer(one, store).engines] == [DEFAULT_ARM, "NONE"]


def test_cli_replicas_dry_run_and_bad_starts(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from graphmode.cli.main import app

    base = ["profile", "--race", "--dataset", str(tmp_path / "d.sqlite"), "--vllm-cmd", f"{sys.executable} x",
            "--modes", "NONE", "--port", "9000"]
    model = ["--", "--model", str(TINY_LLAMA)]
    ok = CliRunner().invoke(app, [*base, "--dry-run", "--replicas", "3", "--kv-cache-memory-bytes", "4G", *model])
    assert ok.exit_code == 0, ok.output
    assert "FULL_AND_PIECEWISE:9000,9002,9004, NONE:9001,9003,9005" in ok.output
    assert "3 replicas per arm, 6 engines resident (2 arms × 3 × KV 4G)" in ok.output
    bad = CliRunner().invoke(app, [*base, "--dry-run", "--replicas", "3", "--starts", "2", *model])
    assert bad.exit_code == 2 and "--starts 2 with --replicas 3" in bad.output and "Traceback" not in bad.output


@pytest.mark.parametrize(("workloads", "replicas"), [(2, 4), (2, 3), (1, 4), (3, 6), (4, 2)])
def test_every_workload_meets_every_replica_and_rounds_in_turn_meet_consecutive_ones(workloads: int,
                                                                                     replicas: int) -> None:
    order = [f"w{i}" for i in range(workloads)]
    counts: dict[str, int] = defaultdict(int)
    slots: list[int] = []
    seen: dict[str, list[int]] = defaultdict(list)
    for k in range(workloads * replicas * 2):
        w = order[k % workloads]
        slot = replica_slot(order, counts, w, replicas) % replicas
        counts[w] += 1
        slots.append(slot)
        seen[w].append(slot)
    for w in order:  # within R of its rounds, each workload has met every replica
        assert set(seen[w][:replicas]) == set(range(replicas)), (w, seen[w])
    # the first min(W, R) rounds in turn measure different replicas (that many start blocks at once)
    first = slots[:min(workloads, replicas)]
    assert len(set(first)) == len(first), slots
    # round-robin with W and R coprime is the plain round k mod R
    if math.gcd(workloads, replicas) == 1:
        assert slots == [k % replicas for k in range(len(slots))]


def test_an_irregular_order_still_cycles_each_workloads_replicas() -> None:
    """One workload decided early: the other takes every round, and still meets every replica in turn."""
    order, counts = ["a", "b"], {"a": 1}
    got = []
    for _ in range(4):
        got.append(replica_slot(order, counts, "b", 4) % 4)
        counts["b"] = counts.get("b", 0) + 1
    assert sorted(got) == [0, 1, 2, 3], got
