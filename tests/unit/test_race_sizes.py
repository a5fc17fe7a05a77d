"""Capture-size arms of a race (profiling/race_sizes.py): parsing, the merged compilation config, the race
key, and a race against ``tests/support/fake_vllm.py`` servers, which honour ``cudagraph_capture_sizes``
(a decode step above the largest size runs at NONE's step time; fewer sizes capture faster into less memory).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from graphmode.core.dataset import ProfileStore
from graphmode.core.errors import ConfigError
from graphmode.profiling.grid import LengthDist, Workload
from graphmode.profiling.race import Racer, race_key
from graphmode.profiling.race_rounds import DEFAULT_ARM
from graphmode.profiling.race_sizes import check_sizes_arms, is_sizes_row, parse_sizes_arm, sizes_arm, sizes_arm_args
from graphmode.selector.verdicts import race_verdicts
from graphmode.vllm_args import compilation_config_of
from tests.unit.test_race_fake import race_config
from tests.unit.test_runner_fake import TINY_LLAMA

pytestmark = pytest.mark.timeout(180)

# ~10 requests running: a list that stops at 4 leaves most decode steps without a graph
BUSY = Workload(name="w-busy", rate=50, input=LengthDist(mean=16), output=LengthDist(mean=32))


def test_parse_sizes_arm_forms_and_errors(tmp_path: Path) -> None:
    a = parse_sizes_arm("low=16, 8,1,2,4,8")
    assert a.name == "low" and a.sizes == (1, 2, 4, 8, 16) and a.spec() == "low=1,2,4,8,16"
    assert a.compilation_config() == {"cudagraph_capture_sizes": [1, 2, 4, 8, 16], "max_cudagraph_capture_size": 16}
    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps({"cudagraph_capture_sizes": [4, 1, 2], "max_cudagraph_capture_size": 4}))
    assert parse_sizes_arm(f"hi=@{rec}").sizes == (1, 2, 4)
    rec.write_text("[1, 8]")
    assert parse_sizes_arm(f"hi=@{rec}").sizes == (1, 8)
    for bad, words in [("low", "NAME=SIZE"), ("low=", "NAME=SIZE"), ("low=1,x", "integers"),
                       ("low=0,4", "1..65536"), ("FULL=1,2", "is a mode"), ("control=1", "is a mode"),
                       ("a b=1", "letters"), (f"x=@{tmp_path / 'none.json'}", "cannot read")]:
        with pytest.raises(ConfigError, match=words):
            parse_sizes_arm(bad)
    rec.write_text('{"sizes": [1]}')
    with pytest.raises(ConfigError, match="no list"):
        parse_sizes_arm(f"x=@{rec}")


def test_arm_args_merge_with_the_users_compilation_config() -> None:
    user = ["--model", "m", "--compilation-config", '{"cudagraph_mode":"PIECEWISE","level":3}', "--max-num-seqs", "8"]
    args = sizes_arm_args(user, sizes_arm("low", [8, 1, 2]))
    cc = compilation_config_of(args)
    assert cc == {"cudagraph_mode": "PIECEWISE", "level": 3, "cudagraph_capture_sizes": [1, 2, 8],
                  "max_cudagraph_capture_size": 8}
    assert args.count("--compilation-config") == 1 and args[:2] == ["--model", "m"] and "--max-num-seqs" in args


def test_check_refuses_what_would_spoil_the_comparison() -> None:
    a, b = sizes_arm("a", [1, 2]), sizes_arm("b", [1, 4])
    check_sizes_arms([a, b], ["--model", "m"], ["FULL_AND_PIECEWISE"])
    check_sizes_arms([], ["--compilation-config", '{"cudagraph_capture_sizes":[1]}'], [])
    with pytest.raises(ConfigError, match="named twice"):
        check_sizes_arms([a, sizes_arm("a", [8])], [], [])
    with pytest.raises(ConfigError, match="same list"):
        check_sizes_arms([a, sizes_arm("c", [2, 1])], [], [])
    with pytest.raises(ConfigError, match="max_cudagraph_capture_size"):
        check_sizes_arms([a], ["--compilation-config", '{"max_cudagraph_capture_size":64}'], [])


def test_race_key_includes_the_arms_lists_and_keeps_old_keys(tmp_path: Path) -> None:
    config = race_config(tmp_path, [])
    plain = race_key("p", config, [BUSY])
    one = race_key("p", race_config(tmp_path, [], sizes_arms=(sizes_arm("low", [1, 2]),)), [BUSY])
    other = race_key("p", race_config(tmp_path, [], sizes_arms=(sizes_arm("low", [1, 4]),)), [BUSY])
    renamed = race_key("p", race_config(tmp_path, [], sizes_arms=(sizes_arm("lo", [1, 2]),)), [BUSY])
    assert len({plain, one, other, renamed}) == 4
    # the key of a race without sizes arms is what it was before they existed (resumes keep working)
    assert plain == race_key("p", race_config(tmp_path, [], sizes_arms=()), [BUSY])


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ProfileStore]:
    with ProfileStore(tmp_path / "race.sqlite") as s:
        yield s


def test_sizes_arms_race_get_rows_startups_and_verdicts(tmp_path: Path, store: ProfileStore) -> None:
    arms = (sizes_arm("short", [1, 2, 4]), sizes_arm("fit", [1, 2, 4, 8, 16, 32, 64]))
    config = race_config(tmp_path, [], max_rounds=6, sizes_arms=arms)
    config.profile.workloads = [BUSY]
    racer = Racer(config, store)
    assert [(a.name, a.sizes) for a in racer.arms] == [(DEFAULT_ARM, None), ("short", (1, 2, 4)),
                                                        ("fit", (1, 2, 4, 8, 16, 32, 64))]
    summary = racer.run()
    assert not summary.failures, summary.failures
    short = summary.verdicts["short"].pooled["itl_p50"]
    assert short.verdict == "worse" and short.ratio is not None and short.ratio > 1.2, short
    assert summary.verdicts["fit"].pooled["itl_p50"].n >= 3
    rows = store.race_rows(racer.key)
    by_arm = {a: [r for r in rows if r["race_arm"] == a] for a in (DEFAULT_ARM, "short", "fit")}
    assert all(by_arm.values())
    for r in by_arm["fit"]:
        assert r["mode"] == r["race_requested_mode"] == "FULL_AND_PIECEWISE"
        assert json.loads(r["race_capture_sizes"]) == [1, 2, 4, 8, 16, 32, 64]  # asked for
        assert json.loads(r["capture_sizes"]) == [1, 2, 4, 8, 16, 32, 64]  # what vLLM resolved
        assert compilation_config_of(json.loads(r["fp_vllm_args"]))["max_cudagraph_capture_size"] == 64
        assert is_sizes_row(r)
    d = by_arm[DEFAULT_ARM][0]
    assert d["race_capture_sizes"] is None and not is_sizes_row(d) and len(json.loads(d["capture_sizes"])) == 51
    f = by_arm["fit"][0]
    assert f["capture_s"] < d["capture_s"] and f["graph_gib"] < d["graph_gib"]
    assert f["kv_cache_tokens"] > d["kv_cache_tokens"] and f["startup_s"] is not None
    # each arm its own compile cache
    assert racer.cache_root(racer.arms[1]) != racer.cache_root(racer.arms[2])
    # the selector takes no mode verdict from a sizes arm
    assert not {v.mode for v in race_verdicts(rows)} & {"short", "fit"}

    # a resume with the same arms continues the race; other lists are another race
    resumed = race_config(tmp_path, [], max_rounds=1, sizes_arms=arms)
    resumed.profile.workloads = [BUSY]
    again = Racer(resumed, store)
    assert again.key == racer.key and again.rounds_before == summary.rounds_run
    assert again.arms[1].starts_before == 1


def test_cli_sizes_arm_dry_run_and_errors(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from graphmode.cli.main import app

    base = ["profile", "--race", "--dataset", str(tmp_path / "d.sqlite"), "--vllm-cmd", f"{sys.executable} x",
            "--dry-run"]
    ok = CliRunner().invoke(app, [*base, "--sizes-arm", "low=1,2,4,8", "--sizes-arm", "high=1,2,4,8,16,32,64",
                                  "--modes", "FULL", "--", "--model", str(TINY_LLAMA)])
    assert ok.exit_code == 0, ok.output
    assert "FULL_AND_PIECEWISE:8000, FULL:8001, low:8002, high:8003" in ok.output
    bad = CliRunner().invoke(app, [*base, "--sizes-arm", "low=1,2", "--", "--model", str(TINY_LLAMA),
                                   "--compilation-config", '{"cudagraph_capture_sizes":[4]}'])
    assert bad.exit_code == 2 and "drop it" in bad.output and "Traceback" not in bad.output
    clash = CliRunner().invoke(app, [*base, "--sizes-arm", "NONE=1", "--", "--model", str(TINY_LLAMA)])
    assert clash.exit_code == 2 and "is a mode" in clash.output


def test_an_engine_started_with_its_own_list_is_a_sizes_row() -> None:
    # The capture chain's lone starts of recommended lists (H200, 2026-12-02): vLLM's log lists the sizes among
    # its non-default args; such rows measured a list, so training and verdicts leave them out.
    own = {"non_default_args": json.dumps({"compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE",
                                                                  "cudagraph_capture_sizes": [1, 3, 4, 6, 256]}})}
    assert is_sizes_row(own)
    assert is_sizes_row({"non_default_args": {"compilation_config": '{"cudagraph_capture_sizes": [8]}'}})
    default = {"non_default_args": json.dumps({"compilation_config": {"cudagraph_mode": "FULL",
                                                                      "cudagraph_capture_sizes": None}})}
    assert not is_sizes_row(default) and not is_sizes_row({"non_default_args": "not json"})
    assert not is_sizes_row({"non_default_args": None}) and not is_sizes_row({})
