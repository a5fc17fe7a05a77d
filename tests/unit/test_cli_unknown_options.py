"""Commands that pass vLLM's args on (after ``--``) refuse an unknown option or a stray arg before ``--``: a
misspelt option is a usage error that names it, with the command's closest options, never a silent vLLM arg."""

from __future__ import annotations

import importlib
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from graphmode.cli import recommend_cmd, watch_cmd
from graphmode.cli.common import _after_separator
from graphmode.cli.main import app
from graphmode.core.errors import EngineError

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
TINY_LLAMA = ROOT / "tests" / "fixtures" / "tiny-llama"
WORKLOAD = ["--rate", "1", "--input-tokens", "64", "--output-tokens", "128"]
runner = CliRunner()


def _invoke(argv: list[str], tmp_path: Path) -> Any:
    return runner.invoke(app, argv, env={"COLUMNS": "80", "GRAPHMODE_VLLM__COMMAND": "vllm serve",
                                         "GRAPHMODE_CONTROL__STATE_DIR": str(tmp_path),
                                         "GRAPHMODE_SELECTOR__MODELS_DIR": str(tmp_path / "models")})


# (command line up to the misspelt option, the misspelt option and its value, the option it hints)
MISSPELT = [
    (["recommend", *WORKLOAD], ["--model-pth", "x"], "--model-path"),
    (["check", "--json"], ["--vllm-versoin", "0.33.0"], "--vllm-version"),
    (["launch", "--dry-run"], ["--rat", "8"], "--rate"),
    (["watch", "--dry-run"], ["--atach", "http://vllm:8000"], "--attach"),
    (["profile", "--dry-run"], ["--rcae"], "--race"),
    (["retrain"], ["--fersh"], "--fresh"),
]


@pytest.mark.parametrize(("head", "bad", "hint"), MISSPELT, ids=[m[0][0] for m in MISSPELT])
@pytest.mark.parametrize("tail", [[], ["--", "--model", str(TINY_LLAMA)]], ids=["no-vllm-args", "vllm-args"])
def test_a_misspelt_option_is_a_usage_error_with_the_closest_option(
        head: list[str], bad: list[str], hint: str, tail: list[str], tmp_path: Path) -> None:
    r = _invoke([*head, *bad, *tail], tmp_path)
    assert r.exit_code == 2, r.output
    line = f"error: unknown option {bad[0]} for graphmode {head[0]} (see --help); vLLM's args go after --"
    assert line in r.output and "Traceback" not in r.output
    assert "; did you mean " in r.output and hint in r.output.split("; did you mean ", 1)[1]
    assert len(r.output.strip().splitlines()) == 1  # one line, nothing run


def test_an_unknown_option_far_from_every_option_gets_no_hint(tmp_path: Path) -> None:
    r = _invoke(["recommend", *WORKLOAD, "--bogus-flag", "3"], tmp_path)
    assert r.exit_code == 2
    assert r.output.strip() == ("error: unknown option --bogus-flag for graphmode recommend (see --help); "
                                "vLLM's args go after --")


def test_the_wrong_model_option_names_the_model_options(tmp_path: Path) -> None:
    """``--model-config`` was taken as a vLLM arg: the answer was for the default model, and nothing said so."""
    r = _invoke(["recommend", *WORKLOAD, "--model-config=x"], tmp_path)
    assert r.exit_code == 2
    assert "unknown option --model-config for graphmode recommend" in r.output
    assert r.output.strip().endswith("did you mean --model-id, --models-dir or --model-path?")


@pytest.mark.parametrize("command", ["recommend", "check", "launch", "watch", "profile", "retrain"])
def test_a_positional_arg_before_the_separator_is_a_usage_error(command: str, tmp_path: Path) -> None:
    r = _invoke([command, str(TINY_LLAMA), "--", "--max-model-len", "4096"], tmp_path)
    assert r.exit_code == 2, r.output
    assert (f"error: unexpected argument {str(TINY_LLAMA)!r} for graphmode {command} (see --help); "
            "vLLM's args go after --") in r.output


def test_an_option_whose_value_is_the_separator_does_not_end_the_options() -> None:
    raw = ["--vllm-cmd", "--", "--bogus", "--", "--model", "x"]
    assert _after_separator(raw, ["--bogus", "--model", "x"]) == 2  # click took the first -- as a value
    assert _after_separator(["--", "--", "x"], ["--", "x"]) == 2  # a second -- is vLLM's
    assert _after_separator(["--rate", "1", "--bogus"], ["--bogus"]) == 0
    assert _after_separator(["--bogus", "--", "--bogus"], ["--bogus", "--bogus"]) == 1


