"""SYNTHETIC profile rows for developing and testing the selector. Not measurements.

Every row it writes has ``run_id`` ``synthetic-…`` and the fingerprint GPU ``SYNTHETIC-GPU`` / vLLM
``0.0.0+synthetic``, so it can never be mistaken for, or registered beside, a real profile: training
on them marks the card ``synthetic: true`` and ``recommend`` says so on every answer.

The numbers come from a toy step-time model with plausible orders of magnitude for a 1B-parameter
decoder on a datacenter GPU: each engine step costs a launch overhead that depends on the mode and on
whether the batch is decode-only or mixed with prefill (eager > piecewise graphs > full graphs), plus
compute proportional to the tokens in the step; graphs stop helping above the largest captured batch.
Little's law gives the running batch. Start-up constants are shaped after the real vLLM 0.24 / H200
logs in ``tests/fixtures/vllm-0.24-h200`` (llama1b), with jitter. Use it to exercise code paths, never
to draw conclusions about vLLM.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graphmode.core.dataset import ProfileStore
from graphmode.core.modes import ALL_MODES, CudaGraphMode
from graphmode.core.records import CellRecord, Fingerprint, LatencyStats, ObservedFeatures, StartupInfo
from graphmode.core.settings import DEFAULT_GRID
from graphmode.profiling.grid import Workload, load_grid

SYNTHETIC_GPU = "SYNTHETIC-GPU"
SYNTHETIC_VLLM = "0.0.0+synthetic"


@dataclass(frozen=True)
class SyntheticShape:
    name: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_params_b: float
    compute_scale: float  # per-token compute relative to the 1B shape
    overhead_scale: float  # launch overhead relative to the 1B shape (grows with layers)


SHAPE_1B = SyntheticShape("synth-1b", "LlamaForCausalLM", 16, 2048, 1.24, 1.0, 1.0)
SHAPE_8B = SyntheticShape("synth-8b", "LlamaForCausalLM", 32, 4096, 8.03, 5.5, 1.8)
SHAPE_05B = SyntheticShape("synth-0.5b", "Qwen2ForCausalLM", 24, 896, 0.49, 0.45, 1.3)

# Launch overhead per step, ms, (decode-only step, mixed prefill+decode step), for the 1B shape.
_OVERHEAD_MS: dict[CudaGraphMode, tuple[float, float]] = {
    CudaGraphMode.NONE: (6.0, 6.5),
    CudaGraphMode.PIECEWISE: (2.9, 3.1),
    CudaGraphMode.FULL: (1.5, 2.0),
    CudaGraphMode.FULL_DECODE_ONLY: (1.5, 6.5),
    CudaGraphMode.FULL_AND_PIECEWISE: (1.5, 3.1),
}
# (startup_s, capture_s, graph_gib): llama1b figures of the vLLM 0.24 / H200 fixture logs, rounded.
_STARTUP: dict[CudaGraphMode, tuple[float, float | None, float | None]] = {
    CudaGraphMode.NONE: (39.0, None, None),
    CudaGraphMode.PIECEWISE: (37.0, 2.0, 0.23),
    CudaGraphMode.FULL: (36.7, 2.0, 0.27),
    CudaGraphMode.FULL_DECODE_ONLY: (43.6, 3.0, 0.27),
    CudaGraphMode.FULL_AND_PIECEWISE: (27.6, 3.0, 0.45),
}
MAX_CAPTURE = 512
PREFILL_MS_PER_TOKEN = 0.0022
DECODE_MS_PER_SEQ = 0.012


def _fingerprint(shape: SyntheticShape) -> Fingerprint:
    return Fingerprint(
        gpu_name=SYNTHETIC_GPU,
        gpu_count=1,
        gpu_memory_gib=140.0,
        driver_version="0.0",
        cuda_version="0.0",
        vllm_version=SYNTHETIC_VLLM,
        torch_version="0.0",
        model_config_hash=f"{shape.name}-cfg",
        model_architecture=shape.architecture,
        model_type="llama" if "Llama" in shape.architecture else "qwen2",
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        num_params_b=shape.num_params_b,
    )


def _simulate(
    mode: CudaGraphMode, w: Workload, shape: SyntheticShape, rng: np.random.Generator, noise: float
) -> tuple[ObservedFeatures, LatencyStats]:
    n_in, n_out = float(w.input.mean), float(w.output.mean)
    dec_oh, mix_oh = (v * shape.overhead_scale for v in _OVERHEAD_MS[mode])
    e2e = (n_out * (dec_oh + 1.0)) / 1e3  # first guess, s
    for _ in range(30):  # fixed point: batch size <-> step time
        batch = max(w.rate * e2e, 0.05)
        if w.max_concurrency:
            batch = min(batch, float(w.max_concurrency))
        p_mix = min(1.0, w.rate * (dec_oh / 1e3) * 4.0)
        graphs_apply = batch <= MAX_CAPTURE
        eager_dec, eager_mix = (v * shape.overhead_scale for v in _OVERHEAD_MS[CudaGraphMode.NONE])
        d_oh = dec_oh if graphs_apply else eager_dec
        m_oh = mix_oh if graphs_apply else eager_mix
        pad = 1.03 if graphs_apply and mode != CudaGraphMode.NONE else 1.0
        decode_ms = (d_oh + DECODE_MS_PER_SEQ * batch * shape.compute_scale) * pad
        prefill_ms = PREFILL_MS_PER_TOKEN * n_in * shape.compute_scale
        mix_ms = (m_oh + DECODE_MS_PER_SEQ * batch * shape.compute_scale) * pad + prefill_ms
        step_ms = (1 - p_mix) * decode_ms + p_mix * mix_ms
        ttft = (mix_ms + 0.5 * step_ms) / 1e3
        new_e2e = ttft + (n_out - 1) * step_ms / 1e3
        if abs(new_e2e - e2e) < 1e-6:
            break
        e2e = 0.5 * e2e + 0.5 * new_e2e
    burst = 1.0 / math.sqrt(max(w.burstiness, 1e-3))

    def j(v: float, cv: float = noise) -> float:
        return float(v * rng.lognormal(0.0, cv))

    itl_p99 = mix_ms / 1e3 * (1.0 + 0.3 * burst)
    lat = LatencyStats(
        n_sent=int(w.rate * w.duration_s),
        n_ok=int(w.rate * w.duration_s),
        duration_s=w.duration_s,
        ttft_p50=j(ttft),
        ttft_p90=j(ttft * (1.5 + 0.5 * burst)),
        ttft_p99=j(ttft * (2.2 + 1.5 * burst)),
        itl_p50=j(step_ms / 1e3),
        itl_p90=j(step_ms / 1e3 * 1.25),
        itl_p99=j(itl_p99),
        e2e_p50=j(e2e),
        e2e_p90=j(e2e * 1.3),
        e2e_p99=j(e2e * (1.6 + 0.4 * burst)),
        output_tok_s=j(w.rate * n_out),
        request_throughput=j(w.rate),
        sent_rate=w.rate,
        sent_input_tokens_mean=n_in,
        sent_output_tokens_mean=n_out,
    )
    batch_var = batch * burst**2
    feats = ObservedFeatures(
        window_s=w.duration_s,
        n_samples=int(w.duration_s * 2),
        arrival_rate=j(w.rate, 0.05),
        completion_rate=j(w.rate, 0.05),
        prompt_tokens_rate=j(w.rate * n_in, 0.05),
        generation_tokens_rate=j(w.rate * n_out, 0.05),
        prefill_decode_ratio=j(n_in / n_out, 0.02),
        mean_input_tokens=j(n_in, 0.01),
        mean_output_tokens=j(n_out, 0.01),
        batch_mean=j(batch, 0.04),
        batch_var=j(batch_var, 0.1),
        batch_cv=j(math.sqrt(batch_var) / batch, 0.05),
        batch_max=float(math.ceil(batch + 3 * math.sqrt(batch_var))),
        iter_tokens_mean=j(batch + p_mix * n_in, 0.05),
        iter_tokens_cv=j(1.0 + p_mix, 0.05),
        queue_mean=0.0,
        concurrency_mean=j(batch, 0.04),
        kv_usage_mean=min(1.0, j(batch * (n_in + n_out) / 1.26e6)),
        preemptions=0.0,
    )
    return feats, lat


def write_synthetic_dataset(
    path: str | Path,
    *,
    workloads: Sequence[Workload] | None = None,
    modes: Sequence[CudaGraphMode] = ALL_MODES,
    repeats: int = 2,
    shapes: Sequence[SyntheticShape] = (SHAPE_1B,),
    noise: float = 0.025,
    seed: int = 0,
) -> Path:
    """Write SYNTHETIC rows for ``workloads`` (default: the bundled 24-workload grid) to ``path``."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    wls = list(workloads) if workloads is not None else list(load_grid(DEFAULT_GRID).workloads)
    now = time.time()
    with ProfileStore(path) as store:
        for shape in shapes:
            fp = _fingerprint(shape)
            for mode in modes:
                for rep in range(repeats):
                    run_id = f"synthetic-{shape.name}-{mode.value}-{rep}"
                    st, cap, gib = _STARTUP[mode]
                    scale = 1.0 + 0.6 * math.log(shape.num_params_b / 1.24 + 1e-9) / math.log(8)
                    startup = StartupInfo(
                        startup_s=float(st * max(scale, 0.5) * rng.lognormal(0, 0.04)),
                        vllm_version=SYNTHETIC_VLLM,
                        architecture=shape.architecture,
                        model_runner="synthetic",
                        attention_backend="SYNTHETIC",
                        capture_s=None if cap is None else float(cap * rng.lognormal(0, 0.1)),
                        graph_gib=None
                        if gib is None
                        else float(gib * max(scale, 0.5) * rng.lognormal(0, 0.02)),
                        kv_cache_gib=38.6,
                        kv_cache_tokens=int(1264656 / max(scale, 0.3)),
                        requested_mode=mode.value,
                        effective_mode=mode.value,
                    )
                    for w in wls:
                        feats, lat = _simulate(mode, w, shape, rng, noise)
                        rec = CellRecord(
                            run_id=run_id,
                            profile_key=f"synthetic-{shape.name}",
                            mode=mode.value,
                            workload=w.name,
                            workload_spec=w.spec(),
                            repeat=rep,
                            status="ok",
                            started_at=now,
                            finished_at=now,
                            features=feats,
                            latency=lat,
                            startup=startup,
                            fingerprint=fp,
                        )
                        store.append(rec, w.spec_hash())
    return path
