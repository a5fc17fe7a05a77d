"""The configuration campaign file (bench/campaign.py): parsing, checks, the lease plan, commands, status lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphmode.core.errors import ConfigError
from graphmode.profiling.grid import load_grid
from tests.support.bench import load_bench

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "bench" / "gpu" / "configs" / "h200-0.33.yaml"
campaign = load_bench("campaign")
Campaign, lease_plan, load_campaign = campaign.Campaign, campaign.lease_plan, campaign.load_campaign
main, race_command, root_cause, select = campaign.main, campaign.race_command, campaign.root_cause, campaign.select


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


BASE = """
name: t
defaults: {budget_min: 7.5, modes: [FULL]}
configs:
"""


def test_the_h200_campaign_loads_and_packs_into_leases_of_whole_configurations() -> None:
    camp = load_campaign(H200, ROOT)
    plan = lease_plan(camp)
    assert all(lease.planned_min <= camp.lease_min for lease in plan)
    assert [c.name for lease in plan for c in lease.configs] == [c.name for c in camp.configs]
    # five leases as planned; a top-up (a larger budget_min on a configuration already raced, as 1b-ngram5's
    # on 2026-12-03) re-packs what follows it, so the count may grow, never the configurations' order
    assert len(plan) >= 5
    names = {c.name for c in camp.configs}
    assert {"1b-flashinfer", "8b-triton", "8b-fp8", "1b-ngram5", "moe30b-full", "1b-high-concurrency"} <= names
    hc = camp.get("1b-high-concurrency")
    assert hc.max_num_seqs == 1024 and hc.engines() == 4
    moe = next(i for i, lease in enumerate(plan, 1) if lease.configs[0].name == "moe30b-full")
    assert [c.name for c in select(camp, [f"@{moe}"])] == ["moe30b-full", "moe30b-piecewise", "8b-eagle"]
    assert [c.name for c in select(camp, [f"@{len(plan) - 1}"])] == ["1b-mid-prompt", "1b-high-concurrency-as4"]
    sat = select(camp, [f"@{len(plan)}"])
    assert [c.name for c in sat] == ["1b-saturated-as4"]
    # saturated: every workload's rate far above the 1B's measured capacity (~420 req/s with as4), so the
    # concurrency cap, not the arrivals, sets the running batch
    grid = load_grid(ROOT / sat[0].grid)
    assert all(w.max_concurrency and w.max_concurrency > 512 and w.rate >= 2000 for w in grid.workloads)
    mid = camp.get("1b-mid-prompt")
    assert mid.max_model_len == 8192  # its own pool, apart from the 4096 short-prompt races


def test_race_command_carries_every_vllm_setting(tmp_path: Path) -> None:
    camp = load_campaign(H200, ROOT)
    eagle = camp.get("8b-eagle")
    cmd = race_command(eagle, work=tmp_path, tag="x", python="py", vllm_cmd="vllm", port=9000, root=ROOT)
    vllm = cmd[cmd.index("--") + 1:]
    spec = json.loads(vllm[vllm.index("--speculative-config") + 1])
    assert spec == {"method": "eagle", "model": str(tmp_path / "model-llama-3.1-8b-eagle-draft"),
                    "num_speculative_tokens": 3}
    assert cmd[cmd.index("--modes") + 1] == "FULL,PIECEWISE,FULL_DECODE_ONLY"
    assert cmd[cmd.index("--dataset") + 1] == str(tmp_path / "x-8b-eagle.sqlite")
    fi = race_command(camp.get("8b-flashinfer"), work=tmp_path, tag="x", python="py", vllm_cmd="v", port=1,
                      root=ROOT)
    assert fi[fi.index("--attention-backend") + 1] == "FLASHINFER" and "--kv-cache-memory-bytes" in fi
    fp8 = race_command(camp.get("8b-fp8"), work=tmp_path, tag="x", python="py", vllm_cmd="v", port=1, root=ROOT)
    assert fp8[fp8.index("--quantization") + 1] == "fp8"
    long = race_command(camp.get("1b-long-prompt"), work=tmp_path, tag="x", python="py", vllm_cmd="v", port=1,
                        root=ROOT)
    assert long[long.index("--max-model-len") + 1] == "17408"
    assert long[long.index("--grid") + 1] == str(ROOT / "bench" / "grids" / "race-long-prompt.yaml")
    assert "--race-metrics" not in long
    flood = race_command(camp.get("1b-high-concurrency"), work=tmp_path, tag="x", python="py", vllm_cmd="v",
                         port=1, root=ROOT)
    assert flood[flood.index("--race-metrics") + 1] == "tpot_p50,itl_p50"
    assert flood[flood.index("--vllm-cmd") + 1] == "v"  # the chain's command
    as4 = race_command(camp.get("1b-high-concurrency-as4"), work=tmp_path, tag="x", python="py", vllm_cmd="v",
                       port=1, root=ROOT)
    # several API servers start only from `vllm serve`: the configuration's own command
    assert as4[as4.index("--vllm-cmd") + 1] == "python3 -m vllm.entrypoints.cli.main serve"
    assert as4[as4.index("--api-server-count") + 1] == "4"
    assert as4[as4.index("--loadgen-processes") + 1] == "4" and "--loadgen-processes" not in flood


@pytest.mark.parametrize(("body", "message"), [
    ("  - {name: a, shape: no-such-shape}\n", "cannot read"),
    ("  - {name: a, shape: llama-3.2-1b}\n  - {name: a, shape: llama-3.2-1b}\n", "appears twice"),
    ("  - {name: a, shape: llama-3.2-1b, modes: [FULL_AND_PIECEWISE]}\n", "is the default"),
    ("  - {name: a, shape: llama-3.2-1b, modes: [FAST]}\n", "unknown cudagraph_mode"),
    ("  - {name: a, shape: llama-3.2-1b, kv: lots}\n", "not a byte size"),
    ("  - {name: a, shape: llama-3.2-1b, colour: red}\n", "configs.0 (a).colour"),
    ("  - {name: a, shape: llama-3.2-1b, vllm_args: [--max-model-len, '8']}\n", "own fields"),
    ("  - {name: a, shape: llama-3.2-1b, grid: bench/grids/race-long-prompt.yaml}\n", "more than max_model_len"),
    ("  - {name: a, shape: llama-3.2-1b, workloads: [nope]}\n", "workloads not in grid"),
    ("  - {name: a, shape: qwen3-30b-a3b, kv: 4G, modes: [FULL, PIECEWISE]}\n", "2 fit: race fewer modes"),
    ("  - {name: a, shape: llama-3.1-8b, kv: 4G, replicas: 4}\n", "or fewer replicas"),
    ("  - {name: a, shape: llama-3.2-1b, replicas: 0}\n", "replicas"),
    ("  - {name: a, shape: llama-3.2-1b, race_metrics: [itl_p99]}\n", "unknown race metric itl_p99"),
    ("  - {name: a, shape: llama-3.2-1b, vllm_cmd: \"vllm 'serve\"}\n", "not a shell command line"),
    ("  - {name: a, shape: llama-3.2-1b, vllm_cmd: '  '}\n", "vllm_cmd is empty"),
    ("  - {name: a, shape: llama-3.2-1b, speculative: {method: ngram, num_speculative_tokens: 0}}\n",
     "num_speculative_tokens"),
    ("  - {name: a, shape: llama-3.2-1b, speculative: {num_speculative_tokens: 3}}\n", "needs a method"),
    ("  - {name: a, shape: llama-3.2-1b, speculative: {method: eagle, model: '{draft}'}}\n", "draft_shape"),
    ("  - {name: a, shape: llama-3.2-1b, budget_min: 30}\n", "more than a lease"),
    ("  - {name: 'a b', shape: llama-3.2-1b}\n", "configs.0 (a b).name"),
])
def test_a_bad_configuration_is_a_clear_error(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ConfigError, match="campaign") as exc:
        load_campaign(write(tmp_path, BASE + body), ROOT)
    assert message in str(exc.value)


@pytest.mark.parametrize(("text", "message"), [
    ("", "expected a mapping"),
    ("name: t\nconfigs: []\n", "configs"),
    ("name: t\nconfigs: [\n", "not YAML"),
    ("name: t\ndefaults: 3\nconfigs: [{name: a, shape: llama-3.2-1b, budget_min: 1}]\n", "defaults"),
])
def test_a_bad_file_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_campaign(write(tmp_path, text), ROOT)


def test_the_command_line_says_what_is_wrong_without_a_traceback(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path, BASE + "  - {name: a, shape: nope}\n")
    assert main(["check", str(bad), "--root", str(ROOT)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: campaign") and "Traceback" not in err
    assert main(["names", str(H200), "--root", str(ROOT), "@9"]) == 2
    assert f"leases 1 to {len(lease_plan(load_campaign(H200, ROOT)))}" in capsys.readouterr().err
    assert main(["plan", str(H200), "--root", str(ROOT)]) == 0
    out = capsys.readouterr().out
    assert "lease 1 (~25 GPU-min): 1b-triton 8b-triton 1b-flashinfer" in out


def test_the_plan_starts_a_lease_when_the_next_configuration_would_overrun() -> None:
    camp = Campaign.model_validate({"name": "t", "lease_min": 10, "configs": [
        {"name": n, "shape": "s", "budget_min": b} for n, b in (("a", 4), ("b", 4), ("c", 1.5), ("d", 9))]})
    assert [[c.name for c in lease.configs] for lease in lease_plan(camp)] == [["a", "b"], ["c"], ["d"]]


def test_root_cause_is_the_exception_vllm_logged_not_the_wrapper() -> None:
    tail = "\n".join([
        "vLLM exited with status 1 before it became healthy",
        "--- last log lines ---",
        "(EngineCore pid=12) ERROR 12-01 10:00:00 [core.py:700] Traceback (most recent call last):",
        "(EngineCore pid=12) ERROR 12-01 10:00:00 [core.py:700] RuntimeError: Ninja build failed: nvcc fatal",
        "ERROR 12-01 10:00:01 [api_server.py:1] RuntimeError: Engine core initialization failed. See root cause",
    ])
    assert root_cause(tail) == "RuntimeError: Ninja build failed: nvcc fatal"
    argparse_tail = "usage: vllm serve [-h]\nvllm serve: error: argument --attention-backend: invalid value"
    assert root_cause(argparse_tail) == "vllm serve: error: argument --attention-backend: invalid value"
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert root_cause("INFO loading\n" + oom) == oom
    assert root_cause("INFO all fine") is None


def test_replicas_race_resident_engines_instead_of_restarts(tmp_path: Path) -> None:
    camp = load_campaign(write(tmp_path, BASE + "  - {name: a, shape: qwen2.5-0.5b, kv: 4G, replicas: 4}\n"), ROOT)
    c = camp.get("a")
    assert c.engines() == 8  # the default and FULL, four of each
    cmd = race_command(c, work=tmp_path, tag="x", python="py", vllm_cmd="v", port=1, root=ROOT)
    assert cmd[cmd.index("--replicas") + 1] == "4" and "--starts" not in cmd
    one = race_command(load_campaign(H200, ROOT).get("1b-triton"), work=tmp_path, tag="x", python="py",
                       vllm_cmd="v", port=1, root=ROOT)
    assert "--replicas" not in one and one[one.index("--starts") + 1] == "1"


def test_the_verdict_table_of_the_first_lease_names_configurations_and_downgrades(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The H200 lease of 2026-12-02 (vLLM 0.33): two 1B configurations are two tables with their own costs, and
    FULL on FlashInfer, which vLLM ran as the default's mode, is marked and read as an A/A arm."""
    from tests.support.bench import load_bench

    profiles = ROOT / "models" / "profiles"
    datasets = [str(profiles / f"cfg-h200-vllm0.33-{c}.sqlite") for c in ("1b-flashinfer", "1b-triton", "8b-triton")]
    assert load_bench("race_table").main(datasets) == 0
    out = capsys.readouterr().out
    assert "LlamaForCausalLM 1.24B attn=FLASHINFER: 7.8 GPU-min, 7 rounds, 28 cells" in out
    assert "LlamaForCausalLM 1.24B attn=TRITON_ATTN: 8.6 GPU-min, 9 rounds, 34 cells" in out
    assert "FULL → FULL_AND_PIECEWISE" in out
    assert "A/A arm (FULL, which vLLM ran as the default's FULL_AND_PIECEWISE) / default: itl_p50 1.028×" in out


