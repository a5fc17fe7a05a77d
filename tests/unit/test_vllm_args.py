"""Rewriting vLLM command lines: the mode lands in --compilation-config, every other key survives."""

from __future__ import annotations

import json

import pytest

from graphmode.core.errors import ConfigError
from graphmode.core.modes import CudaGraphMode
from graphmode.vllm_args import (
    compilation_config_of,
    get_flag,
    has_flag,
    model_arg,
    user_mode,
    with_mode,
    without_flags,
)

FULL = CudaGraphMode.FULL


def _cc(args: list[str]) -> dict[str, object]:
    """The one --compilation-config of a rewritten command line, asserting there is exactly one."""
    flags = [t for t in args if t in ("--compilation-config", "-cc", "--compilation_config")
             or t.startswith(("--compilation-config=", "-cc=", "--compilation_config="))]
    assert flags == ["--compilation-config"], args
    value = json.loads(args[args.index("--compilation-config") + 1])
    assert isinstance(value, dict)
    return value


def test_with_mode_adds_a_config() -> None:
    args = ["--model", "m", "--max-model-len", "4096"]
    out = with_mode(args, FULL)
    assert out[:4] == args
    assert _cc(out) == {"cudagraph_mode": "FULL"}
    assert args == ["--model", "m", "--max-model-len", "4096"]  # input untouched


@pytest.mark.parametrize(
    "form",
    [
        lambda v: ["--compilation-config", v],
        lambda v: [f"--compilation-config={v}"],
        lambda v: ["-cc", v],
        lambda v: [f"-cc={v}"],
        lambda v: ["--compilation_config", v],
    ],
)
def test_with_mode_merges_into_existing_config(form) -> None:  # type: ignore[no-untyped-def]
    given = json.dumps({"level": 3, "cudagraph_mode": "NONE", "cudagraph_capture_sizes": [1, 2, 4],
                        "pass_config": {"enable_fusion": True}})
    args = ["--model", "m", *form(given), "--max-num-seqs", "64"]
    out = with_mode(args, CudaGraphMode.FULL_DECODE_ONLY)
    assert _cc(out) == {"level": 3, "cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4],
                        "pass_config": {"enable_fusion": True}}
    rest = out[: out.index("--compilation-config")]
    assert rest == ["--model", "m", "--max-num-seqs", "64"]


def test_with_mode_last_config_wins_and_all_are_replaced() -> None:
    args = ["-cc", '{"level": 1}', "--compilation-config={\"level\": 2, \"x\": 1}", "--enforce-eager"]
    out = with_mode(args, CudaGraphMode.PIECEWISE)
    assert _cc(out) == {"level": 2, "x": 1, "cudagraph_mode": "PIECEWISE"}
    assert "--enforce-eager" in out


def test_with_mode_is_idempotent() -> None:
    once = with_mode(["--model", "m", "-cc", '{"level": 3}'], FULL)
    twice = with_mode(once, CudaGraphMode.NONE)
    assert _cc(twice) == {"level": 3, "cudagraph_mode": "NONE"}
    assert len(twice) == len(once)


@pytest.mark.parametrize("bad", ["{level: 3}", "not json", '{"a": 1', ""])
def test_invalid_json_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        with_mode(["--compilation-config", bad], FULL)
    with pytest.raises(ConfigError, match="not valid JSON"):
        compilation_config_of([f"-cc={bad}"])


@pytest.mark.parametrize("bad", ["[1, 2]", "3", '"FULL"', "null"])
def test_non_object_json_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="JSON object"):
        with_mode(["-cc", bad], FULL)


def test_compilation_config_of() -> None:
    assert compilation_config_of([]) == {}
    assert compilation_config_of(["--model", "m"]) == {}
    assert compilation_config_of(["-cc", '{"a": [1]}']) == {"a": [1]}
    # a flag with no value after it is not a config
    assert compilation_config_of(["--compilation-config"]) == {}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], None),
        (["--model", "m"], None),
        (["-cc", '{"level": 3}'], None),
        (["-cc", '{"cudagraph_mode": "FULL"}'], CudaGraphMode.FULL),
        (["--compilation-config={\"cudagraph_mode\": \"piecewise\"}"], CudaGraphMode.PIECEWISE),
        (["-cc", '{"cudagraph_mode": "CUDAGraphMode.FULL_AND_PIECEWISE"}'], CudaGraphMode.FULL_AND_PIECEWISE),
        (["-cc", '{"cudagraph_mode": " none "}'], CudaGraphMode.NONE),
    ],
)
def test_user_mode(args: list[str], expected: CudaGraphMode | None) -> None:
    assert user_mode(args) == expected


def test_user_mode_unknown_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown cudagraph_mode 'SOMETIMES'"):
        user_mode(["-cc", '{"cudagraph_mode": "SOMETIMES"}'])


@pytest.mark.parametrize(
    ("command", "args", "expected"),
    [
        (["vllm", "serve"], ["meta-llama/Llama-3.2-1B", "--max-model-len", "4096"], "meta-llama/Llama-3.2-1B"),
        (["/venv/bin/vllm", "serve"], ["/models/x"], "/models/x"),
        (["vllm", "serve"], ["--max-model-len", "4096"], None),
        (["vllm", "serve"], [], None),
        (["vllm", "serve"], ["pos", "--model", "explicit"], "explicit"),
        (["python", "-m", "vllm.entrypoints.openai.api_server"], ["--model", "m"], "m"),
        (["python", "-m", "vllm.entrypoints.openai.api_server"], ["--model=m2"], "m2"),
        (["python", "-m", "vllm.entrypoints.openai.api_server"], ["positional"], None),
        ([], ["--model", "m"], "m"),
        ([], [], None),
    ],
)
def test_model_arg(command: list[str], args: list[str], expected: str | None) -> None:
    assert model_arg(command, args) == expected


def test_without_flags() -> None:
    args = ["--host", "0.0.0.0", "--model", "m", "--port=9000", "--hostname", "h", "--port", "1", "--x"]
    assert without_flags(args, "--host", "--port") == ["--model", "m", "--hostname", "h", "--x"]
    assert without_flags(args) == args
    assert without_flags([], "--host") == []
    assert without_flags(["--host"], "--host") == []  # a dangling flag goes too


def test_get_and_has_flag() -> None:
    args = ["--served-model-name", "a", "--served-model-name=b", "--port", "1"]
    assert get_flag(args, "--served-model-name") == "b"  # the last one wins, as argparse does
    assert get_flag(args, "--port") == "1"
    assert get_flag(args, "--host") is None
    assert get_flag(["--port"], "--port") is None
    assert has_flag(args, "--port") and has_flag(args, "--served-model-name")
    assert has_flag(["--enforce-eager"], "--enforce-eager")
    assert not has_flag(["--portx", "1"], "--port")
