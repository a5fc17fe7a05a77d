"""/metrics parsing and the observed-feature contract.

Real captures: ``tests/fixtures/vllm-0.32-cpu/metrics-{idle,after-load}.txt`` come from a vLLM 0.32 CPU
server (tiny-llama, dummy weights) before and after 6 completions of 8 prompt tokens and 16 generated
tokens each. The GPU-style texts below are hand-made after vLLM's ``vllm/v1/metrics/loggers.py``: they
stand in for a 0.24 server on a GPU with two data-parallel engines, and for the pre-0.13 releases that
still used the old metric names.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from graphmode.core.errors import GraphmodeError, ScrapeError
from graphmode.core.records import ObservedFeatures
from graphmode.profiling.features import (
    FeatureWindow,
    binned_cv,
    compute_features,
    counters_reset,
    server_latency,
    since_last_reset,
)
from graphmode.profiling.metrics import Histogram, MetricsSnapshot, parse_metrics, scrape, scrape_sync
from tests.support.net import free_port, serve_http

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu"
IDLE = FIXTURES / "metrics-idle.txt"
AFTER_LOAD = FIXTURES / "metrics-after-load.txt"

needs_captures = pytest.mark.skipif(
    not (IDLE.exists() and AFTER_LOAD.exists()), reason="vLLM 0.32 CPU captures not present"
)


def _file_sum(text: str, sample: str) -> float:
    """Sum of every series of ``sample`` in ``text``, read line by line, independently of the parser."""
    pattern = re.compile(rf"^{re.escape(sample)}(?:\{{[^}}]*\}})? (\S+)$")
    values = [float(m.group(1)) for line in text.splitlines() if (m := pattern.match(line))]
    assert values, f"{sample} not in the capture"
    return math.fsum(values)


# --------------------------------------------------------------------------------------------------
# Real captures, vLLM 0.32 on CPU
# --------------------------------------------------------------------------------------------------


@needs_captures
def test_idle_capture_is_all_zero_but_present() -> None:
    snap = parse_metrics(IDLE.read_text(), t=100.0)
    assert snap.t == 100.0
    assert snap.prompt_tokens_total == 0.0
    assert snap.generation_tokens_total == 0.0
    assert snap.request_success_total == 0.0
    assert snap.num_preemptions_total == 0.0
    assert snap.num_requests_running == 0.0
    assert snap.num_requests_waiting == 0.0
    assert snap.kv_cache_usage == 0.0
    assert snap.iteration_tokens == Histogram(
        sum=0.0,
        count=0.0,
        buckets=[(float(le), 0.0) for le in (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)]
        + [(math.inf, 0.0)],
    )
    assert snap.inter_token_latency is not None and snap.inter_token_latency.count == 0.0


@needs_captures
def test_after_load_capture_exact_values() -> None:
    text = AFTER_LOAD.read_text()
    snap = parse_metrics(text, t=110.0)
    # 6 requests x (8 prompt + 16 generated tokens), all finished by length (ignore_eos).
    assert snap.prompt_tokens_total == 48.0
    assert snap.generation_tokens_total == 96.0
    assert snap.request_success_total == 6.0
    assert snap.num_preemptions_total == 0.0
    assert snap.num_requests_running == 0.0
    assert snap.num_requests_waiting == 0.0
    assert snap.kv_cache_usage == 0.0
    assert snap.request_prompt_tokens is not None and snap.request_prompt_tokens.mean == 8.0
    assert snap.request_generation_tokens is not None and snap.request_generation_tokens.mean == 16.0
    it = snap.iteration_tokens
    assert it is not None
    assert (it.sum, it.count) == (144.0, 37.0)
    assert it.buckets[:5] == [(1.0, 16.0), (8.0, 32.0), (16.0, 36.0), (32.0, 37.0), (64.0, 37.0)]
    assert it.buckets[-1] == (math.inf, 37.0)
    ttft = snap.time_to_first_token
    assert ttft is not None and ttft.count == 6.0 and ttft.sum == pytest.approx(0.06122422218322754)
    itl = snap.inter_token_latency
    assert itl is not None and itl.count == 90.0 and itl.sum == pytest.approx(0.21852845400002252)
    assert itl.buckets[0] == (0.01, 90.0)


@needs_captures
def test_after_load_counters_match_the_file_line_by_line() -> None:
    text = AFTER_LOAD.read_text()
    snap = parse_metrics(text, t=0.0)
    assert snap.prompt_tokens_total == _file_sum(text, "vllm:prompt_tokens_total")
    assert snap.generation_tokens_total == _file_sum(text, "vllm:generation_tokens_total")
    # summed over finished_reason: stop, length, abort, error, repetition
    assert snap.request_success_total == _file_sum(text, "vllm:request_success_total")
    assert snap.num_preemptions_total == _file_sum(text, "vllm:num_preemptions_total")
    assert snap.iteration_tokens is not None
    assert snap.iteration_tokens.sum == _file_sum(text, "vllm:iteration_tokens_total_sum")
    # look-alike series must not leak in
    assert _file_sum(text, "vllm:prompt_tokens_cached_total") == 0.0
    assert _file_sum(text, "vllm:prompt_tokens_by_source_total") == 48.0


@needs_captures
def test_features_from_idle_to_after_load() -> None:
    idle = parse_metrics(IDLE.read_text(), t=0.0)
    loaded = parse_metrics(AFTER_LOAD.read_text(), t=10.0)
    f = compute_features([idle, loaded])
    assert f.window_s == 10.0 and f.n_samples == 2
    assert f.completion_rate == pytest.approx(0.6)
    assert f.arrival_rate == pytest.approx(0.6)  # nothing left in the system
    assert f.prompt_tokens_rate == pytest.approx(4.8)
    assert f.generation_tokens_rate == pytest.approx(9.6)
    assert f.prefill_decode_ratio == pytest.approx(0.5)
    assert f.mean_input_tokens == pytest.approx(8.0)
    assert f.mean_output_tokens == pytest.approx(16.0)
    assert f.iter_tokens_mean == pytest.approx(144 / 37)
    # Δbuckets: 16 steps in [0,1], 16 in (1,8], 4 in (8,16], 1 in (16,32]
    assert f.iter_tokens_cv == pytest.approx(_cv([(0.5, 16), (4.5, 16), (12.0, 4), (24.0, 1)]))
    assert f.preemptions == 0.0
    assert (f.batch_mean, f.batch_var, f.batch_max, f.batch_cv) == (0.0, 0.0, 0.0, None)
    assert (f.queue_mean, f.concurrency_mean, f.kv_usage_mean, f.kv_usage_max) == (0.0, 0.0, 0.0, 0.0)


# --------------------------------------------------------------------------------------------------
# GPU-style text: vLLM 0.24 names vs the pre-0.13 ones
# --------------------------------------------------------------------------------------------------

# vLLM 0.24 on one H200 with --data-parallel-size 2: every vllm: series is labelled by engine.
GPU_024 = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 20931.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="/tmp/model-llama1b"} 24.0
vllm:num_requests_running{engine="1",model_name="/tmp/model-llama1b"} 19.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="/tmp/model-llama1b"} 3.0
vllm:num_requests_waiting{engine="1",model_name="/tmp/model-llama1b"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="/tmp/model-llama1b"} 0.4375
vllm:kv_cache_usage_perc{engine="1",model_name="/tmp/model-llama1b"} 0.3125
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="/tmp/model-llama1b"} 2.0
vllm:num_preemptions_total{engine="1",model_name="/tmp/model-llama1b"} 0.0
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{engine="0",model_name="/tmp/model-llama1b"} 1.7644554e+09
vllm:num_preemptions_created{engine="1",model_name="/tmp/model-llama1b"} 1.7644554e+09
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="/tmp/model-llama1b"} 262144.0
vllm:prompt_tokens_total{engine="1",model_name="/tmp/model-llama1b"} 245760.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="/tmp/model-llama1b"} 65536.0
vllm:generation_tokens_total{engine="1",model_name="/tmp/model-llama1b"} 61440.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="/tmp/model-llama1b"} 100.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="/tmp/model-llama1b"} 156.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="/tmp/model-llama1b"} 0.0
vllm:request_success_total{engine="0",finished_reason="error",model_name="/tmp/model-llama1b"} 0.0
vllm:request_success_total{engine="1",finished_reason="stop",model_name="/tmp/model-llama1b"} 90.0
vllm:request_success_total{engine="1",finished_reason="length",model_name="/tmp/model-llama1b"} 150.0
vllm:request_success_total{engine="1",finished_reason="abort",model_name="/tmp/model-llama1b"} 0.0
vllm:request_success_total{engine="1",finished_reason="error",model_name="/tmp/model-llama1b"} 0.0
# HELP vllm:request_prompt_tokens Number of prefill tokens processed.
# TYPE vllm:request_prompt_tokens histogram
vllm:request_prompt_tokens_sum{engine="0",model_name="/tmp/model-llama1b"} 262144.0
vllm:request_prompt_tokens_bucket{engine="0",le="1000.0",model_name="/tmp/model-llama1b"} 256.0
vllm:request_prompt_tokens_bucket{engine="0",le="2000.0",model_name="/tmp/model-llama1b"} 256.0
vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="/tmp/model-llama1b"} 256.0
vllm:request_prompt_tokens_count{engine="0",model_name="/tmp/model-llama1b"} 256.0
vllm:request_prompt_tokens_sum{engine="1",model_name="/tmp/model-llama1b"} 245760.0
vllm:request_prompt_tokens_bucket{engine="1",le="1000.0",model_name="/tmp/model-llama1b"} 240.0
vllm:request_prompt_tokens_bucket{engine="1",le="2000.0",model_name="/tmp/model-llama1b"} 240.0
vllm:request_prompt_tokens_bucket{engine="1",le="+Inf",model_name="/tmp/model-llama1b"} 240.0
vllm:request_prompt_tokens_count{engine="1",model_name="/tmp/model-llama1b"} 240.0
# HELP vllm:request_generation_tokens Number of generation tokens processed.
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_sum{engine="0",model_name="/tmp/model-llama1b"} 65536.0
vllm:request_generation_tokens_bucket{engine="0",le="+Inf",model_name="/tmp/model-llama1b"} 256.0
vllm:request_generation_tokens_count{engine="0",model_name="/tmp/model-llama1b"} 256.0
vllm:request_generation_tokens_sum{engine="1",model_name="/tmp/model-llama1b"} 61440.0
vllm:request_generation_tokens_bucket{engine="1",le="+Inf",model_name="/tmp/model-llama1b"} 240.0
vllm:request_generation_tokens_count{engine="1",model_name="/tmp/model-llama1b"} 240.0
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_sum{engine="0",model_name="/tmp/model-llama1b"} 327680.0
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="/tmp/model-llama1b"} 0.0
vllm:iteration_tokens_total_bucket{engine="0",le="8.0",model_name="/tmp/model-llama1b"} 10.0
vllm:iteration_tokens_total_bucket{engine="0",le="16.0",model_name="/tmp/model-llama1b"} 40.0
vllm:iteration_tokens_total_bucket{engine="0",le="32.0",model_name="/tmp/model-llama1b"} 2600.0
vllm:iteration_tokens_total_bucket{engine="0",le="8192.0",model_name="/tmp/model-llama1b"} 2700.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="/tmp/model-llama1b"} 2700.0
vllm:iteration_tokens_total_count{engine="0",model_name="/tmp/model-llama1b"} 2700.0
vllm:iteration_tokens_total_sum{engine="1",model_name="/tmp/model-llama1b"} 307200.0
vllm:iteration_tokens_total_bucket{engine="1",le="1.0",model_name="/tmp/model-llama1b"} 0.0
vllm:iteration_tokens_total_bucket{engine="1",le="8.0",model_name="/tmp/model-llama1b"} 12.0
vllm:iteration_tokens_total_bucket{engine="1",le="16.0",model_name="/tmp/model-llama1b"} 44.0
vllm:iteration_tokens_total_bucket{engine="1",le="32.0",model_name="/tmp/model-llama1b"} 2500.0
vllm:iteration_tokens_total_bucket{engine="1",le="8192.0",model_name="/tmp/model-llama1b"} 2600.0
vllm:iteration_tokens_total_bucket{engine="1",le="+Inf",model_name="/tmp/model-llama1b"} 2600.0
vllm:iteration_tokens_total_count{engine="1",model_name="/tmp/model-llama1b"} 2600.0
# HELP vllm:iteration_tokens_total_created Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total_created gauge
vllm:iteration_tokens_total_created{engine="0",model_name="/tmp/model-llama1b"} 1.7644554e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="/tmp/model-llama1b"} 12.8
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="/tmp/model-llama1b"} 128.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="/tmp/model-llama1b"} 256.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="/tmp/model-llama1b"} 256.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="/tmp/model-llama1b"} 12.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.04",model_name="/tmp/model-llama1b"} 120.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="/tmp/model-llama1b"} 240.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="/tmp/model-llama1b"} 240.0
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_sum{engine="0",model_name="/tmp/model-llama1b"} 655.36
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="/tmp/model-llama1b"} 65280.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="/tmp/model-llama1b"} 65280.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="/tmp/model-llama1b"} 65280.0
vllm:inter_token_latency_seconds_sum{engine="1",model_name="/tmp/model-llama1b"} 614.4
vllm:inter_token_latency_seconds_bucket{engine="1",le="0.01",model_name="/tmp/model-llama1b"} 61200.0
vllm:inter_token_latency_seconds_bucket{engine="1",le="+Inf",model_name="/tmp/model-llama1b"} 61200.0
vllm:inter_token_latency_seconds_count{engine="1",model_name="/tmp/model-llama1b"} 61200.0
# HELP vllm:request_time_per_output_token_seconds Histogram of time_per_output_token_seconds per request.
# TYPE vllm:request_time_per_output_token_seconds histogram
vllm:request_time_per_output_token_seconds_sum{engine="0",model_name="/tmp/model-llama1b"} 2.56
vllm:request_time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="/tmp/model-llama1b"} 256.0
vllm:request_time_per_output_token_seconds_count{engine="0",model_name="/tmp/model-llama1b"} 256.0
"""

