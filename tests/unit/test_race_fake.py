"""Races against ``tests/support/fake_vllm.py`` servers: verdicts, an engine killed mid-race, resume, budget.

The fake's step time depends on the mode (NONE 4.0 ms, FULL and the default 2.2 ms), so NONE is worse on
ITL p50 by ~1.8× and must be decided and stopped after the minimum of rounds.
"""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from graphmode.core.dataset import ProfileStore
from graphmode.core.modes import CudaGraphMode
from graphmode.profiling.grid import LengthDist, Workload
from graphmode.profiling.race import RaceConfig, Racer
from graphmode.profiling.race_rounds import CONTROL_ARM, DEFAULT_ARM
from graphmode.profiling.runner import ProfileConfig
from tests.support.bench import load_bench
from tests.unit.test_runner_fake import FAKE_VLLM, TINY_LLAMA, free_port

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)

W1 = Workload(name="w-decode", rate=10, input=LengthDist(mean=16), output=LengthDist(mean=16))
W2 = Workload(name="w-prefill", rate=10, burstiness=0.5, input=LengthDist(mean=256), output=LengthDist(mean=8))


def race_config(tmp_path: Path, modes: list[CudaGraphMode], env: dict[str, str] | None = None,
                **kw: object) -> RaceConfig:
    # slower steps: the 1.8× NONE/default gap stands out of a loaded CI box's scheduling noise
    env = {"FAKE_VLLM_STEP_S": "3", **(env or {})}
    profile = ProfileConfig(
        command=[sys.executable, str(FAKE_VLLM)], vllm_args=["--model", str(TINY_LLAMA)], modes=modes,
        workloads=[W1, W2], dataset=tmp_path / "race.sqlite", log_dir=tmp_path / "logs", port=free_port(),
        scrape_interval_s=0.2, startup_timeout_s=60.0, stop_timeout_s=5.0, read_timeout_s=30.0,
        connect_timeout_s=30.0, env=env,
    )
    # one start per arm unless a test asks for more (test_race_starts.py races several)
    base: dict[str, object] = dict(profile=profile, metrics=("itl_p50",), budget_min=5.0, cell_s=0.6,
                                   warmup_s=0.3, idle_probe_s=0.0, starts=1)
    base.update(kw)
    return RaceConfig(**base)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ProfileStore]:
    with ProfileStore(tmp_path / "race.sqlite") as s:
        yield s


def test_none_is_worse_and_its_engine_stops(tmp_path: Path, store: ProfileStore) -> None:
    # kv share given: every engine gets it, and the user's memory fraction is replaced
    config = race_config(tmp_path, [CudaGraphMode.NONE], max_rounds=8, kv_cache_memory_bytes="1G", control=True)
    config.profile.vllm_args += ["--gpu-memory-utilization", "0.9"]
    racer = Racer(config, store)
    summary = racer.run()
    v = summary.verdicts["NONE"].pooled["itl_p50"]
    assert v.verdict == "worse" and v.n >= 3 and v.ratio is not None and v.ratio > 1.3
    assert summary.arm_states["NONE"] == "decided"
    rows = store.race_rows(racer.key)
    none_rounds = sorted(r["race_round"] for r in rows if r["race_arm"] == "NONE")
    assert none_rounds == list(range(v.n)), "NONE kept running after its verdict"
    assert {r["race_arm"] for r in rows} == {DEFAULT_ARM, "NONE", CONTROL_ARM}
    assert all(r["repeat"] == r["race_round"] for r in rows)  # the round seeds the request plan
    assert all(r["race_id"] == racer.key and r["status"] == "ok" for r in rows)
    args = r_args = rows[0]["fp_vllm_args"]
    assert "--kv-cache-memory-bytes" in r_args and '"0.05"' in args and '"0.9"' not in args
    # each round's order is a shuffle seeded by the race key and the round (a resume repeats it)
    for rnd in {r["race_round"] for r in rows}:
        got = [r["race_arm"] for r in sorted(rows, key=lambda r: r["race_position"]) if r["race_round"] == rnd]
        expected = [DEFAULT_ARM, *(a for a in ("NONE", CONTROL_ARM) if a in got)]
        random.Random(f"{racer.key}:{rnd}").shuffle(expected)
        assert got == expected
    assert all(r["race_idle_cpu_cores"] is not None for r in rows if r["race_round"] > 0)
    # a fixed warm-up: every arm of a round measures the same window of the same plan (the virtual-time
    # test in test_runner_fake.py shows a fast and a slow engine; here, end to end on the fake servers)
    for rnd in {r["race_round"] for r in rows}:
        cells = [r for r in rows if r["race_round"] == rnd]
        assert all(r["warmup_used_s"] == pytest.approx(0.3, abs=0.06) for r in cells), cells
        sent = [r["n_sent"] for r in cells]
        assert max(sent) - min(sent) <= 1, sent
    # two workloads cycle, each round one of them on every engine
    by_round = {(r["race_round"], r["workload"]) for r in rows}
    assert len({rnd for rnd, _ in by_round}) == len(by_round)
    assert {w for _, w in by_round} == {"w-decode", "w-prefill"}
    # bench/profile_cost.py --compare reads the race's cost back from its dataset
    cost_mod = load_bench("profile_cost")
    (cost,) = cost_mod.dataset_costs(tmp_path / "race.sqlite")
    assert cost.kind == "race" and cost.starts == 3 and cost.rounds == summary.rounds_run
    assert 0 < cost.gpu_s <= summary.gpu_min * 60 + 1 and cost.cells == len(rows)


