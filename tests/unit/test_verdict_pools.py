"""Races of one shape at another --max-model-len pool apart (graphmode.selector.verdicts): the H200's
1b-long-prompt race (8-16K prompts at max_model_len 17408, 2026-12-03) read FULL's TTFT at 1.015x where the
short-prompt 1B race read 0.75x; pooled together they decided neither. The request's workload picks the pool."""

from __future__ import annotations

import pytest

from graphmode.core.modes import DEFAULT_MODE
from graphmode.profiling.sequential import SequentialRule
from graphmode.selector.verdicts import RaceVerdict, race_decision, race_verdicts

D = DEFAULT_MODE.value
ORDER = ["FULL", D, "PIECEWISE"]
# the default's ITL per round: the clock moves it; FULL sits at a fixed ratio to it within a round
WANDER = [1.0, 1.07, 0.95, 1.03, 0.98, 1.05, 0.93, 1.01, 1.04, 0.97]


def race(race_id: str, length: int, ratio: float, input_tokens: float) -> list[dict[str, object]]:
    """One race of shape 'abc' at *length*: FULL's TTFT at *ratio* to the default's every round (±1%)."""
    rows: list[dict[str, object]] = []
    for rnd, w in enumerate(WANDER):
        common = {"status": "ok", "race_id": race_id, "race_round": rnd, "workload": "w",
                  "fp_model_config_hash": "abc", "dep_unknown": "[]", "dep_max_model_len": length,
                  "itl_p50": 0.002 * w}
        rows.append({**common, "race_arm": D, "ttft_p50": 0.05 * w, "obs_arrival_rate": 4.0,
                     "obs_mean_input_tokens": input_tokens, "obs_mean_output_tokens": 128.0})
        rows.append({**common, "race_arm": "FULL", "ttft_p50": 0.05 * w * ratio * (1.01 if rnd % 2 else 0.99)})
    return rows


@pytest.fixture(scope="module")
def verdicts() -> list[RaceVerdict]:
    return race_verdicts(race("short", 4096, 0.75, 300.0) + race("long", 17408, 1.0, 12000.0), SequentialRule())


def pooled(vs: list[RaceVerdict]) -> dict[int | None, RaceVerdict]:
    return {v.max_model_len: v for v in vs if v.workload is None and v.metric == "ttft_p50" and v.mode == "FULL"}


def test_each_max_model_len_gets_its_own_pooled_verdict(verdicts: list[RaceVerdict]) -> None:
    by_len = pooled(verdicts)
    assert set(by_len) == {4096, 17408}
    assert by_len[4096].verdict == "better" and by_len[4096].ratio == pytest.approx(0.75, rel=0.02)
    assert by_len[17408].verdict == "equivalent" and by_len[17408].ratio == pytest.approx(1.0, abs=0.02)
    # the pool's centre: where its workloads sat, so a request can be matched to it
    assert by_len[17408].features["mean_input_tokens"] == pytest.approx(12000.0)
    assert by_len[17408].pool == ("abc", 17408, None) and "at max_model_len=17408" in by_len[17408].describe()
    # together the two would have averaged 0.87x over 20 rounds that no workload ran
    mixed = race_verdicts([{**r, "dep_max_model_len": 4096} for r in race("short", 4096, 0.75, 300.0)
                           + race("long", 4096, 1.0, 12000.0)], SequentialRule())
    (one,) = pooled(mixed).values()
    assert one.ratio is not None and 0.8 < (one.ratio_all or one.ratio) < 0.95


def test_the_request_picks_the_pool_its_workload_sits_nearest(verdicts: list[RaceVerdict]) -> None:
    short = race_decision(verdicts, "abc", "ttft_p50", {"mean_input_tokens": 256.0, "arrival_rate": 4.0},
                          ORDER, {}, weighted=False, corroborated=["FULL"])
    assert short is not None and short.mode == "FULL" and short.verdict is not None
    assert short.verdict.max_model_len == 4096
    assert any("races at max_model_len=4096 answer" in n and "nearest" in n for n in short.notes)
    long = race_decision(verdicts, "abc", "ttft_p50", {"mean_input_tokens": 9000.0, "arrival_rate": 4.0},
                         ORDER, {}, weighted=False, corroborated=["FULL"])
    assert long is not None and long.mode == D and [e.mode for e in long.equivalent] == ["FULL"]
    assert any("races at max_model_len=17408 answer" in n for n in long.notes)


def test_without_a_workload_the_deployments_length_then_the_largest_pool_answers(
        verdicts: list[RaceVerdict]) -> None:
    by_len = race_decision(verdicts, "abc", "ttft_p50", {}, ORDER, {}, weighted=False, corroborated=["FULL"],
                           max_model_len=17408)
    assert by_len is not None and by_len.mode == D
    assert any("the deployment's --max-model-len" in n for n in by_len.notes)
    fewer = [v.model_copy(update={"rounds": 3}) if v.max_model_len == 17408 else v for v in verdicts]
    largest = race_decision(fewer, "abc", "ttft_p50", {}, ORDER, {}, weighted=False, corroborated=["FULL"])
    assert largest is not None and largest.mode == "FULL"
    assert any("the most rounds" in n for n in largest.notes)


def test_one_pool_decides_as_before_without_a_note(verdicts: list[RaceVerdict]) -> None:
    only = [v for v in verdicts if v.max_model_len == 4096]
    got = race_decision(only, "abc", "ttft_p50", {"mean_input_tokens": 320.0}, ORDER, {}, weighted=False,
                        corroborated=["FULL"])
    assert got is not None and got.mode == "FULL" and not any("was raced at" in n for n in got.notes)