# A pre-0.13 server (0.8/0.9 V1 engine): only the old KV-cache and inter-token names exist.
GPU_LEGACY = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B"} 1.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B"} 0.0625
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B"} 5120.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B"} 2048.0
# HELP vllm:time_per_output_token_seconds Histogram of time per output token in seconds.
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B"} 40.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.01",model_name="meta-llama/Llama-3.1-8B"} 0.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.025",model_name="meta-llama/Llama-3.1-8B"} 2000.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B"} 2000.0
vllm:time_per_output_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B"} 2000.0
"""


def test_gpu_024_sums_over_engines_and_reasons() -> None:
    snap = parse_metrics(GPU_024, t=1.0)
    assert snap.num_requests_running == 43.0
    assert snap.num_requests_waiting == 3.0
    assert snap.kv_cache_usage == pytest.approx(0.375)  # mean over engines: stays a fraction
    assert snap.num_preemptions_total == 2.0
    assert snap.prompt_tokens_total == 507904.0
    assert snap.generation_tokens_total == 126976.0
    assert snap.request_success_total == 496.0
    assert snap.request_prompt_tokens == Histogram(
        sum=507904.0, count=496.0, buckets=[(1000.0, 496.0), (2000.0, 496.0), (math.inf, 496.0)]
    )
    it = snap.iteration_tokens
    assert it is not None
    assert (it.sum, it.count) == (634880.0, 5300.0)
    assert it.buckets == [
        (1.0, 0.0),
        (8.0, 22.0),
        (16.0, 84.0),
        (32.0, 5100.0),
        (8192.0, 5300.0),
        (math.inf, 5300.0),
    ]
    assert snap.time_to_first_token is not None and snap.time_to_first_token.count == 496.0
    itl = snap.inter_token_latency
    assert itl is not None and itl.count == 126480.0 and itl.sum == pytest.approx(1269.76)
    # per-request TPOT must not be mistaken for the per-token histogram
    assert itl.buckets == [(0.01, 126480.0), (math.inf, 126480.0)]
    assert snap.request_generation_tokens is not None
    assert snap.request_generation_tokens.mean == pytest.approx(256.0)


def test_gpu_legacy_names_are_read() -> None:
    snap = parse_metrics(GPU_LEGACY, t=1.0)
    assert snap.kv_cache_usage == 0.0625
    itl = snap.inter_token_latency
    assert itl is not None and (itl.sum, itl.count) == (40.0, 2000.0) and itl.mean == 0.02
    assert snap.num_requests_running == 7.0 and snap.num_requests_waiting == 1.0
    # not exposed by this server: None, never an error
    assert snap.request_success_total is None
    assert snap.num_preemptions_total is None
    assert snap.iteration_tokens is None
    assert snap.time_to_first_token is None


def test_new_names_win_when_both_are_exposed() -> None:
    # 0.10-0.12 expose both spellings; the values are equal there, made different here to see which wins.
    text = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.9
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 1.0
vllm:time_per_output_token_seconds_sum{engine="0",model_name="m"} 9.0
vllm:time_per_output_token_seconds_count{engine="0",model_name="m"} 1.0
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.2
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 4.0
"""
    snap = parse_metrics(text, t=0.0)
    assert snap.kv_cache_usage == 0.25
    assert snap.inter_token_latency == Histogram(sum=0.2, count=4.0, buckets=[(math.inf, 4.0)])