def test_engine_killed_mid_race_then_resume_repeats_no_decided_work(tmp_path: Path, store: ProfileStore) -> None:
    env = {"FAKE_VLLM_EXIT_AFTER": "12", "FAKE_VLLM_EXIT_MODE": "FULL"}
    config = race_config(tmp_path, [CudaGraphMode.NONE, CudaGraphMode.FULL], max_rounds=5, env=env)
    first = Racer(config, store).run()
    assert first.arm_states["FULL"] == "failed"
    assert "fake engine core died" in first.failures["FULL"], first.failures["FULL"]
    assert first.verdicts["NONE"].pooled["itl_p50"].verdict == "worse"
    rows = store.race_rows(Racer(race_config(tmp_path, [CudaGraphMode.NONE, CudaGraphMode.FULL]), store).key)
    failed = [r for r in rows if r["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["race_arm"] == "FULL" and "last log lines" in failed[0]["reason"]
    assert first.rounds_run >= 3, "the race stopped when FULL died"
    last_round = max(r["race_round"] for r in rows)

    config2 = race_config(tmp_path, [CudaGraphMode.NONE, CudaGraphMode.FULL], max_rounds=2)
    racer = Racer(config2, store)
    assert racer.rounds_before == first.rounds_run
    second = racer.run()
    assert second.engine_starts == 2, "NONE was decided: only the default and the failed FULL start again"
    new = [r for r in store.race_rows(racer.key) if r["run_id"] == racer.run_id]
    assert {r["race_arm"] for r in new} == {DEFAULT_ARM, "FULL"}
    assert min(r["race_round"] for r in new) > last_round
    assert second.arm_states["NONE"] == "decided" and second.verdicts["NONE"].pooled["itl_p50"].verdict == "worse"
    assert second.gpu_min_total > second.gpu_min


def test_budget_stops_the_race_and_says_what_stayed_open(tmp_path: Path, store: ProfileStore) -> None:
    config = race_config(tmp_path, [CudaGraphMode.FULL], budget_min=0.01)
    summary = Racer(config, store).run()
    assert "budget" in summary.stop_reason
    assert summary.verdicts["FULL"].pooled["itl_p50"].verdict == "undecided"
    assert "budget" in summary.open_reasons["FULL"]["itl_p50"]
    # a resume with the budget spent starts nothing
    again = Racer(race_config(tmp_path, [CudaGraphMode.FULL], budget_min=0.01), store).run()
    assert again.engine_starts == 0 and "earlier sessions" in again.stop_reason
    # the budget is the race's total: the reason says how much more a call must give to go on, the total the
    # earlier sessions spent (how much that is depends on the host's speed: the rule, not the number)
    spent = re.search(r"\((\d+\.\d) in all\)", again.stop_reason)
    assert spent is not None and f"give more than {spent.group(1)} to go on" in again.stop_reason


def test_engine_that_cannot_start_fails_with_vllms_reason(tmp_path: Path, store: ProfileStore) -> None:
    config = race_config(tmp_path, [CudaGraphMode.NONE, CudaGraphMode.FULL], max_rounds=3,
                         env={"FAKE_VLLM_FAIL_AT_START": "FULL"})
    summary = Racer(config, store).run()
    assert "refuses cudagraph_mode FULL" in summary.failures["FULL"]
    assert summary.arm_states["FULL"] == "failed" and summary.rounds_run == 3, "the race did not go on without FULL"
    assert {r["race_arm"] for r in store.rows(status="ok")} == {DEFAULT_ARM, "NONE"}


def test_an_unexpected_error_while_starting_an_engine_fails_that_arm(tmp_path: Path, store: ProfileStore,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vLLM's refusal but graphmode's own error in the start thread (CI, 2026-12-03: the log parser's
    SystemError from CPython 3.11's non-thread-safe AST): the arm fails with it, instead of staying neither
    live nor failed while the race went on without a word."""
    from graphmode.profiling import engine as engine_mod

    real = engine_mod.VllmServer.startup_info

    def flaky(self: engine_mod.VllmServer) -> object:
        if self.mode is CudaGraphMode.FULL:
            raise SystemError("AST constructor recursion depth mismatch (before=30, after=27)")
        return real(self)

    monkeypatch.setattr(engine_mod.VllmServer, "startup_info", flaky)
    config = race_config(tmp_path, [CudaGraphMode.NONE, CudaGraphMode.FULL], max_rounds=3)
    summary = Racer(config, store).run()
    assert summary.arm_states["FULL"] == "failed", summary.arm_states
    assert "graphmode failed while starting it: SystemError" in summary.failures["FULL"]
    assert summary.rounds_run == 3 and {r["race_arm"] for r in store.rows(status="ok")} == {DEFAULT_ARM, "NONE"}


def test_cli_race_dry_run_and_bad_flags(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from graphmode.cli.main import app

    base = ["profile", "--race", "--dataset", str(tmp_path / "d.sqlite"), "--vllm-cmd", f"{sys.executable} x"]
    ok = CliRunner().invoke(app, [*base, "--dry-run", "--control", "--kv-cache-memory-bytes", "8G", "--modes",
                                  "NONE,FULL", "--", "--model", str(TINY_LLAMA), "--gpu-memory-utilization", "0.9"])
    assert ok.exit_code == 0, ok.output
    assert "FULL_AND_PIECEWISE:8000, NONE:8001, FULL:8002, CONTROL:8003" in ok.output
    assert "--kv-cache-memory-bytes 8G --gpu-memory-utilization 0.05" in ok.output
    bad = CliRunner().invoke(app, [*base, "--race-metrics", "itl_p50,goodput", "--", "--model", str(TINY_LLAMA)])
    assert bad.exit_code == 2 and "goodput" in bad.output and "Traceback" not in bad.output
    no_model = CliRunner().invoke(app, [*base])
    assert no_model.exit_code == 2 and "no model" in no_model.output


def test_a_mode_vllm_downgrades_is_named_as_what_it_ran(tmp_path: Path, store: ProfileStore) -> None:
    """FULL on FlashInfer runs FULL_AND_PIECEWISE (vLLM 0.33 on the H200, 2026-12-02): the race, its
    verdicts, the selector and the campaign's status line say so instead of reading it as FULL."""
    import io

    from rich.console import Console

    from graphmode.cli.race_view import PlainRaceReporter
    campaign = load_bench("campaign")
    load_campaign, status_line = campaign.load_campaign, campaign.status_line
    from graphmode.selector.verdicts import race_decision, race_verdicts

    config = race_config(tmp_path, [CudaGraphMode.FULL], max_rounds=3)
    config.profile.vllm_args += ["--attention-backend", "FLASHINFER"]
    log = io.StringIO()
    racer = Racer(config, store, PlainRaceReporter(Console(file=log, width=400)))
    summary = racer.run()
    started = [ln for ln in log.getvalue().splitlines() if ": up in " in ln]
    assert any(ln.startswith("FULL:") and "runs as FULL_AND_PIECEWISE (vLLM downgraded it)" in ln for ln in started)
    # two engines started together: vLLM's graph figure is device-wide, and there is no NVML on this machine
    assert all("(device-wide, 1 engine starting beside it)" in ln and "own GPU memory unknown" in ln
               for ln in started), started
    assert summary.runs_as == {"FULL": "FULL_AND_PIECEWISE"}
    assert any(line.startswith("FULL ") and "runs as FULL_AND_PIECEWISE (vLLM downgraded it)" in line
               for line in summary.lines())
    rows = store.race_rows(racer.key)
    full = [r for r in rows if r["race_arm"] == "FULL"]
    assert full and all(r["requested_mode"] == "FULL" and r["effective_mode"] == "FULL_AND_PIECEWISE" for r in full)
    # both engines started in one wave: vLLM's graph GiB is then device-wide, the rows say so
    assert {r["start_wave_engines"] for r in rows} == {2}
    verdicts = race_verdicts(rows)
    assert verdicts and all(v.runs_as == "FULL_AND_PIECEWISE" for v in verdicts)
    shape = verdicts[0].shape
    answer = race_decision(verdicts, shape, "itl_p50", {}, ["FULL", DEFAULT_ARM], {}, weighted=False)
    assert answer is None  # no other arm: nothing this race says about FULL
    better = verdicts[0].model_copy(update={"verdict": "better", "ratio": 0.8, "starts": 2, "metric": "itl_p50",
                                            "workload": None})
    answer = race_decision([better], shape, "itl_p50", {}, ["FULL", DEFAULT_ARM], {}, weighted=False)
    assert answer is None, "a downgraded arm's 'better' must not pick the mode it is named after"
    camp = load_campaign(ROOT / "bench" / "gpu" / "configs" / "h200-0.33.yaml", ROOT)
    line = status_line(camp.get("1b-flashinfer"), tmp_path / "race.sqlite", "", 0)
    assert "downgraded by vLLM: FULL runs as FULL_AND_PIECEWISE" in line
    # no race output given: the verdicts in the line are read from the dataset's rows, as the report reads them
    assert all(f"{v.mode} {v.metric} {v.verdict}" in line for v in verdicts if v.workload is None)


def test_a_speculative_race_reports_what_its_steps_held(tmp_path: Path, store: ProfileStore) -> None:
    """With --speculative-config the cells record the acceptance (vllm:spec_decode_*), the race's cell lines
    and the campaign's status line say it, and a configuration whose cells never drafted says so."""
    import io

    from rich.console import Console

    from graphmode.cli.race_view import PlainRaceReporter
    campaign = load_bench("campaign")
    load_campaign, status_line = campaign.load_campaign, campaign.status_line

    config = race_config(tmp_path, [CudaGraphMode.FULL], max_rounds=3)
    config.profile.vllm_args += ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']
    log = io.StringIO()
    racer = Racer(config, store, PlainRaceReporter(Console(file=log, width=400)))
    racer.run()
    cells = [ln for ln in log.getvalue().splitlines() if " done" in ln and ": ITL p50 " in ln]
    assert cells and all("% accepted, " in ln and "tokens per verification step" in ln for ln in cells), cells
    rows = [r for r in store.race_rows(racer.key) if r["status"] == "ok"]
    assert rows and all(0 < r["obs_spec_acceptance_rate"] < 1 and r["obs_spec_accept_length"] > 1 for r in rows)
    camp = load_campaign(ROOT / "bench" / "gpu" / "configs" / "h200-0.33.yaml", ROOT)
    line = status_line(camp.get("1b-ngram3"), tmp_path / "race.sqlite", "", 0)
    assert "; speculative decoding: drafts " in line and f"of {len(rows)} cells)" in line
    plain = status_line(camp.get("1b-triton"), tmp_path / "race.sqlite", "", 0)
    assert "speculative" not in plain  # no speculative config: nothing to say
    store.close()
    with ProfileStore(tmp_path / "race.sqlite") as s:
        s._db.execute("UPDATE cells SET obs_spec_acceptance_rate = NULL, obs_spec_accept_length = NULL")
        s._db.commit()
    assert "no draft in any cell" in status_line(camp.get("1b-ngram3"), tmp_path / "race.sqlite", "", 0)
