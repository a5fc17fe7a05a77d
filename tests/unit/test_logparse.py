"""Start-up log parsing against real vLLM logs (tests/fixtures/vllm-*) and against garbage."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from graphmode.core.records import StartupInfo
from graphmode.profiling.logparse import parse_startup_log

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H200 = FIXTURES / "vllm-0.24-h200"
CPU_LOG = FIXTURES / "vllm-0.32-cpu" / "tiny-llama-NONE.log"

SHAPES = ("llama1b", "llama8b", "qwen0.5b")
MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
ALL_H200 = [(shape, mode) for shape in SHAPES for mode in MODES]

ARCHITECTURE = {"llama1b": "LlamaForCausalLM", "llama8b": "LlamaForCausalLM", "qwen0.5b": "Qwen2ForCausalLM"}
RUNNER = {"llama1b": "model_runner", "llama8b": "model_runner", "qwen0.5b": "gpu_model_runner"}
GPU_MEM_UTIL = {"llama1b": 0.3, "llama8b": 0.5, "qwen0.5b": 0.5}


def h200(shape: str, mode: str) -> Path:
    return H200 / f"{shape}-{mode}.log"


def parse_startup_log_file(path: Path, requested_mode: str | None = None) -> StartupInfo:
    """A fixture log parsed as the runner parses a captured one (undecodable bytes replaced)."""
    return parse_startup_log(path.read_bytes().decode("utf-8", errors="replace"), requested_mode)


# Values copied by hand from the log lines, not from the parser's output.
EXACT: dict[tuple[str, str], dict[str, Any]] = {
    ("llama1b", "FULL_AND_PIECEWISE"): {
        "model_load_gib": 2.32,
        "model_load_s": 2.512959,
        "dynamo_s": 1.61,
        "compile_s": 2.55,
        "kv_cache_gib": 38.59,
        "kv_cache_tokens": 1_264_656,
        "max_concurrency": 308.75,
        "capture_s": 3.0,
        "graph_gib": 0.45,
        "estimated_graph_gib": None,
        "init_engine_s": 17.56,
        "capture_labels": ["PIECEWISE", "FULL"],
    },
    ("llama1b", "NONE"): {
        "model_load_s": 2.701012,
        "dynamo_s": 4.7,
        "compile_s": 17.47,
        "kv_cache_gib": 38.59,
        "kv_cache_tokens": 1_264_656,
        "capture_s": None,
        "graph_gib": None,
        "init_engine_s": 29.01,
        "capture_labels": [],
    },
    ("llama8b", "FULL"): {
        "model_load_gib": 15.0,
        "model_load_s": 3.107375,
        "dynamo_s": 6.53,
        "compile_s": 22.61,
        "kv_cache_gib": 53.57,
        "kv_cache_tokens": 438_816,
        "max_concurrency": 107.13,
        "capture_s": 3.0,
        "graph_gib": 0.68,
        "init_engine_s": 38.0,
        "capture_labels": ["FULL"],
    },
    ("llama8b", "PIECEWISE"): {
        "model_load_s": 2.180259,
        "compile_s": 24.28,
        "capture_s": 5.0,
        "graph_gib": 0.35,
        "init_engine_s": 41.92,
        "capture_labels": ["PIECEWISE"],
    },
    ("qwen0.5b", "FULL_AND_PIECEWISE"): {
        "model_load_gib": 0.93,
        "model_load_s": 0.524876,
        "dynamo_s": 5.74,
        "compile_s": 19.23,
        "estimated_graph_gib": 0.35,
        "kv_cache_gib": 66.23,
        "kv_cache_tokens": 5_787_408,
        "max_concurrency": 1412.94,
        "capture_s": 6.0,
        "graph_gib": 0.33,
        "init_engine_s": 38.76,
        "capture_labels": ["mixed prefill-decode, PIECEWISE", "decode, FULL"],
    },
    ("qwen0.5b", "FULL_DECODE_ONLY"): {
        "estimated_graph_gib": 0.16,
        "kv_cache_gib": 66.43,
        "kv_cache_tokens": 5_804_816,
        "max_concurrency": 1417.19,
        "capture_s": 4.0,
        "graph_gib": 0.17,
        "init_engine_s": 35.46,
        "capture_labels": ["decode, FULL"],
    },
    ("qwen0.5b", "NONE"): {
        "model_load_s": 0.814579,
        "compile_s": 18.98,
        "estimated_graph_gib": None,
        "kv_cache_gib": 66.59,
        "kv_cache_tokens": 5_818_976,
        "max_concurrency": 1420.65,
        "capture_s": None,
        "graph_gib": None,
        "init_engine_s": 30.03,
        "capture_labels": [],
    },
}


@pytest.mark.parametrize(("shape", "mode"), ALL_H200)
def test_every_h200_log_parses(shape: str, mode: str) -> None:
    info = parse_startup_log_file(h200(shape, mode))
    assert info.vllm_version == "0.24.0"
    assert info.architecture == ARCHITECTURE[shape]
    assert info.model_runner == RUNNER[shape]
    assert info.attention_backend == "FLASH_ATTN"
    assert info.max_num_batched_tokens == 8192
    assert info.requested_mode == mode
    assert info.effective_mode == mode
    for name in ("dynamo_s", "compile_s", "model_load_gib", "model_load_s", "kv_cache_gib", "init_engine_s"):
        assert isinstance(getattr(info, name), float), name
    assert info.kv_cache_tokens is not None and info.kv_cache_tokens > 0
    assert info.max_concurrency is not None and info.max_concurrency > 0
    captured = mode != "NONE"
    assert (info.capture_s is not None) == captured
    assert (info.graph_gib is not None) == captured
    assert bool(info.capture_labels) == captured
    # Only the Qwen2 shape runs on gpu_model_runner, the one that estimates graph memory first.
    assert (info.estimated_graph_gib is not None) == (captured and shape == "qwen0.5b")
    assert info.startup_s is None
    args = info.non_default_args
    assert args is not None
    assert args["port"] == 8123
    assert args["gpu_memory_utilization"] == GPU_MEM_UTIL[shape]
    assert args["compilation_config"]["cudagraph_mode"] == f"CUDAGraphMode.{mode}"


@pytest.mark.parametrize(("shape", "mode"), sorted(EXACT))
def test_h200_exact_values(shape: str, mode: str) -> None:
    info = parse_startup_log_file(h200(shape, mode))
    for name, expected in EXACT[(shape, mode)].items():
        assert getattr(info, name) == expected, name


def test_capture_labels_are_distinct_and_in_order() -> None:
    info = parse_startup_log_file(h200("qwen0.5b", "FULL"))
    assert info.capture_labels == ["mixed prefill-decode, FULL"]


def test_requested_mode_argument_wins_over_the_log() -> None:
    info = parse_startup_log_file(h200("llama1b", "PIECEWISE"), requested_mode="FULL")
    assert info.requested_mode == "FULL"
    assert info.effective_mode == "PIECEWISE"


def test_vllm_032_cpu_log() -> None:
    info = parse_startup_log_file(CPU_LOG)
    assert info.vllm_version == "0.32.0"
    assert info.architecture == "LlamaForCausalLM"
    assert info.model_runner == "cpu_model_runner"
    assert info.kv_cache_gib == 4.79
    assert info.kv_cache_tokens == 5_025_024
    assert info.max_concurrency == 4907.25
    assert info.init_engine_s == 43.2
    assert info.requested_mode == "NONE"
    assert info.effective_mode == "NONE"
    assert info.capture_labels == []
    assert info.non_default_args is not None
    assert info.non_default_args["max_model_len"] == 1024
    assert info.non_default_args["gpu_memory_utilization"] == 0.5
    # The CPU build prints none of these.
    for name in (
        "attention_backend",
        "dynamo_s",
        "compile_s",
        "model_load_gib",
        "model_load_s",
        "capture_s",
        "graph_gib",
        "estimated_graph_gib",
        "max_num_batched_tokens",
    ):
        assert getattr(info, name) is None, name


# --- effective mode: vLLM's own downgrade messages, spliced into a real log after the engine config line ---

PREFIX = "(EngineCore pid=2912) WARNING 11-29 22:38:25 "
DOWNGRADES = [
    (
        "FULL_AND_PIECEWISE",
        "[compilation.py:1412] CUDAGraphMode.FULL_AND_PIECEWISE is not supported with FlashInferBackend "
        "backend (support: AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE); "
        "setting cudagraph_mode=FULL_DECODE_ONLY",
        "FULL_DECODE_ONLY",
    ),
    (
        "FULL_AND_PIECEWISE",
        "[compilation.py:1459] CUDAGraphMode.FULL_AND_PIECEWISE is not supported with spec-decode for "
        "attention backend FlashInferBackend (support: AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE); "
        "setting cudagraph_mode=PIECEWISE",
        "PIECEWISE",
    ),
    (
        "FULL",
        "[compilation.py:1439] CUDAGraphMode.FULL is not supported with TritonMLABackend backend (support: "
        "AttentionCGSupport.NEVER); setting cudagraph_mode=NONE because attention is not compiled piecewise",
        "NONE",
    ),
    (
        "FULL_AND_PIECEWISE",
        "[compilation.py:1466] Cudagraph mode CUDAGraphMode.FULL_AND_PIECEWISE requires piecewise capture, "
        "but the loaded model provides neither a compiled submodule nor breakable CUDA graphs. "
        "Overriding to CUDAGraphMode.FULL.",
        "FULL",
    ),
    (
        "PIECEWISE",
        "[compilation.py:1217] Piecewise compilation with empty splitting_ops does not contain piecewise "
        "cudagraph. Setting cudagraph_mode to NONE. Hint: If you are using attention backends that support "
        "cudagraph, consider manually setting cudagraph_mode to FULL or FULL_DECODE_ONLY to enable full "
        "cudagraphs.",
        "NONE",
    ),
    (
        "FULL",
        "[vllm.py:1917] KV connector LMCacheConnectorV1 requires PIECEWISE CUDA graph mode due to layerwise "
        "async operations that cannot be captured in CUDA graphs. Overriding cudagraph_mode from FULL to "
        "PIECEWISE.",
        "PIECEWISE",
    ),
    (
        "PIECEWISE",
        "[gpu_model_runner.py:6598] Skipping CUDA graph capture. To turn on CUDA graph capture, ensure "
        "`cudagraph_mode` was not manually set to `NONE`",
        "NONE",
    ),
]



def test_cpu_eagle_start_records_its_speculative_config() -> None:
    # vLLM 0.32 CPU, tiny Llama + one-layer dummy EAGLE draft (fixtures/vllm-0.32-cpu/SOURCE.md)
    info = parse_startup_log_file(FIXTURES / "vllm-0.32-cpu" / "tiny-llama-eagle3.log")
    assert info.non_default_args is not None
    assert info.non_default_args["speculative_config"] == {
        "method": "eagle", "model": "/tmp/eagle-probe/draft", "num_speculative_tokens": 3}
    assert (info.kv_cache_tokens, info.max_concurrency, info.init_engine_s) == (644_736, 629.62, 50.12)
    assert info.effective_mode == "NONE" and info.downgrades == []

def _splice_after_engine_config(text: str, line: str) -> str:
    lines = text.split("\n")
    at = next(i for i, old in enumerate(lines) if "Initializing a V1 LLM engine" in old)
    return "\n".join([*lines[: at + 1], line, *lines[at + 1 :]])


@pytest.mark.parametrize(("mode", "message", "ended_with"), DOWNGRADES)
def test_downgrade_warning_sets_effective_mode(mode: str, message: str, ended_with: str) -> None:
    text = _splice_after_engine_config(h200("llama1b", mode).read_text(), PREFIX + message)
    info = parse_startup_log(text)
    assert info.requested_mode == mode
    assert info.effective_mode == ended_with


def test_engine_config_line_gives_effective_mode() -> None:
    resolved = "<CUDAGraphMode.{}>, 'cudagraph_num_of_warmups': 1"
    text = (
        h200("llama1b", "FULL")
        .read_text()
        .replace(resolved.format("FULL: 2"), resolved.format("PIECEWISE: 1"))
    )
    info = parse_startup_log(text)
    assert info.requested_mode == "FULL"
    assert info.effective_mode == "PIECEWISE"


def _without_engine_config(text: str) -> str:
    return "\n".join(line for line in text.split("\n") if "Initializing a V1 LLM engine" not in line)


def test_effective_mode_falls_back_to_requested_once_captured() -> None:
    text = _without_engine_config(h200("llama8b", "FULL_DECODE_ONLY").read_text())
    assert parse_startup_log(text).effective_mode == "FULL_DECODE_ONLY"


def test_effective_mode_none_when_none_requested_and_nothing_captured() -> None:
    text = "Resolved architecture: LlamaForCausalLM\ninit engine (profile) took 3.00 s\n"
    assert parse_startup_log(text, requested_mode="NONE").effective_mode == "NONE"


def test_effective_mode_unknown_when_requested_graphs_never_captured() -> None:
    text = "Resolved architecture: LlamaForCausalLM\n"
    info = parse_startup_log(text, requested_mode="FULL")
    assert info.requested_mode == "FULL"
    assert info.effective_mode is None


# --- robustness ---


def test_empty_log() -> None:
    info = parse_startup_log("")
    assert info == StartupInfo()


@pytest.mark.parametrize("seed", range(20))
def test_random_bytes_never_raise(seed: int) -> None:
    rng = random.Random(seed)
    blob = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 5000)))
    info = parse_startup_log(blob.decode("utf-8", errors="replace"))
    assert isinstance(info, StartupInfo)


def test_random_bytes_file(tmp_path: Path) -> None:
    path = tmp_path / "garbage.log"
    path.write_bytes(b"\xff\xfe\x00\x80" * 100 + b"Resolved architecture: X\n")
    assert parse_startup_log_file(path).architecture == "X"


@pytest.mark.parametrize("seed", range(10))
def test_truncated_logs_never_raise(seed: int) -> None:
    rng = random.Random(seed)
    text = h200(rng.choice(SHAPES), rng.choice(MODES)).read_text()
    cut = text[: rng.randint(0, len(text))]
    assert isinstance(parse_startup_log(cut), StartupInfo)


def test_truncated_non_default_args_is_none() -> None:
    text = h200("llama1b", "FULL").read_text()
    line = next(line for line in text.split("\n") if "non-default args" in line)
    info = parse_startup_log(line[:-40] + "}")
    assert info.non_default_args is None
    # The requested mode is still read from the raw text.
    assert info.requested_mode == "FULL"


def test_non_literal_non_default_args_is_none() -> None:
    info = parse_startup_log("INFO [api_utils.py:273] non-default args: {'model': PosixPath('/m')}\n")
    assert info.non_default_args is None


def test_numbers_that_are_not_numbers_stay_none() -> None:
    info = parse_startup_log("Graph capturing finished in 3.4.5 secs, took x GiB\nKV cache size: , tokens\n")
    assert info.capture_s is None
    assert info.graph_gib is None
    assert info.kv_cache_tokens is None


def test_progress_bars_and_ansi_do_not_hide_lines() -> None:
    text = (
        "Capturing CUDA graphs (PIECEWISE):  50%|█████     | 1/2\r"
        "Capturing CUDA graphs (PIECEWISE): 100%|██████████| 2/2\r"
        "(EngineCore pid=1) \x1b[32mINFO\x1b[0m 11-29 22:38:35 [\x1b[1mmodel_runner.py:726\x1b[0m] "
        "Graph capturing finished in 3 secs, took 0.45 GiB\r\n"
        "\x1b[2K(EngineCore pid=1) INFO 11-29 22:38:32 [kv_cache_utils.py:2146] "
        "GPU KV cache size: 12 tokens\n"
    )
    info = parse_startup_log(text, requested_mode="PIECEWISE")
    assert info.capture_labels == ["PIECEWISE"]
    assert info.capture_s == 3.0
    assert info.graph_gib == 0.45
    assert info.model_runner == "model_runner"
    assert info.kv_cache_tokens == 12
    assert info.effective_mode == "PIECEWISE"


def test_older_attention_backend_phrasings() -> None:
    older = parse_startup_log("INFO [cuda.py:1] Using Flash Attention backend on V1 engine.\n")
    assert older.attention_backend == "Flash Attention"
    assert parse_startup_log("INFO [cpu.py:1] Using Torch SDPA backend.\n").attention_backend == "Torch SDPA"
    assert parse_startup_log("INFO [fused_moe.py:1] Using TRITON backend for MoE\n").attention_backend is None


def test_version_from_api_server_line() -> None:
    info = parse_startup_log(
        "(APIServer pid=1) INFO 01-01 00:00:00 [api_server.py:1] vLLM API server version 0.9.2"
    )
    assert info.vllm_version == "0.9.2"
