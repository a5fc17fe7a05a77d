"""A restart wave the budget left cannot pay for is skipped (``Racer._restart_wave``).

On the H200 (vLLM 0.33, Llama-3.2-1B shape, 2026-12-01) a race with ``--starts 2`` and 10 GPU-minutes
restarted its five challengers at 8.9 GPU-minutes: the wave took 80 s and the budget ran out before one
round paired the new starts. The wave's cost is predicted from this session's latest start wave and rounds.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from graphmode.cli.race_view import print_summary
from graphmode.core.dataset import ProfileStore
from graphmode.core.modes import CudaGraphMode
from graphmode.profiling.race import Racer
from tests.unit.test_race_compile import Events
from tests.unit.test_race_fake import race_config

pytestmark = pytest.mark.timeout(180)


def test_wave_cost_is_the_last_wave_plus_block_rounds(tmp_path: Path) -> None:
    with ProfileStore(tmp_path / "race.sqlite") as store:
        racer = Racer(race_config(tmp_path, [CudaGraphMode.FULL], starts=2, block_rounds=2), store)
    assert racer._wave_cost_s() == 0.0  # nothing measured yet: a wave is never refused for a guess
    racer.last_wave_s = 80.0
    racer.round_walls = [100.0, 30.0, 20.0, 40.0]  # the mean of the last three rounds counts
    assert racer._wave_cost_s() == pytest.approx(80.0 + 2 * 30.0)


def test_a_wave_that_leaves_no_rounds_is_skipped(tmp_path: Path) -> None:
    # a slow start beside quick rounds: the first wave takes W >= 12 s of the 21-s budget, so after the
    # first block (3 rounds) less than 21 - W < W is left, and a wave costs at least W: no restart at all,
    # however fast or slow this box runs the rounds
    config = race_config(tmp_path, [CudaGraphMode.FULL], env={"FAKE_VLLM_STARTUP_S": "12"}, starts=2,
                         block_rounds=1, budget_min=0.35, warm_compile=False, max_rounds=50)
    events = Events()
    with ProfileStore(tmp_path / "race.sqlite") as store:
        summary = Racer(config, store, events).run()
    why = events.buf.getvalue()
    assert summary.restarts == 0, why
    assert summary.stop_reason.startswith("budget of 0.35 GPU-minutes spent"), why
    if summary.rounds_run >= 3:  # the first block was complete before the budget ran out
        assert summary.waves_skipped == 1, why
        assert "no restart of FULL_AND_PIECEWISE: " in why and "rounds go on with the starts up" in why
        out = io.StringIO()
        print_summary(summary, Console(file=out, width=400))
        assert "restart waves stopped by the budget" in out.getvalue()
