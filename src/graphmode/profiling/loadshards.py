"""One cell's load from several processes, for regions where one Python event loop may set the pace.

At hundreds of streams a single load-generator process reads thousands of SSE chunks a second; on the
H200 (vLLM 0.33, 1B at 640-1024 streams, 2026-12-03) vLLM's one API server process was the limit at a
full core, and with ``--api-server-count 4`` graphmode's own loop may become the next one (each cell
records it: ``loadgen_cpu_cores``). :class:`LoadShards` splits the round's request plan round-robin over
N worker processes (``spawn``: no state of the parent is copied), each running
:func:`graphmode.profiling.loadgen.run_load` on its share from one common ``t0``. ``time.perf_counter``
is ``CLOCK_MONOTONIC`` on Linux, one clock for every process of the host, so the send times, chunk times
and the cell's window keep one time base. A closed loop's concurrency cap is split too (a shard gets its
part; the caps sum to the workload's).

Only fixed windows are sharded (a race cell, a fixed-duration grid cell): each shard knows when the
window ends and stops itself there, marking what is in flight as ``cut`` like the one-process path. An
adaptive window that stops on a confidence interval needs the results as they arrive, so it keeps the
one-process path.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from graphmode.profiling.arrivals import PlannedRequest
from graphmode.profiling.loadgen import run_load
from graphmode.profiling.stats import RequestResult

__all__ = ["DISPATCH_LEAD_S", "LoadShards", "split_concurrency"]

# how far ahead of now a sharded cell's t0 lies: the workers must have their plans before the first send
DISPATCH_LEAD_S = 0.3


def split_concurrency(cap: int | None, shards: int) -> list[int | None]:
    """Each shard's part of a concurrency cap (None: open loop, no cap), largest first; sums to *cap*."""
    if cap is None:
        return [None] * shards
    return [cap // shards + (1 if i < cap % shards else 0) for i in range(shards)]


def _run_shard(base_url: str, model: str, plans: list[PlannedRequest], max_concurrency: int | None,
               deadline_s: float, t0: float, stop_at: float | None, connect_timeout_s: float,
               read_timeout_s: float, send_until: float | None = None) -> tuple[list[RequestResult], float]:
    """One shard's results and its CPU seconds per second while it sent (its share of the load's cost)."""

    async def main() -> list[RequestResult]:
        stop = None
        if stop_at is not None:
            stop = asyncio.Event()
            asyncio.get_running_loop().call_later(max(0.0, stop_at - time.perf_counter()), stop.set)
        return await run_load(base_url, model, plans, max_concurrency=max_concurrency, deadline_s=deadline_s,
                              t0=t0, stop=stop, connect_timeout_s=connect_timeout_s,
                              read_timeout_s=read_timeout_s, send_until=send_until)

    cpu0, wall0 = time.thread_time(), time.perf_counter()
    results = asyncio.run(main())
    return results, (time.thread_time() - cpu0) / max(time.perf_counter() - wall0, 1e-6)


def _ready() -> float:
    return time.perf_counter()


class LoadShards:
    """A pool of *processes* load-generator workers, started once and reused by every cell."""

    def __init__(self, processes: int) -> None:
        if processes < 2:
            raise ValueError(f"sharded load needs at least 2 processes, got {processes}")
        self.processes = processes
        self.busiest_cores: float | None = None  # the last run's busiest worker, CPU seconds per second
        self._pool = ProcessPoolExecutor(max_workers=processes, mp_context=multiprocessing.get_context("spawn"))
        # start every worker now (the pool spawns on demand): a cell's first sends must not wait on imports
        for f in [self._pool.submit(_ready) for _ in range(processes)]:
            f.result(timeout=120)

    async def run(self, base_url: str, model: str, plans: Sequence[PlannedRequest], *, max_concurrency: int | None,
                  deadline_s: float, t0: float, stop_at: float | None, connect_timeout_s: float,
                  read_timeout_s: float, send_until: float | None = None) -> list[RequestResult]:
        """Every plan's result, in the plans' order, as :func:`run_load` would give them."""
        n = max(1, min(self.processes, len(plans), max_concurrency or self.processes))
        caps = split_concurrency(max_concurrency, n)
        loop = asyncio.get_running_loop()
        parts = await asyncio.gather(*(
            loop.run_in_executor(self._pool, _run_shard, base_url, model, list(plans[i::n]), caps[i], deadline_s,
                                 t0, stop_at, connect_timeout_s, read_timeout_s, send_until)
            for i in range(n)))
        out: list[RequestResult | None] = [None] * len(plans)
        for i, (part, _) in enumerate(parts):
            out[i::n] = part
        self.busiest_cores = max((cores for _, cores in parts), default=None)
        assert all(r is not None for r in out)
        return [r for r in out if r is not None]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
