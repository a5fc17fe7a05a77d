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


def frontend_note(cores: float | None) -> str | None:
    """The note for an API server that used ``cores`` CPU cores over the window; None below the line."""
    if cores is None or not cores >= FRONTEND_SATURATED_CORES:
        return None
    return (
        f"vLLM's API server used {cores:.2f} CPU cores over the window: the frontend is saturated, so "
        "latency is set on the host, not by CUDA graphs (an H200 at ~900 running sequences decoded "
        "~8.7k tokens/s with the GPU 12% busy); more API servers (--api-server-count) or fewer concurrent "
        "streams come before a mode change"
    )