def test_text_without_type_lines() -> None:
    # Untyped exposition: the parser keeps `_total` in the family name too; sample lookup still works.
    text = (
        'vllm:prompt_tokens_total{model_name="m"} 5\n'
        'vllm:request_success_total{finished_reason="stop",model_name="m"} 2\n'
        'vllm:request_success_total{finished_reason="length",model_name="m"} 3\n'
        'vllm:num_requests_running{model_name="m"} 1\n'
    )
    snap = parse_metrics(text, t=0.0)
    assert snap.prompt_tokens_total == 5.0
    assert snap.request_success_total == 5.0
    assert snap.num_requests_running == 1.0
    assert snap.generation_tokens_total is None


def test_missing_everything_is_none() -> None:
    for text in ("", "# just a comment\n", 'process_open_fds 12.0\npython_info{version="3.12"} 1.0\n'):
        snap = parse_metrics(text, t=3.0)
        assert snap == MetricsSnapshot(t=3.0)


@pytest.mark.parametrize(
    "text",
    [
        "<html><body><h1>502 Bad Gateway</h1></body></html>",
        "vllm:num_requests_running{engine=0} 1.0\n",
        'vllm:num_requests_running{engine="0"} abc\n',
        '{"detail": "Not Found"}',
        'vllm:iteration_tokens_total_bucket{le="many"} 1\nvllm:iteration_tokens_total_sum 1\n'
        "vllm:iteration_tokens_total_count 1\n",
    ],
)
def test_malformed_text_raises_scrape_error(text: str) -> None:
    with pytest.raises(ScrapeError) as info:
        parse_metrics(text, t=0.0)
    assert isinstance(info.value, GraphmodeError)
    assert str(info.value)


