"""bench/race_plan.py: races simulated with the race's wave rule and decision code."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from graphmode.profiling.race import wave_due
from graphmode.profiling.sequential import SequentialRule, sequential_decision
from tests.support.bench import load_bench


def _load() -> ModuleType:
    return load_bench("race_plan")


race_plan = _load()
DATASET = Path(__file__).resolve().parents[2] / "models/profiles/race-h200-vllm0.33-qwen2.5-0.5b.sqlite"


def cells(tau: float, sigma: float, ratios: list[float], starts: list[int], races: int = 60,
          max_rounds: int = 30) -> list[Any]:
    out: list[Any] = race_plan.plan(ratios, starts, race_plan.Noise(tau, sigma, 9.0, 75.0), SequentialRule(), 2, races,
                                    seed=1, max_rounds=max_rounds, budget_min=0.0)
    return out


def test_two_starts_make_the_chain_of_three_blocks() -> None:
    rule = SequentialRule(min_starts=2)
    noise = race_plan.Noise(0.0, 1.0, 1.0, 1.0)  # so noisy that nothing decides: every wave happens
    out = race_plan.simulate_race(0.0, [0.0, 0.0], [0.0, 0.0], [0.5, -0.5] * 10, 2, rule, noise, 2, 9, 0.0)
    assert out.waves == 2 and out.rounds == 9
    assert wave_due(2, 2, 3, 1, [(1, 2)]) is None  # the first block needs max(min_rounds, block_rounds)
    assert wave_due(2, 2, 3, 1, [(1, 3)]) == "default"
    assert wave_due(2, 2, 3, 2, [(1, 2)]) == (0,)
    assert wave_due(2, 2, 3, 2, [(2, 5)]) is None


def test_a_clear_gain_without_noise_is_called_better() -> None:
    for c in cells(0.0, 0.005, [0.8], [1, 2]):
        assert c.share["better"] >= 0.97, c


def test_an_aa_arm_with_large_start_effects_is_rarely_called_better_with_starts() -> None:
    (c,) = cells(0.07, 0.03, [1.0], [2], races=150)
    assert c.share["better"] <= 0.08, c  # the design effect keeps it near the nominal 2.5% one-sided
    assert c.wrong == c.share["better"] + c.share["worse"]


def test_more_starts_raise_equivalence_at_ratio_one() -> None:
    few, many = cells(0.025, 0.02, [1.0], [2, 5], races=80)
    assert many.share["equivalent"] > few.share["equivalent"] + 0.05, (few, many)


def test_the_planner_agrees_with_sequential_decision() -> None:
    rng = np.random.default_rng(3)
    rule = SequentialRule(min_starts=3)
    noise = race_plan.Noise(0.03, 0.05, 9.0, 75.0)
    for _ in range(20):
        a, d, e = rng.normal(0, 0.03, 3), rng.normal(0, 0.03, 3), rng.normal(0, 0.05, 25)
        out = race_plan.simulate_race(math.log(0.95), list(a), list(d), list(e), 3, rule, noise, 2, 25, 0.0)
        # rebuild the race's rounds and replay them as the selector does
        ys, blocks, ms, ds, n = [], [], 1, 1, 0
        for i in range(out.rounds):
            ys.append(math.log(0.95) + a[ms - 1] - d[ds - 1] + e[i])
            blocks.append((f"A{ms}", f"D{ds}"))
            n += 1
            due = wave_due(3, 2, rule.min_rounds, ds, [(ms, n)])
            if due is not None:
                ms, ds, n = (ms, ds + 1, 0) if due == "default" else (ms + 1, ds, 0)
        replay = sequential_decision(ys, rule, blocks)
        assert (replay.verdict, replay.n) == (out.decision.verdict, out.decision.n)


def test_a_budget_stops_the_race_and_its_waves() -> None:
    rule = SequentialRule(min_starts=2)
    noise = race_plan.Noise(0.0, 1.0, 10.0, 100.0)
    out = race_plan.simulate_race(0.0, [0.0] * 2, [0.0] * 2, [0.5, -0.5] * 20, 2, rule, noise, 2, 40, 240.0)
    assert out.waves == 0  # 100 s + 3 rounds leaves 110 s: less than a wave and two rounds
    assert out.rounds == 14 and out.gpu_s >= 240.0


def test_same_seed_same_table_and_an_answer(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--tau", "0.02", "--sigma", "0.05", "--ratio", "0.8,1.0", "--starts", "1,2", "--races", "20",
            "--max-rounds", "12", "--markdown"]
    assert race_plan.main(argv) == 0
    first = capsys.readouterr().out
    assert race_plan.main(argv) == 0
    assert capsys.readouterr().out == first
    assert "| ratio | starts | P(better)" in first and "ratio 0.8:" in first and "ratio 1:" in first


@pytest.mark.parametrize("argv", [
    ["--ratio", "0.9,abc"], ["--ratio", "-1"], ["--starts", "0"], ["--starts", "1.5"], ["--races", "0"],
    ["--sigma", "0"], ["--tau", "-0.1"], ["--delta", "1.5"], ["--max-rounds", "2"],
    ["--from", "/nonexistent.sqlite"], ["--from", str(DATASET), "--mode", "NOPE"],
    ["--from", str(DATASET), "--metric", "bogus"], ["--replicas", "1"], ["--replicas", "2,x"],
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert race_plan.main([*argv, "--races", "1"] if "--races" not in argv else argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("race_plan: error: ") and "Traceback" not in err


def test_noise_from_a_race_dataset() -> None:
    from graphmode.core.dataset import ProfileStore

    with ProfileStore(DATASET, readonly=True) as store:
        rows = store.rows()
    est, notes = race_plan.estimate(rows, "FULL", "itl_p50")
    assert 0 < est["sigma"] < 0.5 and 0 <= est["tau"] < 0.5
    assert 0 < est["round_s"] < 60 and 10 < est["wave_s"] < 600
    assert any(n.startswith("tau ") for n in notes)


def test_resident_replicas_pair_the_diagonal_and_beat_restarts_on_a_start_effect() -> None:
    """--replicas: round k pairs replica k mod R of each side (disjoint blocks, no wave); at a start effect
    the size of δ, resident replicas decide a 0.9x where two restarted starts mostly do not."""
    rule = SequentialRule(min_starts=2)
    noise = race_plan.Noise(0.0, 1.0, 1.0, 10.0)
    e = [0.5, -0.5, 0.3, 0.1, -0.4, 0.2, 0.6]
    out = race_plan.simulate_replicas(0.0, [0.0] * 3, [0.0] * 3, e, 3, rule, noise, 7, 0.0)
    assert out.waves == 0 and out.rounds == 7 and out.gpu_s == 10.0 + 7
    replay = sequential_decision(e, rule, [(f"A{k % 3 + 1}", f"D{k % 3 + 1}") for k in range(7)])
    assert out.decision.verdict == replay.verdict == "undecided" and replay.blocks == 3
    out = race_plan.plan([0.9], [2], race_plan.Noise(0.025, 0.03, 8.0, 100.0), SequentialRule(), 2, 60, seed=1,
                         max_rounds=40, budget_min=0.0, replicas_list=[6])
    restarts, resident = out
    assert not restarts.replicas and resident.replicas and resident.design == "6 resident"
    assert resident.share["better"] >= 0.9 and resident.share["better"] > restarts.share["better"] + 0.2
    assert resident.wrong == 0.0


def test_one_race_is_read_from_a_dataset_holding_several() -> None:
    """A seeded dataset holds the old race and the new one; their round numbers overlap."""
    old = [{"race_id": "race-a", "race_round": 0, "started_at": 10.0}, {"race_id": "race-a", "race_round": 1,
                                                                         "started_at": 20.0}]
    new = [{"race_id": "race-b", "race_round": 0, "started_at": 30.0}]
    rows, which = race_plan.pick_race([*old, *new, {"race_id": None, "started_at": 99.0}], "latest")
    assert rows == new and which == "race race-b, the newest of 2"
    rows, which = race_plan.pick_race([*old, *new], "race-a")
    assert rows == old and which == "race race-a"
    with pytest.raises(race_plan.PlanError, match=r"no race 'race-c'.*race-a, race-b"):
        race_plan.pick_race([*old, *new], "race-c")
    with pytest.raises(race_plan.PlanError, match="no race rows"):
        race_plan.pick_race([{"race_id": None}], "latest")