def test_a_start_beside_others_does_not_own_its_logged_graph_memory() -> None:
    from graphmode.core.records import lone_start

    assert lone_start({"mode": "FULL"})  # a profile's start
    assert lone_start({"race_id": "r", "start_wave_engines": 1})  # a restart wave of one
    assert not lone_start({"race_id": "r", "start_wave_engines": 4})
    assert not lone_start({"race_id": "r"})  # race rows from before the column: their first wave overlapped


def test_the_verdict_table_adds_each_arms_own_gpu_memory_when_recorded() -> None:
    from tests.support.bench import load_bench

    race_table = load_bench("race_table")

    def row(arm: str, start: str, gib: float | None, up: float) -> dict[str, object]:
        return {"status": "ok", "race_arm": arm, "race_start_id": start, "engine_gpu_gib": gib, "startup_s": up,
                "start_wave_engines": 2}

    rows = [row("FULL_AND_PIECEWISE", "r:FULL_AND_PIECEWISE:1", 12.5, 80.0),
            row("FULL_AND_PIECEWISE", "r:FULL_AND_PIECEWISE:1", 12.5, 80.0),  # a second cell of the same start
            row("FULL", "r:FULL:1", 12.2, 70.0), row("FULL", "r:FULL:2", 12.4, 74.0)]
    line = race_table.start_line(rows)
    assert line is not None
    assert "FULL_AND_PIECEWISE 12.50 GiB, start-up 80 s in waves of 2" in line
    assert "FULL 12.30 GiB (-0.20 vs default), start-up 72 s" in line
    assert race_table.start_line([row("FULL", "r:FULL:1", None, 70.0)]) is None  # no memory recorded: no line