# --------------------------------------------------------------------------------------------------
# Features on synthetic snapshots with known answers
# --------------------------------------------------------------------------------------------------

ITER_LES = (1.0, 8.0, 16.0, math.inf)


def _hist(total: float, count: float, cumulative: tuple[float, ...] = ()) -> Histogram:
    buckets = list(zip(ITER_LES, cumulative, strict=True)) if cumulative else []
    return Histogram(sum=total, count=count, buckets=buckets)


def _snap(
    t: float,
    *,
    prompt: float = 0.0,
    gen: float = 0.0,
    success: float = 0.0,
    preempt: float = 0.0,
    running: float | None = 0.0,
    waiting: float | None = 0.0,
    kv: float | None = 0.0,
    iteration: Histogram | None = None,
    req_prompt: Histogram | None = None,
    req_gen: Histogram | None = None,
) -> MetricsSnapshot:
    return MetricsSnapshot(
        t=t,
        prompt_tokens_total=prompt,
        generation_tokens_total=gen,
        request_success_total=success,
        num_preemptions_total=preempt,
        num_requests_running=running,
        num_requests_waiting=waiting,
        kv_cache_usage=kv,
        iteration_tokens=iteration,
        request_prompt_tokens=req_prompt,
        request_generation_tokens=req_gen,
    )


