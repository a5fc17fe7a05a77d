"""Every form a user can give vLLM a compilation config in counts as the user's (issue 44, item 4):
``-O JSON``, ``-O.key=value`` and the dotted ``--compilation-config.key`` forms, like ``--compilation-config``.
``launch`` keeps the user's cudagraph_mode from any of them and never emits two compilation configs."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from graphmode.cli.main import app
from graphmode.control.choose import merge_graph_config, merge_mode
from graphmode.core.errors import ConfigError
from graphmode.core.modes import CudaGraphMode
from graphmode.vllm_args import compilation_config_of, user_mode, with_compilation_config, with_mode

PW = CudaGraphMode.PIECEWISE
CC_TOKENS = ("--compilation-config", "-cc", "--compilation_config", "-O")

FORMS = [
    ["-O", '{"cudagraph_mode":"PIECEWISE","level":3}'],
    ['-O={"cudagraph_mode":"PIECEWISE","level":3}'],
    ["-O.cudagraph_mode=PIECEWISE", "-O.level=3"],
    ["-O.cudagraph_mode", "PIECEWISE", "-O.level", "3"],
    ["--compilation-config.cudagraph_mode=PIECEWISE", "-cc.level=3"],
    ["--compilation-config", '{"cudagraph_mode":"PIECEWISE","level":3}'],
]


def _cc_flags(args: list[str]) -> list[str]:
    return [t for t in args if t.split("=", 1)[0].split(".", 1)[0] in CC_TOKENS]


@pytest.mark.parametrize("form", FORMS)
def test_every_form_is_the_users_config(form: list[str]) -> None:
    args = ["--model", "m", *form, "--max-num-seqs", "64"]
    assert compilation_config_of(args) == {"cudagraph_mode": "PIECEWISE", "level": 3}
    assert user_mode(args) == PW
    plan = merge_mode(args, CudaGraphMode.FULL_AND_PIECEWISE, force=False)
    assert not plan.applied and plan.mode == PW and plan.args == args


@pytest.mark.parametrize("form", FORMS)
def test_a_rewrite_folds_every_form_into_one_config(form: list[str]) -> None:
    args = ["--model", "m", *form, "-O3", "--max-num-seqs", "64"]
    out = with_mode(args, CudaGraphMode.FULL)
    assert _cc_flags(out) == ["--compilation-config"], out
    assert json.loads(out[-1]) == {"cudagraph_mode": "FULL", "level": 3}
    assert out[:-2] == ["--model", "m", "-O3", "--max-num-seqs", "64"]  # an optimization level stays


def test_dotted_keys_nest_and_fold_in_order() -> None:
    args = ["-cc", '{"level": 1, "pass_config": {"a": 1}}', "-O.pass_config.b=true", "-O.cudagraph_capture_sizes=[1,2]"]
    assert compilation_config_of(args) == {"level": 1, "pass_config": {"a": 1, "b": True},
                                           "cudagraph_capture_sizes": [1, 2]}
    out = with_compilation_config(args, {"cudagraph_capture_sizes": [4]})
    assert _cc_flags(out) == ["--compilation-config"]
    with pytest.raises(ConfigError, match="empty part"):
        compilation_config_of(["-O.a..b=1"])


def test_the_users_sizes_in_a_dotted_form_are_kept() -> None:
    args = ["--model", "m", "-O.cudagraph_capture_sizes=[1,2,4]"]
    plan = merge_graph_config(args, CudaGraphMode.FULL, {"cudagraph_capture_sizes": [8, 16]}, force=False)
    assert "keeping the user's cudagraph_capture_sizes" in plan.message
    assert compilation_config_of(plan.args)["cudagraph_capture_sizes"] == [1, 2, 4]


def test_an_optimization_level_is_not_a_config() -> None:
    assert compilation_config_of(["-O3"]) == {} and compilation_config_of(["-O", "3"]) == {}
    assert with_mode(["-O", "3"], PW)[:2] == ["-O", "3"]


def test_launch_keeps_the_users_O_mode() -> None:
    argv = ["launch", "--dry-run", "--", "--model", "X", "-O", '{"cudagraph_mode":"PIECEWISE"}']
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    command = result.output.strip().splitlines()[-1]
    assert "FULL_AND_PIECEWISE" not in command and "--compilation-config" not in command, result.output
    assert "keeping the user's cudagraph_mode PIECEWISE" in result.output
