"""Which workload a race measures next, and the short cells it measures them with.

Order
    The design (the race grid's workloads, or ``--workloads``) is put in a spread-out order first: start
    from the first workload listed, then repeatedly take the one farthest (largest smallest distance)
    from those already taken, in standardized features ``log rate``, ``log(input/output tokens)``,
    ``log(1/burstiness)`` and ``log concurrency cap``. The first rounds thereby cover the feature space
    instead of one corner of it.

Choice
    A workload is *open* while some (live challenger, metric) pair whose pooled verdict is still undecided
    has no verdict of its own on that workload (the same sequential rule on that workload's rounds). The
    next round measures the open workload with the fewest rounds so far, ties going to the earlier one in
    the spread order, so the race cycles through the design and a workload that has given its verdicts
    leaves the cycle. No open workload while pairs are undecided means their effect depends on the
    workload (decided one way on some, another way on others): the race stops them and says so.

Cells
    Every cell is short and of fixed length: a warm-up of exactly ``warmup_s`` (the workload's own when
    shorter), then a window of exactly ``cell_s`` seconds, after which requests in flight are cut (an
    adaptive window whose minimum is its maximum). A round's cells on different engines get the same
    seeded request plan (the round index is the seed), so with the same fixed warm-up every arm's window
    holds the same planned requests. A warm-up of "one request lifetime" (the first request to finish)
    did not: it ends earlier on the faster engine, and on the H200 (2026-12-02, capture-size races, 3-s
    cells) the arms of one round used 0.7-1.6 s of warm-up, sent different requests in their windows
    (101 vs 99, 112 vs 118) and ran at batch means of 31 vs 69 on the same plan; the within-round sd of
    ln(ITL ratio) was 0.11-0.17 at 2 req/s (5 requests a window) and up to 0.43 at 32 req/s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from graphmode.profiling.grid import AdaptiveWindow, Workload


def race_cell(workload: Workload, cell_s: float, warmup_s: float) -> Workload:
    """*workload* as a race cell: a fixed warm-up (*warmup_s*, or the workload's own when shorter), then a
    window of exactly *cell_s*."""
    warm = min(workload.warmup_s, warmup_s) if workload.warmup_s > 0 else warmup_s
    spec = workload.spec()
    # the warm-up's minimum is its maximum: the same window of the round's plan on every arm
    spec.update(duration_s=cell_s, warmup_s=warm, repeats=1, max_requests=None,
                adaptive=AdaptiveWindow(min_s=cell_s, min_warmup_s=warm).model_dump())
    return Workload.model_validate(spec)


def _features(w: Workload) -> list[float]:
    cap = w.max_concurrency if w.max_concurrency else 1024
    return [math.log(w.rate), math.log(w.input.mean / w.output.mean), math.log(1 / w.burstiness), math.log(cap)]


def spread_order(workloads: Sequence[Workload]) -> list[Workload]:
    """Farthest-point order from the first workload (see the module docstring)."""
    if len(workloads) <= 2:
        return list(workloads)
    x = np.asarray([_features(w) for w in workloads], dtype=float)
    sd = x.std(axis=0)
    z = (x - x.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
    chosen = [0]
    nearest = np.linalg.norm(z - z[0], axis=1)
    while len(chosen) < len(workloads):
        nearest[chosen] = -1.0
        nxt = int(np.argmax(nearest))
        chosen.append(nxt)
        nearest = np.minimum(nearest, np.linalg.norm(z - z[nxt], axis=1))
    return [workloads[i] for i in chosen]


def next_workload(order: Sequence[Workload], rounds: Mapping[str, int], open_names: set[str]) -> Workload | None:
    """The open workload with the fewest rounds so far; ties go to the earlier in *order*."""
    candidates = [(rounds.get(w.name, 0), i, w) for i, w in enumerate(order) if w.name in open_names]
    if not candidates:
        return None
    return min(candidates, key=lambda c: (c[0], c[1]))[2]