def _cv(points: list[tuple[float, float]]) -> float:
    """Reference cv of a weighted point set, population variance."""
    n = sum(w for _, w in points)
    mean = sum(x * w for x, w in points) / n
    var = sum(w * (x - mean) ** 2 for x, w in points) / n
    return math.sqrt(var) / mean


def _three_snapshots() -> list[MetricsSnapshot]:
    # Over 10 s: 20 completions, 2000 prompt and 1000 generated tokens, 2 preemptions, and 10 engine
    # steps: 4 of 1 token, 4 in (8, 16] and 2 above the last finite bucket (16).
    return [
        _snap(
            0.0, prompt=1000, gen=500, success=10, preempt=1, running=2, waiting=0, kv=0.1,
            iteration=_hist(100, 10, (5, 8, 10, 10)), req_prompt=_hist(1000, 10), req_gen=_hist(500, 10),
        ),
        _snap(5.0, prompt=2000, gen=1000, success=20, preempt=2, running=4, waiting=1, kv=0.3),
        _snap(
            10.0, prompt=3000, gen=1500, success=30, preempt=3, running=6, waiting=3, kv=0.5,
            iteration=_hist(192, 20, (9, 12, 18, 20)), req_prompt=_hist(3000, 30), req_gen=_hist(1500, 30),
        ),
    ]  # fmt: skip


