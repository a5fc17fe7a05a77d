"""Several engine starts per arm (``--starts``) against ``tests/support/fake_vllm.py`` servers: restart waves
that never restart the default with a challenger, start ids per row, and a resume that counts the starts
already made. The fake's NONE is ~1.8× slower (decided "worse" from one start, never restarted); FULL and
CONTROL run as fast as the default, so they stay open until their second start at least.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from graphmode.core.dataset import ProfileStore
from graphmode.core.modes import CudaGraphMode
from graphmode.profiling.race import Racer
from graphmode.profiling.race_rounds import CONTROL_ARM, DEFAULT_ARM, table_from_rows
from graphmode.selector.verdicts import race_verdicts
from tests.support.bench import load_bench
from tests.unit.test_race_fake import race_config
from tests.unit.test_runner_fake import TINY_LLAMA

pytestmark = pytest.mark.timeout(240)
MODES = [CudaGraphMode.NONE, CudaGraphMode.FULL]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ProfileStore]:
    with ProfileStore(tmp_path / "race.sqlite") as s:
        yield s


def starts_by_round(rows: list[dict[str, Any]]) -> dict[int, dict[str, str]]:
    out: dict[int, dict[str, str]] = defaultdict(dict)
    for r in rows:
        if r["status"] == "ok":
            out[int(r["race_round"])][str(r["race_arm"])] = str(r["race_start_id"])
    return dict(out)


def test_two_starts_in_staggered_waves_then_resume_counts_them(tmp_path: Path, store: ProfileStore) -> None:
    config = race_config(tmp_path, MODES, control=True, starts=2, block_rounds=2, max_rounds=9)
    racer = Racer(config, store)
    first = racer.run()
    rows = store.race_rows(racer.key)
    assert first.restarts == 3 and first.engine_starts == 4 + 3, "default once, then FULL and CONTROL together"
    assert first.arm_states["NONE"] == "decided", "NONE should be 'worse' from its one start and stop"
    per_arm: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        per_arm[r["race_arm"]].add(r["race_start_id"])
    assert {a: len(s) for a, s in per_arm.items()} == {DEFAULT_ARM: 2, "FULL": 2, CONTROL_ARM: 2, "NONE": 1}
    assert all(s.startswith(racer.run_id + ":") for ids in per_arm.values() for s in ids)
    # the default and a challenger never change start between two consecutive rounds
    seen = starts_by_round(rows)
    rounds = sorted(seen)
    for prev, cur in itertools.pairwise(rounds):
        changed = {a for a in seen[cur] if a in seen[prev] and seen[cur][a] != seen[prev][a]}
        assert not (DEFAULT_ARM in changed and changed - {DEFAULT_ARM}), (prev, cur, changed)
    # the first block has min_rounds rounds (NONE decided from one start), later ones block_rounds
    full_blocks = [(seen[r]["FULL"], seen[r][DEFAULT_ARM]) for r in rounds if "FULL" in seen[r]]
    assert len(set(full_blocks)) == 3 and full_blocks[:3] == [full_blocks[0]] * 3
    # a one-start look may not settle FULL (as fast as the default) as better or equivalent
    table = table_from_rows(rows, ("itl_p50",))
    ys, blocks = table.blocked("FULL", "itl_p50")
    assert len(set(blocks[:3])) == 1 and len(ys) == len(full_blocks)
    v = first.verdicts["FULL"].pooled["itl_p50"]
    assert v.verdict in {"undecided", "equivalent"} and (v.verdict == "undecided" or v.starts == 2)
    # the selector reads the same verdicts back, with the starts behind them
    sel = {(x.mode, x.workload): x for x in race_verdicts(rows) if x.metric == "itl_p50"}
    assert sel[("FULL", None)].verdict == v.verdict and sel[("FULL", None)].starts == max(1, v.starts)
    assert sel[("NONE", None)].verdict == "worse" and sel[("NONE", None)].starts == 1
    # bench/race_table.py prints the starts behind each verdict and the A/A arm's ratio
    out = race_table(tmp_path / "race.sqlite")
    assert "A/A arm (CONTROL, a second engine of the default) / default: itl_p50 " in out, out
    assert "worse" in out and "s=1" in out and ("s=2" in out or "undecided" in out), out



def race_table(dataset: Path) -> str:
    mod = load_bench("race_table")  # with bench/ on the path: it imports its sibling profile_cost
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert mod.main([str(dataset), "--metrics", "itl_p50"]) == 0
    return buf.getvalue()


def test_resume_counts_the_starts_already_made(tmp_path: Path, store: ProfileStore) -> None:
    # stopped after the default's restart: default 2 starts, FULL and CONTROL 1
    first = Racer(race_config(tmp_path, MODES, control=True, starts=2, max_rounds=4), store).run()
    assert first.restarts == 1 and first.arm_states["NONE"] == "decided"
    racer = Racer(race_config(tmp_path, MODES, control=True, starts=2, max_rounds=3), store)
    assert {a.name: a.starts_before for a in racer.arms} == {DEFAULT_ARM: 2, "NONE": 1, "FULL": 1, CONTROL_ARM: 1}
    assert racer.verdicts()["FULL"].pooled["itl_p50"].verdict == "undecided", "one start of FULL settled it"
    second = racer.run()
    # the session starts the default and both open challengers at once; that start is their second,
    # so no restart is left to make
    assert second.engine_starts == 3 and second.restarts == 0
    rows = store.race_rows(racer.key)
    new = [r for r in rows if r["run_id"] == racer.run_id]
    assert {r["race_arm"] for r in new} == {DEFAULT_ARM, "FULL", CONTROL_ARM}, "a decided arm was started again"
    ids: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        if r["status"] == "ok":
            ids[r["race_arm"]].add(r["race_start_id"])
    assert {a: len(s) for a, s in ids.items()} == {DEFAULT_ARM: 3, "NONE": 1, "FULL": 2, CONTROL_ARM: 2}
    _, blocks = table_from_rows(rows, ("itl_p50",)).blocked("FULL", "itl_p50")
    assert len(set(blocks)) == 3  # (F1, D1), (F1, D2), (F2, D3)
    v = second.verdicts["FULL"].pooled["itl_p50"]
    assert v.starts == 2 or v.verdict == "undecided", v


def test_cli_starts_option(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from graphmode.cli.main import app

    base = ["profile", "--race", "--dataset", str(tmp_path / "d.sqlite"), "--vllm-cmd", f"{sys.executable} x",
            "--dry-run"]
    ok = CliRunner().invoke(app, [*base, "--starts", "3", "--", "--model", str(TINY_LLAMA)])
    assert ok.exit_code == 0 and "3 starts per arm" in ok.output, ok.output
    default = CliRunner().invoke(app, [*base, "--", "--model", str(TINY_LLAMA)])
    assert default.exit_code == 0 and "2 starts per arm" in default.output, default.output
    bad = CliRunner().invoke(app, [*base, "--starts", "0", "--", "--model", str(TINY_LLAMA)])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