def test_the_verdict_table_adds_speculative_decodings_acceptance_per_arm() -> None:
    from tests.support.bench import load_bench

    race_table = load_bench("race_table")

    def row(arm: str, rate: float | None, length: float | None, status: str = "ok") -> dict[str, object]:
        return {"status": status, "race_arm": arm, "obs_spec_acceptance_rate": rate, "obs_spec_accept_length": length}

    rows = [row("FULL_AND_PIECEWISE", 0.9, 3.7), row("FULL_AND_PIECEWISE", 0.7, 3.1), row("FULL", 0.8, None),
            row("FULL", 0.1, 1.2, status="failed")]
    line = race_table.spec_line(rows)
    assert line is not None
    assert "FULL_AND_PIECEWISE 0.80 accepted, 3.40 tokens per step (2 cells)" in line
    assert "FULL 0.80 accepted, – tokens per step (1 cells)" in line
    assert race_table.spec_line([row("FULL", None, None)]) is None  # no speculative config: no line


def test_the_plan_shows_what_each_configuration_has_raced(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    shutil.copy(ROOT / "models" / "profiles" / "cfg-h200-vllm0.33-1b-triton.sqlite", tmp_path / "t-1b-triton.sqlite")
    (tmp_path / "t-8b-triton.sqlite").write_bytes(b"not a database")
    assert main(["plan", str(H200), "--root", str(ROOT), "--profiles", str(tmp_path), "--tag", "t"]) == 0
    out = capsys.readouterr().out
    assert "1b-triton [34 ok cells, 9 rounds]" in out
    assert "8b-triton [unreadable:" in out and "8b-fp8 [not raced]" in out