def test_known_answers() -> None:
    f = compute_features(_three_snapshots())
    assert f.window_s == 10.0 and f.n_samples == 3
    assert f.completion_rate == pytest.approx(2.0)
    # arrivals = 20 completions + growth in system (6+3) - (2+0) = 27 over 10 s
    assert f.arrival_rate == pytest.approx(2.7)
    assert f.prompt_tokens_rate == pytest.approx(200.0)
    assert f.generation_tokens_rate == pytest.approx(100.0)
    assert f.prefill_decode_ratio == pytest.approx(2.0)
    assert f.mean_input_tokens == pytest.approx(100.0)
    assert f.mean_output_tokens == pytest.approx(50.0)
    assert f.batch_mean == pytest.approx(4.0)
    assert f.batch_var == pytest.approx(8 / 3)
    assert f.batch_cv == pytest.approx(math.sqrt(8 / 3) / 4)
    assert f.batch_max == 6.0
    assert f.queue_mean == pytest.approx(4 / 3)
    assert f.concurrency_mean == pytest.approx(16 / 3)
    assert f.kv_usage_mean == pytest.approx(0.3)
    assert f.kv_usage_max == 0.5
    assert f.preemptions == 2.0
    assert f.iter_tokens_mean == pytest.approx(9.2)  # Δsum 92 / Δcount 10
    # midpoints 0.5 (first bucket from 0), 12 for (8,16], 16 for +Inf (its lower edge)
    assert f.iter_tokens_cv == pytest.approx(_cv([(0.5, 4), (12.0, 4), (16.0, 2)]))


def test_unsorted_input_is_sorted() -> None:
    snaps = _three_snapshots()
    assert compute_features([snaps[2], snaps[0], snaps[1]]) == compute_features(snaps)


def test_no_generated_tokens_gives_no_ratio() -> None:
    f = compute_features([_snap(0.0, prompt=10), _snap(2.0, prompt=30)])
    assert f.prompt_tokens_rate == 10.0
    assert f.generation_tokens_rate == 0.0
    assert f.prefill_decode_ratio is None
    assert f.mean_input_tokens is None  # no request histogram exposed


def test_no_finished_request_gives_no_mean_lengths() -> None:
    h = _hist(80, 4)
    f = compute_features([_snap(0.0, req_prompt=h, req_gen=h), _snap(1.0, req_prompt=h, req_gen=h)])
    assert f.mean_input_tokens is None and f.mean_output_tokens is None


def test_arrival_rate_never_negative() -> None:
    # 10 requests left the system but none reached request_success (e.g. aborted)
    f = compute_features([_snap(0.0, running=10), _snap(5.0, running=0)])
    assert f.completion_rate == 0.0
    assert f.arrival_rate == 0.0


def test_missing_gauges_skip_stats() -> None:
    snaps = [_snap(0.0, running=None, waiting=None, kv=None), _snap(1.0, running=None, waiting=2.0, kv=None)]
    f = compute_features(snaps)
    assert f.batch_mean is None and f.batch_var is None and f.batch_cv is None and f.batch_max is None
    assert f.queue_mean == 2.0
    assert f.concurrency_mean is None
    assert f.kv_usage_mean is None and f.kv_usage_max is None
    assert f.arrival_rate is None  # needs running and waiting at both ends
    assert f.completion_rate == 0.0