def test_an_unknown_option_after_a_separator_taken_as_a_value_is_refused(tmp_path: Path) -> None:
    r = _invoke(["launch", "--dry-run", "--vllm-cmd", "--", "--bogus", "--", "--model", "/m"], tmp_path)
    assert r.exit_code == 2 and "unknown option --bogus for graphmode launch" in r.output


# The same args after -- reach the command as vLLM's.

def test_recommend_passes_the_args_after_the_separator_as_vllm_args(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[list[str]] = []

    def fake_run(opts: Any, extra: list[str]) -> Any:
        seen.append(extra)
        raise typer.Exit(0)

    monkeypatch.setattr(recommend_cmd, "run_recommend", fake_run)
    r = _invoke(["recommend", *WORKLOAD, "--", "--model-config", "x", "--bogus-flag", "3"], tmp_path)
    assert r.exit_code == 0, r.output
    assert seen == [["--model-config", "x", "--bogus-flag", "3"]]


def test_check_reads_the_args_after_the_separator(tmp_path: Path) -> None:
    r = _invoke(["check", "--models-dir", str(MODELS), "--vllm-version", "0.33.0", "--json", "--",
                 "--model", str(TINY_LLAMA), "--max-num-seqs", "1024", "--bogus-flag", "3"], tmp_path)
    assert r.exit_code == 0, r.output
    resolved = json.loads(r.stdout)["resolved"]
    assert resolved["max_num_seqs"] == 1024 and resolved["max_num_seqs_source"] == "--max-num-seqs"
    before = _invoke(["check", "--max-num-seqs", "1024", "--", "--model", str(TINY_LLAMA)], tmp_path)
    assert before.exit_code == 2 and "unknown option --max-num-seqs for graphmode check" in before.output


def test_launch_starts_vllm_with_the_args_after_the_separator(tmp_path: Path) -> None:
    r = _invoke(["launch", "--dry-run", "--models-dir", str(MODELS), "--state-dir", str(tmp_path), *WORKLOAD,
                 "--vllm-cmd", "vllm serve", "--", "--model", "/m", "--bogus-flag", "3"], tmp_path)
    assert r.exit_code == 0, r.output
    argv = shlex.split(r.stdout.strip().splitlines()[-1])
    assert argv[:4] == ["vllm", "serve", "--model", "/m"] and argv[4:6] == ["--bogus-flag", "3"]


def test_watch_manages_vllm_with_the_args_after_the_separator(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[list[str]] = []

    async def fake_watch(extra: list[str], opts: Any) -> None:
        seen.append(list(extra))

    monkeypatch.setattr(watch_cmd, "_watch", fake_watch)
    r = _invoke(["watch", "--dry-run", "--", "--model", "/m", "--atach", "x"], tmp_path)
    assert r.exit_code == 0, r.output
    assert seen == [["--model", "/m", "--atach", "x"]]


def test_profile_starts_vllm_with_the_args_after_the_separator(tmp_path: Path) -> None:
    r = runner.invoke(app, ["profile", "--dry-run", "--dataset", str(tmp_path / "d.sqlite"), "--modes", "NONE",
                            "--vllm-cmd", f"{sys.executable} serve", "--", "--model", str(TINY_LLAMA), "--rcae"],
                      env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert f"vLLM command: {sys.executable} serve --model {TINY_LLAMA} --rcae" in r.output


def test_retrain_profiles_with_the_args_after_the_separator(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    retrain_mod = importlib.import_module("graphmode.selector.retrain")
    seen: list[list[str]] = []

    def fake_retrain(config: Any, **kw: Any) -> Any:
        seen.append(list(config.vllm_args))
        raise EngineError("not started")

    monkeypatch.setattr(retrain_mod, "retrain", fake_retrain)
    r = _invoke(["retrain", "--dataset", str(tmp_path / "p.sqlite"), "--models-dir", str(tmp_path / "m"),
                 "--modes", "NONE", "--", "--model", str(TINY_LLAMA), "--fersh"], tmp_path)
    assert r.exit_code == 1 and "not started" in r.output
    assert seen == [["--model", str(TINY_LLAMA), "--fersh"]]
