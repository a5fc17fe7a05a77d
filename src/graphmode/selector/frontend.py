"""Advice when vLLM's API server, not the GPU, sets the latency: a saturated frontend.

vLLM's API server is one Python process: it tokenizes, detokenizes and streams every request, and past
some concurrency it runs a core flat out. Steps then wait on the host, and no CUDA graph mode or
capture size shortens them. ``frontend_cpu_cores`` (:mod:`graphmode.profiling.features`) is that
process's CPU over the window; at or above :data:`FRONTEND_SATURATED_CORES` every answer built from
observed features carries :func:`frontend_note`. It is advice only: the recommended mode never
depends on it, and the selector's models do not read the feature.
"""

from __future__ import annotations

# The API server is single-threaded Python (its GIL caps it at one core; the extra few % are helper
# threads). On an H200 at ~900 running sequences vLLM's two processes (API server and engine core) used
# 2.01 cores together while the GPU was 12% busy (the split per process was not recorded then; this
# feature records the API server's). 0.9 leaves room for scrape jitter over a short window without
# flagging a frontend that still has slack.
FRONTEND_SATURATED_CORES = 0.9
# What more API servers bought, measured on the H200, vLLM 0.33, Llama-3.2-1B shape, --max-num-seqs 1024 (the
# configuration races 1b-high-concurrency and 1b-high-concurrency-as4, docs/lab/configs-campaign.md): one API
# server at a full core, 9-15k output tokens/s and 200-474 running; with four, 15-20k tokens/s and 490-733
# running, the GPU still 21-53% busy and vLLM's processes at 2.8-3.3 cores in all (their split was not
# recorded). Saturated (race 1b-saturated-as4, 2000 req/s against caps of 640-1024): the engine core at
# 0.92-0.98 cores in every cell, the GPU 21-51% busy, and no mode beyond the noise. So past one API server's
# core the host, not the CUDA graph mode, sets the latency.


def frontend_note(cores: float | None) -> str | None:
    """The note for an API server that used ``cores`` CPU cores over the window; None below the line."""
    if cores is None or not cores >= FRONTEND_SATURATED_CORES:
        return None
    return (
        f"vLLM's API server used {cores:.2f} CPU cores over the window: the frontend is saturated, so "
        "latency is set on the host, not by CUDA graphs (an H200 at ~900 running sequences decoded "
        "~8.7k tokens/s with the GPU 12% busy); more API servers (--api-server-count) or fewer concurrent "
        "streams come before a mode change (on the H200, a 1B model at 640-1024 streams served 9-15k "
        "tokens/s with one API server and 15-20k with --api-server-count 4)"
    )


def process_note(title: str | None, cores: float | None) -> str | None:
    """The note for vLLM's busiest process (its title, e.g. ``VLLM::EngineCore``) at ``cores`` CPU cores over
    the window; None below the line. An API server gets :func:`frontend_note`."""
    if cores is None or not cores >= FRONTEND_SATURATED_CORES:
        return None
    name = title or "a vLLM process"
    if "EngineCore" not in name:
        return frontend_note(cores)
    return (
        f"vLLM's engine core ({name}) used {cores:.2f} CPU cores over the window: one Python process "
        "schedules and prepares every step, so steps wait on its CPU time and a CUDA graph mode only shortens "
        "the launches (on the H200, a 1B model at 640-1024 streams with four API servers ran its engine core "
        "at 0.92-0.98 cores, the GPU 21-51% busy, and no mode moved the step time beyond the noise); fewer "
        "streams per engine or more engines come before a mode change"
    )