def test_fewer_than_two_snapshots() -> None:
    assert compute_features([]) == ObservedFeatures(n_samples=0)
    f = compute_features([_snap(7.0, success=3, running=4, waiting=1, kv=0.2)])
    assert f.n_samples == 1 and f.window_s == 0.0
    for rate in (
        f.arrival_rate, f.completion_rate, f.prompt_tokens_rate, f.generation_tokens_rate,
        f.prefill_decode_ratio, f.mean_input_tokens, f.mean_output_tokens, f.iter_tokens_mean,
        f.iter_tokens_cv, f.preemptions,
    ):  # fmt: skip
        assert rate is None
    assert (f.batch_mean, f.batch_var, f.batch_cv, f.batch_max) == (4.0, 0.0, 0.0, 4.0)
    assert (f.queue_mean, f.concurrency_mean, f.kv_usage_mean, f.kv_usage_max) == (1.0, 5.0, 0.2, 0.2)


def test_two_snapshots_at_the_same_time_give_no_rates() -> None:
    f = compute_features([_snap(1.0, success=1), _snap(1.0, success=2)])
    assert f.window_s == 0.0 and f.completion_rate is None and f.n_samples == 2


def test_idle_batch_has_no_cv() -> None:
    f = compute_features([_snap(0.0), _snap(1.0)])
    assert (f.batch_mean, f.batch_var, f.batch_cv) == (0.0, 0.0, None)


def test_counter_reset_starts_the_window_at_the_restart() -> None:
    before = [_snap(0.0, prompt=5000, success=50, running=30), _snap(5.0, prompt=6000, success=60)]
    after = [_snap(10.0, prompt=100, success=1, running=1), _snap(20.0, prompt=300, success=5, running=3)]
    assert counters_reset(before[-1], after[0])
    assert not counters_reset(after[0], after[1])
    assert since_last_reset(before + after) == after
    f = compute_features(before + after)
    assert f.window_s == 10.0 and f.n_samples == 2
    assert f.completion_rate == pytest.approx(0.4)
    assert f.prompt_tokens_rate == pytest.approx(20.0)
    assert f.batch_mean == 2.0  # pre-restart gauges are not in the window either


def test_histogram_count_going_down_is_a_reset() -> None:
    a = _snap(0.0, iteration=_hist(100, 10, (5, 8, 10, 10)))
    b = _snap(1.0, iteration=_hist(3, 1, (1, 1, 1, 1)))
    assert counters_reset(a, b)


@needs_captures
def test_server_latency_from_the_real_capture() -> None:
    idle, loaded = parse_metrics(IDLE.read_text(), t=0.0), parse_metrics(AFTER_LOAD.read_text(), t=10.0)
    itl, ttft = server_latency([loaded, idle])  # order does not matter
    text = AFTER_LOAD.read_text()
    assert itl == pytest.approx(_file_sum(text, "vllm:inter_token_latency_seconds_sum")
                                / _file_sum(text, "vllm:inter_token_latency_seconds_count"))
    assert ttft == pytest.approx(_file_sum(text, "vllm:time_to_first_token_seconds_sum")
                                 / _file_sum(text, "vllm:time_to_first_token_seconds_count"))
    assert 0 < itl < 1 and 0 < ttft < 5


def test_server_latency_is_the_window_delta_after_a_reset() -> None:
    def snap(t: float, prompt: float, itl: tuple[float, float], ttft: tuple[float, float] | None) -> MetricsSnapshot:
        return MetricsSnapshot(t=t, prompt_tokens_total=prompt, inter_token_latency=Histogram(*itl),
                               time_to_first_token=None if ttft is None else Histogram(*ttft))

    # a restart between the first two (prompt tokens went down); after it, Δ = 1.2 s over 100 gaps and
    # 0.2 s over 4 first tokens
    snaps = [snap(0.0, 5000, (100.0, 1000), (50.0, 100)), snap(1.0, 10, (0.6, 60), (0.3, 6)),
             snap(2.0, 20, (1.8, 160), (0.5, 10))]
    itl, ttft = server_latency(snaps)
    assert itl == pytest.approx(0.012) and ttft == pytest.approx(0.05)
    assert server_latency(snaps[1:2]) == (None, None)  # one snapshot: no Δ
    # no gap in the window, and a server without the TTFT histogram
    assert server_latency([snap(0, 1, (1.0, 10), None), snap(1, 2, (1.0, 10), None)]) == (None, None)


