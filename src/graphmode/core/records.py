"""The typed pieces a profile row is made of. Every field a measurement could not produce is ``None``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from graphmode.core.deployment import DeploymentConfig


class _Flat(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ObservedFeatures(_Flat):
    """What a server's /metrics says about the traffic over a window.

    The profiler and the live selector compute these with the same code
    (:mod:`graphmode.profiling.features`), so the selector sees in production exactly what it was trained on.
    """

    window_s: float | None = None
    n_samples: int | None = None
    arrival_rate: float | None = Field(None, description="req/s arriving (completions + growth in system)")
    completion_rate: float | None = Field(None, description="req/s finished successfully")
    prompt_tokens_rate: float | None = None
    generation_tokens_rate: float | None = None
    prefill_decode_ratio: float | None = Field(None, description="Δprompt_tokens / Δgeneration_tokens")
    mean_input_tokens: float | None = None
    mean_output_tokens: float | None = None
    batch_mean: float | None = Field(None, description="mean of vllm:num_requests_running samples")
    batch_var: float | None = None
    batch_cv: float | None = None
    batch_max: float | None = None
    iter_tokens_mean: float | None = Field(None, description="tokens per engine step, vllm:iteration_tokens_total")
    iter_tokens_cv: float | None = None
    queue_mean: float | None = Field(None, description="mean of vllm:num_requests_waiting samples")
    concurrency_mean: float | None = Field(None, description="running + waiting")
    kv_usage_mean: float | None = None
    kv_usage_max: float | None = None
    preemptions: float | None = None
    frontend_cpu_cores: float | None = Field(
        None, description="CPU cores vLLM's API server process used over the window, "
        "Δprocess_cpu_seconds_total / Δt; 1.0 = one core saturated")
    spec_acceptance_rate: float | None = Field(
        None, description="speculative decoding: draft tokens accepted / draft tokens proposed")
    spec_accept_length: float | None = Field(
        None, description="speculative decoding: tokens emitted per verification step with a draft, "
        "1 + accepted / drafts")


class StepSizes(_Flat):
    """Tokens per engine step over a window, as vLLM's ``/metrics`` shows them
    (:func:`graphmode.profiling.features.compute_step_sizes` defines every field).

    ``le`` are the finite upper edges of ``vllm:iteration_tokens_total``'s buckets and ``steps[i]`` the
    steps that fell in bucket ``i`` during the window (not cumulative); ``steps`` has one more entry
    than ``le``: the steps above the largest finite edge. ``running`` counts the samples of
    ``vllm:num_requests_running`` by value.
    """

    le: list[float] = Field(default_factory=list)
    steps: list[float] = Field(default_factory=list)
    running: dict[int, int] = Field(default_factory=dict)
    decode_steps: float | None = Field(None, description="steps that can be decode-only (tokens <= batch_max)")
    mixed_steps: float | None = Field(None, description="steps that must hold prefill tokens (tokens > batch_max)")
    api_servers: int | None = Field(
        None, ge=1, le=4096,
        description="API servers whose histograms ``le``/``steps`` pool (vLLM's --api-server-count); None: not "
                    "known (one, unless the deployment's args say otherwise); 1 after per_engine_step()")

    @model_validator(mode="after")
    def _consistent(self) -> StepSizes:
        if len(self.le) > 1000 or len(self.running) > 100_000:
            raise ValueError("too many buckets or running values")
        if any(not (math.isfinite(e) and e > 0) for e in self.le) or any(
                b <= a for a, b in zip(self.le, self.le[1:], strict=False)):
            raise ValueError("le must be finite, positive and strictly increasing")
        if len(self.steps) not in (len(self.le), len(self.le) + 1):
            raise ValueError("steps needs one count per bucket (and optionally one for steps above the last)")
        if any(not (math.isfinite(n) and n >= 0) for n in self.steps):
            raise ValueError("step counts must be finite and non-negative")
        if any(k < 0 or v < 0 for k, v in self.running.items()):
            raise ValueError("running values and their counts must be non-negative")
        return self

    def per_engine_step(self, api_servers: int | None = None) -> StepSizes:
        """The histogram as tokens per engine step.

        With N API servers each server's metrics logger records, per engine step, only the tokens of its own
        requests, and ``/metrics`` pools the N servers: a step of 768 decode tokens over four servers shows as
        four observations near 192 (H200, vLLM 0.33, 2026-12-04: 354 observations of ~191 tokens in a 4.6-s
        window of ~89 steps at 768 running). So edges scale by N and counts by 1/N. With requests spread evenly
        this is close for large batches; a step whose requests all sit on fewer servers is undercounted.
        ``api_servers`` is used when the histogram does not say (``self.api_servers`` is None).
        """
        n = self.api_servers if self.api_servers is not None else (api_servers or 1)
        if n <= 1:
            return self if self.api_servers == 1 else self.model_copy(update={"api_servers": 1})
        le = [e * n for e in self.le]
        steps = [c / n for c in self.steps]
        decode, mixed = split_decode_mixed(le, steps, self.running)
        return StepSizes(le=le, steps=steps, running=dict(self.running), decode_steps=decode, mixed_steps=mixed,
                         api_servers=1)


def split_decode_mixed(le: list[float], steps: list[float], running: Mapping[int, int]) -> tuple[
        float | None, float | None]:
    """(decode_steps, mixed_steps): without speculative decoding a decode-only step has one token per running
    request, so buckets whose lower edge is at or above the largest running sample hold prefill tokens."""
    if not running or max(running) <= 0:
        return None, None
    batch_max = max(running)
    lowers = [0.0, *le]
    mixed = math.fsum(n for lower, n in zip(lowers, steps, strict=False) if lower >= batch_max)
    return math.fsum(steps) - mixed, mixed


# No vLLM step is this short (the H200's shortest, a 0.5B model host-bound: ~5 ms). An inter-token gap under
# it is the client reading several SSE events at once, and an ITL quantile under it means more than that
# share of the gaps were such reads: a load process at a full core read most of a cell's gaps so (H200,
# 2026-12-04, a 0.5B at 768 streams: ITL p50 0.017 ms, mean 31 ms). Such a quantile measures the client: it is not
# reported, and races read older rows' as not measured. The mean and TPOT keep the sum of the gaps, which
# bursts do not change.
ITL_FLOOR_S = 1e-4


class LatencyStats(_Flat):
    """Client-side view of one workload run, in seconds and tokens."""

    n_sent: int = 0
    n_ok: int = 0
    n_err: int = 0
    duration_s: float | None = None
    ttft_p50: float | None = None
    ttft_p90: float | None = None
    ttft_p99: float | None = None
    ttft_mean: float | None = None
    itl_p50: float | None = None
    itl_p90: float | None = None
    itl_p99: float | None = None
    itl_mean: float | None = None
    tpot_p50: float | None = None
    chunk_tokens_mean: float | None = Field(
        None, description="tokens per streamed chunk; > 1 means coalesced chunks and pooled ITL is unreliable"
    )
    e2e_p50: float | None = None
    e2e_p90: float | None = None
    e2e_p99: float | None = None
    output_tok_s: float | None = None
    request_throughput: float | None = None
    goodput: float | None = Field(None, description="req/s meeting every SLO given (None without SLOs)")
    sent_rate: float | None = Field(None, description="req/s the client actually sent")
    sent_input_tokens_mean: float | None = None
    sent_output_tokens_mean: float | None = None
    first_error: str | None = None
    # Adaptive windows (Workload.adaptive): how the cell ended and how sure its metrics are.
    warmup_used_s: float | None = Field(None, description="warm-up actually spent before the window")
    stopped_by: str | None = Field(None, description="'ci' (intervals tight), 'max' (duration_s) or 'fixed'")
    n_cut: int | None = Field(None, description="requests still in flight at the stop, cancelled")
    itl_p50_ci: float | None = Field(None, description="95% CI half-width of itl_p50, relative")
    ttft_p50_ci: float | None = Field(None, description="95% CI half-width of ttft_p50, relative")
    tpot_p50_ci: float | None = Field(None, description="95% CI half-width of tpot_p50, relative")
    # vLLM's own timing, a check on the client's: what a starved client mistimes, these do not see.
    server_itl_mean: float | None = Field(
        None, description="mean inter-token latency over the window as vLLM timed it from its engine core's "
        "output timestamps: Δsum/Δcount of vllm:inter_token_latency_seconds")
    server_ttft_mean: float | None = Field(
        None, description="mean time to first token over the window as vLLM's API server timed it from the "
        "request's arrival: Δsum/Δcount of vllm:time_to_first_token_seconds")


class StartupInfo(_Flat):
    """What vLLM says about its own start-up in its log, plus wall-clock time measured by the launcher."""

    startup_s: float | None = Field(None, description="wall clock from spawn to /health OK")
    vllm_version: str | None = None
    architecture: str | None = None
    model_runner: str | None = Field(None, description="source file that logged model loading/capture")
    model_runner_v2: bool | None = Field(
        None, description="'Using V2 Model Runner' (True) or vLLM's fallback to the V1 runner (False); None if unsaid")
    attention_backend: str | None = None
    flash_attn_version: int | None = Field(None, description="'Using FlashAttention version N'")
    breakable_cudagraph: bool | None = Field(
        None, description="True when vLLM announced breakable CUDA graphs (vLLM >= 0.29); None if unsaid")
    dynamo_s: float | None = None
    compile_s: float | None = Field(None, description="'torch.compile took N s in total'")
    model_load_gib: float | None = None
    model_load_s: float | None = None
    capture_s: float | None = None
    graph_gib: float | None = Field(
        None, description="'Graph capturing finished in N secs, took X GiB'; per GPU (vLLM logs it per rank) "
        "under tensor parallelism")
    estimated_graph_gib: float | None = None
    kv_cache_gib: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    init_engine_s: float | None = None
    max_num_batched_tokens: int | None = None
    requested_mode: str | None = None
    effective_mode: str | None = Field(None, description="mode vLLM ended up with, if it said so")
    capture_labels: list[str] = Field(default_factory=list, description="'Capturing CUDA graphs (X)' labels seen")
    capture_sizes: list[int] | None = Field(None, description="cudagraph_capture_sizes of the resolved config")
    max_capture_size: int | None = Field(None, description="max_cudagraph_capture_size of the resolved config")
    graph_counts: dict[str, int] = Field(default_factory=dict, description="graphs captured per capture label")
    downgrades: list[str] = Field(
        default_factory=list, description="vLLM's lines overriding the requested mode or trimming capture sizes"
    )
    non_default_args: dict[str, Any] | None = None
    gpu_uuid: str | None = Field(None, description="NVML UUID of the GPU this engine start ran on")
    start_wave_engines: int | None = Field(
        None, description="engines started side by side with this one on its GPU, itself included (a race's start "
        "wave); above 1, graph_gib (a device-wide free-memory difference) measured the neighbours too")
    engine_gpu_gib: float | None = Field(
        None, description="GPU memory NVML charges to this engine's processes once it is healthy and idle; with the "
        "KV cache fixed per engine, the difference between two modes is their graphs' (valid in a start wave)")


class Fingerprint(_Flat):
    """Hardware and software a measurement belongs to. Unknown stays ``None``; nothing is guessed."""

    gpu_name: str | None = None
    gpu_count: int | None = None
    gpu_memory_gib: float | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    vllm_version: str | None = None
    torch_version: str | None = None
    model_config_hash: str | None = None
    model_architecture: str | None = None
    model_type: str | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    num_params_b: float | None = Field(None, description="parameters in billions, from config.json shapes")
    num_active_params_b: float | None = Field(None, description="parameters one token runs through (MoE)")
    num_experts: int | None = Field(None, description="routed experts per MoE layer; None for dense models")
    num_experts_per_tok: int | None = None
    checkpoint_quantization: str | None = Field(None, description="config.json quantization_config's method")
    vllm_args: list[str] = Field(default_factory=list)

    def key(self) -> str:
        """Stable id of the (GPU, vLLM, model shape) a model is valid for."""
        import hashlib

        parts = [self.gpu_name or "nogpu", self.vllm_version or "?", self.model_config_hash or "?"]
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


CellStatus = Literal["ok", "failed"]


class RaceInfo(_Flat):
    """Where a cell sits in a race (:mod:`graphmode.profiling.race`); all None for grid rows.

    A race measures resident engines in rounds: one workload per round, every live engine in turn. These
    fields let a killed race resume from its rows and let the selector pair a mode with the default
    inside each round (:mod:`graphmode.selector.verdicts`).
    """

    id: str | None = Field(None, description="race key: profile key + race settings; resumes share it")
    round: int | None = Field(None, description="round index; the cell's request plan is seeded with it")
    arm: str | None = Field(None, description="the mode raced, CONTROL for the A/A arm (a second default), or "
                            "a capture-size arm's name")
    requested_mode: str | None = None
    capture_sizes: list[int] | None = Field(
        None, description="a capture-size arm's cudagraph_capture_sizes (profiling/race_sizes.py); None: vLLM's "
        "default list")
    position: int | None = Field(None, description="place in the round's order (0 = first)")
    live_engines: int | None = Field(None, description="engines resident on the GPU during the round")
    port: int | None = None
    start_id: str | None = Field(None, description="which engine start: session run id + arm (+ start number)")
    session_t0: float | None = Field(None, description="wall clock when this session began starting engines")
    round_t0: float | None = Field(None, description="wall clock when the round began")
    starts_wall_s: float | None = Field(None, description="wall time to bring every engine of the session up")
    idle_cpu_cores: float | None = Field(
        None, description="this engine's process-tree CPU s/s while it waited for its turn"
    )
    neighbours_cpu_cores: float | None = Field(
        None, description="CPU s/s of every other resident engine during this cell"
    )
    idle_gpu_util_pct: float | None = Field(None, description="GPU utilisation with every engine idle, round start")


class RunConditions(_Flat):
    """What the GPU and host were doing during a cell. Not features the selector learns from: the
    conditions that can explain why two engine starts of the same mode measured differently."""

    gpu_sm_clock_mhz_mean: float | None = None
    gpu_sm_clock_mhz_min: float | None = None
    gpu_power_w_mean: float | None = None
    gpu_util_pct_mean: float | None = None
    gpu_temp_c_max: float | None = None
    host_load_1m: float | None = None
    engine_cpus: str | None = Field(None, description="CPUs vLLM's processes last ran on, at the cell's end")
    engine_numa_nodes: str | None = Field(None, description="NUMA nodes of those CPUs")
    gpu_numa_node: int | None = Field(None, description="NUMA node of the GPU's PCI device")
    host_cpu_model: str | None = Field(None, description="CPU model name × logical CPUs (/proc/cpuinfo)")
    host_busy_pct: float | None = Field(None, description="host CPU time not idle over the cell, %")
    host_steal_pct: float | None = Field(None, description="CPU time the hypervisor gave to others, %")
    engine_cpu_cores: float | None = Field(None, description="CPU seconds of vLLM's processes per second")
    engine_nivcsw_per_s: float | None = Field(None, description="involuntary context switches of vLLM's threads/s")
    host_probe_ms: float | None = Field(None, description="a fixed pure-Python loop just before the cell, ms")
    engine_busiest_cores: float | None = Field(
        None, description="CPU seconds per second of the busiest process of vLLM's tree over the cell (one Python "
                          "process: near 1 it sets the pace)")
    engine_busiest_process: str | None = Field(
        None, description="that process's title as vLLM set it (VLLM::EngineCore, VLLM::APIServer_N), else its name")
    loadgen_cpu_cores: float | None = Field(
        None, description="CPU seconds per second of graphmode's load generator over the cell (with several "
                          "processes, the busiest one): near 1 it, not vLLM, may set the pace")
    engine_jit_kernels: str | None = Field(
        None, description="kernels vLLM JIT-compiled during the cell (its jit_monitor warnings), comma-separated; "
                          "'' when its log said none, None when the log was not read")


class CellRecord(_Flat):
    """One (mode, workload, repeat) measurement: the unit the dataset stores and the selector learns from."""

    run_id: str
    profile_key: str = Field(description="what must match for --resume to count a cell done")
    mode: str
    workload: str
    workload_spec: dict[str, Any]
    repeat: int
    status: CellStatus
    reason: str | None = None
    started_at: float
    finished_at: float
    features: ObservedFeatures = Field(default_factory=ObservedFeatures)
    latency: LatencyStats = Field(default_factory=LatencyStats)
    startup: StartupInfo = Field(default_factory=StartupInfo)
    fingerprint: Fingerprint = Field(default_factory=Fingerprint)
    conditions: RunConditions = Field(default_factory=RunConditions)
    race: RaceInfo = Field(default_factory=RaceInfo)
    gpu_mem_used_gib_max: float | None = None
    gpu_mem_used_gib_mean: float | None = None
    step_sizes: StepSizes | None = Field(None, description="tokens per engine step in the cell's window")
    deployment: DeploymentConfig | None = Field(
        None, description="configuration measured under; derived from the fingerprint's args and the start-up "
        "log when not given (graphmode.core.deployment)")

    @model_validator(mode="after")
    def _derive_deployment(self) -> CellRecord:
        if self.deployment is None:
            self.deployment = DeploymentConfig.from_vllm_args(
                self.fingerprint.vllm_args, {}, None, self.startup,
                shape=self.fingerprint.model_dump(), strict=False)
        return self


def lone_start(row: Mapping[str, Any]) -> bool:
    """Whether a row's engine started alone on its GPU, so that vLLM's logged graph memory (a device-wide
    free-memory difference) is its own: a profile's start, or a race start recorded as a wave of one. Race
    rows from before ``start_wave_engines`` was recorded count as overlapped (their first wave always was)."""
    wave = row.get("start_wave_engines")
    if row.get("race_id"):
        return wave == 1
    return wave in (None, 1)


# Upper bounds of observed features: far above any server's traffic (a billion requests or tokens per
# second, a billion-token mean), far below where the estimators' arithmetic would overflow (1e154 in one
# feature once answered 500). KV-cache usage is a fraction (older vLLM: a percentage). The service's
# ``features`` body and scraped features are held to the same bounds.
FEATURE_MAX = 1e9
FEATURE_MAX_BY_NAME = {"kv_usage_mean": 100.0, "kv_usage_max": 100.0, "batch_var": 1e18}


def feature_range_error(name: str, value: float) -> str | None:
    """Why ``value`` is not a valid observed feature ``name`` (negative, not finite, above its bound), or None."""
    if not math.isfinite(value):
        return f"{name} must be a finite number, got {value}"
    if value < 0:
        return f"{name} must be >= 0, got {value}"
    top = FEATURE_MAX_BY_NAME.get(name, FEATURE_MAX)
    if value > top:
        return f"{name} must be <= {top:g}, got {value:.3g}: not a server's traffic"
    return None