def test_a_request_outside_every_raced_region_gets_the_default_and_the_command(
        verdicts: list[RaceVerdict]) -> None:
    only = [v for v in verdicts if v.max_model_len == 4096]  # raced at 300-token prompts only
    got = race_decision(only, "abc", "ttft_p50", {"mean_input_tokens": 9000.0, "arrival_rate": 4.0}, ORDER, {},
                        weighted=False, corroborated=["FULL"])
    assert got is not None and got.mode == D and got.basis == "outside"
    (out,) = got.outside
    assert out.feature == "mean_input_tokens" and out.factor == pytest.approx(30.0)
    (note,) = [n for n in got.notes if "outside every raced region" in n]
    assert "mean_input_tokens 9000" in note and "30.0× above" in note
    assert "graphmode profile --race" in note and "input: {mean: 9000" in note and "--max-model-len 16384" in note
    # load above the heaviest raced workload is outside; lighter load (fewer requests in flight) is not
    busy = race_decision(only, "abc", "ttft_p50", {"mean_input_tokens": 300.0, "arrival_rate": 64.0}, ORDER, {},
                         weighted=False, corroborated=["FULL"])
    assert busy is not None and busy.basis == "outside" and busy.outside[0].feature == "arrival_rate"
    idle = race_decision(only, "abc", "ttft_p50", {"mean_input_tokens": 300.0, "arrival_rate": 0.5}, ORDER, {},
                         weighted=False, corroborated=["FULL"])
    assert idle is not None and idle.mode == "FULL"


def test_the_race_table_lists_each_pool_of_the_committed_1b_races() -> None:
    """bench/race_table.py on the H200's plain 1B race and its long-prompt race: one table each, each with its
    own cost (before, one table pooled both and carried only one dataset's cost)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    profiles = root / "models" / "profiles"
    r = subprocess.run([sys.executable, str(root / "bench" / "race_table.py"),
                        str(profiles / "race-h200-vllm0.33-llama-3.2-1b.sqlite"),
                        str(profiles / "cfg-h200-vllm0.33-1b-long-prompt.sqlite")],
                       capture_output=True, text=True, timeout=120, check=True)
    heads = [line for line in r.stdout.splitlines() if line.startswith("LlamaForCausalLM")]
    assert [h.split(":")[0] for h in heads] == ["LlamaForCausalLM 1.24B, max_model_len=4096",
                                                "LlamaForCausalLM 1.24B, max_model_len=17408"]
    assert "10 rounds" in heads[1] and "10 rounds" not in heads[0]
    long = r.stdout.split(heads[1])[1]
    full = next(line for line in long.splitlines() if line.startswith("FULL "))
    assert "undecided 1.015×" in full  # TTFT: the short prompts' win is gone at 8-16K


def test_the_noise_keeps_the_a_a_arm_of_the_pool_with_more_rounds() -> None:
    from graphmode.selector.noise import race_noise

    rows = []
    for race_id, length, rounds, aa in (("short", 4096, 10, 0.9), ("long", 17408, 4, 1.3)):
        for r in race(race_id, length, 1.0, 300.0 if length == 4096 else 12000.0)[:2 * rounds]:
            rows.append(r)
            if r["race_arm"] == D:
                rows.append({**r, "race_arm": "CONTROL", "ttft_p50": float(r["ttft_p50"]) * aa})  # type: ignore[arg-type]
    vs = race_verdicts(rows, SequentialRule())
    noise = {n.metric: n for n in race_noise(rows, vs)}
    restart = noise["ttft_p50"].restart
    assert restart is not None and restart.max_model_len == 4096 and restart.ratio == pytest.approx(0.9, rel=0.01)


def test_the_race_table_lists_the_one_and_the_four_api_server_races_apart() -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    profiles = root / "models" / "profiles"
    r = subprocess.run([sys.executable, str(root / "bench" / "race_table.py"), "--metrics", "itl_p50",
                        *(str(profiles / f"cfg-h200-vllm0.33-{n}.sqlite")
                          for n in ("1b-high-concurrency", "1b-high-concurrency-as4", "1b-saturated-as4"))],
                       capture_output=True, text=True, timeout=120, check=True)
    heads = [line.split(":")[0] for line in r.stdout.splitlines() if line.startswith("LlamaForCausalLM")]
    assert heads == ["LlamaForCausalLM 1.24B seqs=1024", "LlamaForCausalLM 1.24B seqs=1024, 4 API servers"]
    assert "CPU-bound cells" in r.stdout.split(heads[1])[1]


def test_every_verdict_carries_the_region_it_was_measured_in(verdicts: list[RaceVerdict]) -> None:
    from graphmode.selector.region import region_span

    by_len = pooled(verdicts)
    assert by_len[4096].span["mean_input_tokens"] == (300.0, 300.0)
    assert by_len[17408].span["arrival_rate"] == (4.0, 4.0)
    (w,) = [v for v in verdicts if v.workload == "w" and v.max_model_len == 4096 and v.metric == "ttft_p50"
            and v.mode == "FULL"]
    assert w.span["mean_output_tokens"] == (128.0, 128.0)
    # the region the decision reads is the stored one (every round), not the workload centres
    wide = by_len[4096].model_copy(update={"span": {"mean_input_tokens": (64.0, 2000.0)}})
    assert region_span([wide, w])["mean_input_tokens"] == (64.0, 2000.0)