def test_binned_cv_edges() -> None:
    assert binned_cv([]) is None
    assert binned_cv([(1.0, 0.0), (math.inf, 0.0)]) is None
    assert binned_cv([(8.0, 5.0), (math.inf, 5.0)]) == 0.0  # all mass in one bucket
    assert binned_cv([(math.inf, 5.0)]) is None  # only +Inf: placed at 0, no mean


# --------------------------------------------------------------------------------------------------
# FeatureWindow
# --------------------------------------------------------------------------------------------------


def test_window_evicts_old_snapshots() -> None:
    w = FeatureWindow(window_s=10.0)
    assert len(w) == 0
    assert w.features() == ObservedFeatures(n_samples=0)
    for i, t in enumerate((0.0, 5.0, 10.0, 15.0)):
        w.add(_snap(t, success=10.0 * i, running=float(i)))
    assert [s.t for s in w] == [5.0, 10.0, 15.0]
    f = w.features()
    assert f.n_samples == 3 and f.window_s == 10.0
    assert f.completion_rate == pytest.approx(2.0)
    assert f.batch_mean == pytest.approx(2.0)
    w.add(_snap(40.0, success=40.0))
    assert [s.t for s in w.snapshots] == [40.0]
    assert w.features().completion_rate is None


def test_window_restart_empties_it() -> None:
    w = FeatureWindow(window_s=60.0)
    w.add(_snap(0.0, prompt=100))
    w.add(_snap(1.0, prompt=200))
    w.add(_snap(2.0, prompt=5))
    assert [s.t for s in w] == [2.0]


def test_window_rejects_time_going_backwards_and_bad_length() -> None:
    w = FeatureWindow(window_s=5.0)
    w.add(_snap(3.0))
    with pytest.raises(ValueError):
        w.add(_snap(2.0))
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError):
            FeatureWindow(window_s=bad)


# --------------------------------------------------------------------------------------------------
# scrape / scrape_sync
# --------------------------------------------------------------------------------------------------


def _clock(*values: float) -> Iterator[float]:
    return iter(values)


def test_async_scrape_parses_and_timestamps_the_midpoint() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics"
        return httpx.Response(200, text=GPU_LEGACY)

    ticks = _clock(10.0, 12.0)

    async def go() -> MetricsSnapshot:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await scrape(client, "http://vllm/metrics", clock=lambda: next(ticks))

    snap = asyncio.run(go())
    assert snap.t == 11.0
    assert snap.prompt_tokens_total == 5120.0


@pytest.mark.parametrize(
    "response_or_error",
    [httpx.Response(500, text="Internal Server Error"), httpx.ConnectError("connection refused")],
)
def test_async_scrape_errors(response_or_error: httpx.Response | Exception) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(response_or_error, Exception):
            raise response_or_error
        return response_or_error

    async def go() -> MetricsSnapshot:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await scrape(client, "http://vllm/metrics")

    with pytest.raises(ScrapeError, match="http://vllm/metrics"):
        asyncio.run(go())


def test_async_scrape_malformed_body() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>login</html>")

    async def go() -> MetricsSnapshot:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await scrape(client, "http://vllm/metrics")

    with pytest.raises(ScrapeError, match="not Prometheus exposition"):
        asyncio.run(go())


@pytest.fixture
def metrics_server() -> Iterator[str]:
    with serve_http(lambda req: (200, GPU_024) if req.path == "/metrics" else (404, "Not Found")) as url:
        yield url


def test_scrape_sync(metrics_server: str) -> None:
    snap = scrape_sync(metrics_server + "/metrics", timeout=5.0)
    assert snap.request_success_total == 496.0
    with pytest.raises(ScrapeError, match="404"):
        scrape_sync(metrics_server + "/nope", timeout=5.0)


def test_scrape_sync_connection_refused() -> None:
    with pytest.raises(ScrapeError, match="could not fetch"):
        scrape_sync(f"http://127.0.0.1:{free_port()}/metrics", timeout=2.0)
