"""Start-up log parsing against real vLLM 0.33.0 logs from an H200 (tests/fixtures/vllm-0.33-h200)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from graphmode.profiling.logparse import parse_startup_log
from tests.support.logs import parse_startup_log_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H200_033 = FIXTURES / "vllm-0.33-h200"
H200_024 = FIXTURES / "vllm-0.24-h200"

QWEN_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE", "CONTROL")
# The default capture sizes of both releases for max_num_batched_tokens 8192: [1, 2, 4], 8..248 by 8, 256..512 by 16.
DEFAULT_SIZES = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]

# Values copied by hand from the log lines, not from the parser's output. graph_gib is negative where vLLM
# printed it so: the race starts six engines on one GPU and each one's "free before - free after" sees the others.
EXACT: dict[str, dict[str, Any]] = {
    "qwen0.5b-NONE": {
        "requested_mode": "NONE", "effective_mode": "NONE",
        "dynamo_s": 5.80, "compile_s": 18.14, "model_load_gib": 0.93, "model_load_s": 6.198518,
        "capture_s": None, "graph_gib": None, "estimated_graph_gib": None,
        "init_engine_s": 143.59, "capture_labels": [], "graph_counts": {},
        "capture_sizes": [], "max_capture_size": 0,
    },
    "qwen0.5b-PIECEWISE": {
        "requested_mode": "PIECEWISE", "effective_mode": "PIECEWISE",
        "dynamo_s": 6.20, "compile_s": 18.96, "model_load_gib": 0.93, "model_load_s": 6.978298,
        "capture_s": 5.0, "graph_gib": -1.70, "estimated_graph_gib": None,
        "init_engine_s": 148.22, "capture_labels": ["PIECEWISE"], "graph_counts": {"PIECEWISE": 51},
    },
    "qwen0.5b-FULL": {
        "requested_mode": "FULL", "effective_mode": "FULL",
        "dynamo_s": 6.59, "compile_s": 19.80, "model_load_gib": 0.93, "model_load_s": 7.099582,
        "capture_s": 3.0, "graph_gib": -3.98, "estimated_graph_gib": None,
        "init_engine_s": 145.86, "capture_labels": ["FULL"], "graph_counts": {"FULL": 51},
    },
    "qwen0.5b-FULL_DECODE_ONLY": {
        "requested_mode": "FULL_DECODE_ONLY", "effective_mode": "FULL_DECODE_ONLY",
        "dynamo_s": 7.50, "compile_s": 20.68, "model_load_gib": 0.93, "model_load_s": 7.285904,
        "capture_s": 4.0, "graph_gib": -6.30, "estimated_graph_gib": None,
        # V2 labels decode-only graphs plain "FULL" (0.24's V1 runner said "decode, FULL").
        "init_engine_s": 146.72, "capture_labels": ["FULL"], "graph_counts": {"FULL": 51},
    },
    "qwen0.5b-FULL_AND_PIECEWISE": {
        "requested_mode": "FULL_AND_PIECEWISE", "effective_mode": "FULL_AND_PIECEWISE",
        "dynamo_s": 6.86, "compile_s": 19.81, "model_load_gib": 0.93, "model_load_s": 6.655431,
        "capture_s": 8.0, "graph_gib": 0.71, "estimated_graph_gib": None,
        "init_engine_s": 152.11, "capture_labels": ["PIECEWISE", "FULL"],
        "graph_counts": {"PIECEWISE": 51, "FULL": 51},
    },
    "qwen0.5b-CONTROL": {
        "requested_mode": "FULL_AND_PIECEWISE", "effective_mode": "FULL_AND_PIECEWISE",
        "dynamo_s": 7.45, "compile_s": 19.30, "model_load_gib": 0.93, "model_load_s": 7.264645,
        "capture_s": 7.0, "graph_gib": -8.25, "estimated_graph_gib": None,
        "init_engine_s": 149.01, "capture_labels": ["PIECEWISE", "FULL"],
        "graph_counts": {"PIECEWISE": 51, "FULL": 51},
    },
    "llama1b-FULL_AND_PIECEWISE": {
        # No --compilation-config: nothing requested, the resolved config says FULL_AND_PIECEWISE.
        "requested_mode": None, "effective_mode": "FULL_AND_PIECEWISE",
        "architecture": "LlamaForCausalLM",
        "dynamo_s": 3.06, "compile_s": 12.38, "model_load_gib": 2.32, "model_load_s": 4.643598,
        # The second of two captures (the first, 4 s and 0.35 GiB, is the memory-profiling pass).
        "capture_s": 5.0, "graph_gib": 0.28, "estimated_graph_gib": 0.52,
        "kv_cache_gib": 64.69, "kv_cache_tokens": 2_119_792, "max_concurrency": 517.53,
        "init_engine_s": 30.42, "capture_labels": ["PIECEWISE", "FULL"],
        "graph_counts": {"PIECEWISE": 51, "FULL": 51},
    },
}


def fixture(name: str) -> Path:
    return H200_033 / f"{name}.log"


@pytest.mark.parametrize("name", sorted(EXACT))
def test_033_exact_values(name: str) -> None:
    info = parse_startup_log_file(fixture(name))
    for field, expected in EXACT[name].items():
        assert getattr(info, field) == expected, field


@pytest.mark.parametrize("name", sorted(EXACT))
def test_033_common_facts(name: str) -> None:
    info = parse_startup_log_file(fixture(name))
    assert info.vllm_version == "0.33.0"
    assert info.model_runner == "model_runner"  # V2 for Qwen2 too (0.24 ran it on gpu_model_runner)
    assert info.model_runner_v2 is True
    assert info.attention_backend == "FLASH_ATTN"
    assert info.flash_attn_version == 3
    assert info.breakable_cudagraph is None  # neither shape auto-enables it; no line says so
    assert info.max_num_batched_tokens == 8192
    assert info.downgrades == []
    if name != "qwen0.5b-NONE":
        assert info.capture_sizes == DEFAULT_SIZES
        assert info.max_capture_size == 512


@pytest.mark.parametrize("mode", QWEN_MODES)
def test_033_race_engines_report_the_kv_reservation(mode: str) -> None:
    info = parse_startup_log_file(fixture(f"qwen0.5b-{mode}"))
    assert info.architecture == "Qwen2ForCausalLM"
    # --kv-cache-memory-bytes 8G: "reserved 8.0 GiB memory for KV Cache", no "Available KV cache memory".
    assert info.kv_cache_gib == 8.0
    # 0.33 prints tokens and concurrency on one line.
    assert info.kv_cache_tokens == 699_040
    assert info.max_concurrency == 170.66
    args = info.non_default_args
    assert args is not None and args["kv_cache_memory_bytes"] == 8 * 1024**3
    assert args["gpu_memory_utilization"] == 0.05


def test_033_lone_engine_args() -> None:
    args = parse_startup_log_file(fixture("llama1b-FULL_AND_PIECEWISE")).non_default_args
    assert args == {"port": 8123, "model": "/tmp/m1b", "max_model_len": 4096, "skip_tokenizer_init": True,
                    "load_format": "dummy", "gpu_memory_utilization": 0.5}


def test_requested_mode_from_the_launcher_fills_a_default_start() -> None:
    info = parse_startup_log_file(fixture("llama1b-FULL_AND_PIECEWISE"), requested_mode="FULL_AND_PIECEWISE")
    assert info.requested_mode == info.effective_mode == "FULL_AND_PIECEWISE"


# --- the 0.24 fixtures keep their values; new fields are filled only where 0.24 said so ---

@pytest.mark.parametrize("shape", ["llama1b", "llama8b", "qwen0.5b"])
def test_024_new_fields(shape: str) -> None:
    for mode in ("NONE", "FULL", "FULL_AND_PIECEWISE"):
        info = parse_startup_log_file(H200_024 / f"{shape}-{mode}.log")
        # 0.24 ran V2 only for some architectures; Qwen2 ran V1 without saying so.
        assert info.model_runner_v2 is (True if shape.startswith("llama") else None)
        assert info.flash_attn_version == 3
        assert info.breakable_cudagraph is None


def test_024_qwen_estimate_still_from_its_own_line() -> None:
    # 0.24's V1 runner prints both "Estimated CUDA graph memory" and the pool line; the first keeps priority.
    info = parse_startup_log_file(H200_024 / "qwen0.5b-FULL_AND_PIECEWISE.log")
    assert (info.estimated_graph_gib, info.graph_gib, info.capture_s) == (0.35, 0.33, 6.0)


# --- 0.33 lines seen only in vLLM's source (no real log holds them yet) ---

def test_033_stock_torch_compile_override_to_none() -> None:
    text = (
        "(EngineCore pid=1) WARNING 12-01 00:00:00 [vllm.py:3315] CUDA graphs are not supported with stock "
        "torch.compile in Model Runner V2. Overriding cudagraph_mode FULL_AND_PIECEWISE to NONE.\n"
    )
    info = parse_startup_log(text, requested_mode="FULL_AND_PIECEWISE")
    assert info.effective_mode == "NONE"
    assert len(info.downgrades) == 1


def test_033_breakable_graphs_and_runner_fallback() -> None:
    on = parse_startup_log("WARNING [vllm.py:848] Auto-enabling VLLM_USE_BREAKABLE_CUDAGRAPH=1. Set "
                           "VLLM_USE_BREAKABLE_CUDAGRAPH=0 to opt out.\n")
    assert on.breakable_cudagraph is True
    assert parse_startup_log("INFO [breakable_cudagraph.py:294] Breakable CUDA graph enabled\n").breakable_cudagraph
    fallback = parse_startup_log("WARNING [vllm.py:760] Model Runner V2 does not yet support LoRA; using the V1 "
                                 "model runner instead.\n")
    assert fallback.model_runner_v2 is False


def test_plain_server_version_line() -> None:
    info = parse_startup_log("(APIServer pid=1) INFO [startup.py:18] vLLM server version 0.33.0, serving model /m\n")
    assert info.vllm_version == "0.33.0"


def test_negative_or_garbled_graph_memory() -> None:
    assert parse_startup_log("Graph capturing finished in 7 secs, took -8.25 GiB\n").graph_gib == -8.25
    garbled = parse_startup_log("Graph capturing finished in 7 secs, took --8 GiB\n")
    assert garbled.capture_s is None and garbled.graph_gib is None


def test_a_real_flashinfer_start_downgrades_full_as_the_rules_predict() -> None:
    """vLLM 0.33 on the H200 (2026-12-02, configuration campaign lease 1): FULL asked for with
    --attention-backend FLASHINFER ran FULL_AND_PIECEWISE; graphmode.selector.compat predicts the same."""
    from graphmode.selector.compat import deployment_of, resolve

    st = parse_startup_log_file(H200_033 / "llama1b-flashinfer-FULL.log", requested_mode="FULL")
    assert st.requested_mode == "FULL" and st.effective_mode == "FULL_AND_PIECEWISE"
    assert st.attention_backend == "FLASHINFER"
    assert st.downgrades == ["CUDAGraphMode.FULL is not supported with FlashInferBackend backend (support: "
                             "AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE); "
                             "setting cudagraph_mode=FULL_AND_PIECEWISE"]
    # it captured what FULL_AND_PIECEWISE captures: both graph kinds, 51 sizes each
    assert st.capture_labels == ["PIECEWISE", "FULL"] and st.graph_counts == {"PIECEWISE": 51, "FULL": 51}
    mode, why = resolve("FULL", deployment_of(["--attention-backend", "FLASHINFER"], None, {}))
    assert mode == st.effective_mode and why


@pytest.mark.parametrize(("mode", "counts"), [("FULL", {"FULL": 51}),
                                              ("FULL_AND_PIECEWISE", {"PIECEWISE": 51, "FULL": 49})])
def test_a_real_ngram_start_runs_the_mode_asked(mode: str, counts: dict[str, int]) -> None:
    """vLLM 0.33 on the H200 (2026-12-02, configuration campaign lease 3): ngram speculative decoding with k=3
    on FLASH_ATTN ran FULL and FULL_AND_PIECEWISE as asked, and graphmode.selector.compat agrees (it used to
    send every ngram deployment to PIECEWISE)."""
    from graphmode.selector.compat import deployment_of, resolve

    st = parse_startup_log_file(H200_033 / f"llama1b-ngram3-{mode}.log")
    assert st.requested_mode == mode and st.effective_mode == mode and st.downgrades == []
    assert st.attention_backend == "FLASH_ATTN" and st.vllm_version == "0.33.0"
    # decode graphs for a query of 1+k=4 tokens per request: vLLM rounds the decode sizes up to multiples of
    # 4 (1, 2 -> 4: 49 distinct sizes), the mixed (PIECEWISE) graphs keep all 51
    assert st.graph_counts == counts
    spec = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
    assert resolve(mode, deployment_of(["--speculative-config", spec], None, {})) == (mode, [])


def test_start_logs_parse_alike_from_many_threads_at_once() -> None:
    """A race's start wave parses every engine's log in its own thread; CPython 3.11's parser is not
    thread-safe (CI, 2026-12-03: "SystemError: AST constructor recursion depth mismatch" in one of nine),
    so the literal parse runs under a lock and gives every thread the same answer."""
    import threading

    text = next(iter(sorted(H200_033.glob("*.log")))).read_text()
    want = parse_startup_log(text)
    got: list[object] = []
    errors: list[BaseException] = []

    def parse() -> None:
        try:
            for _ in range(5):
                got.append(parse_startup_log(text))
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=parse) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(got) == 40 and all(g == want for g in got)
