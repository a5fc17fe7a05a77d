"""Which batch sizes get a CUDA graph: ``cudagraph_capture_sizes`` chosen from the observed step sizes.

vLLM pads a step of ``n`` tokens up to the smallest captured size ``>= n`` and replays that graph; a step
above the largest captured size runs without a graph. Its default list (vllm/config/vllm.py,
``_set_cudagraph_sizes``; the resolved config in every H200 fixture log shows it, 51 sizes for max 512) is
``[1, 2, 4] + range(8, min(max + 1, 256), 8) + range(256, max + 1, 16)`` with
``max = min(max_cudagraph_capture_size or min(2 * max_num_seqs, 512), max_num_batched_tokens)``,
whatever the traffic. Here the list follows the traffic instead.

Method (exact for the discrete distribution it is given)
    The step-size distribution (:func:`step_distribution`) is a weight per integer token count. The
    largest size is the upper edge of the histogram bucket holding the ``coverage`` quantile of the steps a
    graph may take (steps above ``limit``, the largest size vLLM allows, run un-graphed whatever is chosen):
    the edge, not the largest batch sampled, because the metrics bound a step only by its bucket. With the top fixed,
    dynamic programming over the sorted candidates picks the ``K - 1`` other sizes that minimise the
    expected padded tokens per step, for every ``K``; the answer is the fewest sizes whose padding is
    within ``padding_tolerance`` tokens per step of the least the budget allows. Candidates are 1, 2, 4,
    the multiples of 8 and every observed batch size (decode steps have exactly that many tokens), so a
    list looks like one vLLM would use.

    Padding is bounded for steps the window did not see: no two consecutive sizes may be further apart than
    ``max_pad_ratio`` (:data:`MAX_PAD_RATIO`, 1.25) times the step just above the lower one, or one candidate
    step (8 tokens), whichever is more, so a burst above what the window saw pads by at most that much
    instead of up to the next size the window needed. Without it a list chosen at 2 req/s
    ([1, 3, 4, 6, 256, 384, 512]) padded every step of 7-255 tokens to 256: at 48 running its ITL was 1.47x
    the default list's (H200, Llama-3.1-8B, vLLM 0.33, 2026-12-04, paired rounds), and one burst of an
    open-loop 2 req/s round read 1.58x. The DP takes the bound as a constraint on each segment, so the
    list is still the least padding for the window among the lists that keep it.

    Sizes to always keep (:data:`ALWAYS_KEEP`, 1, 2, 4, 8) up to the top are breakpoints no DP segment may
    step over, so the padding, the graphed share and every budget are those of the final list. Traffic
    changes over a day and a restart for a new list happens only when it pays: a list chosen at 32 req/s
    that started at 63 padded every single-sequence step at 2 req/s to 63 (H200, Llama-3.1-8B, vLLM 0.33:
    TPOT 1.056x the default list's), while small graphs cost little. A budget too small for them and the
    top drops kept sizes from the largest down, and says so.

Costs and the step distribution live in :mod:`graphmode.selector.capture_costs` and
:mod:`graphmode.selector.capture_steps`; their public names are re-exported here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Iterable, Sequence
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, Field, field_validator

from graphmode.core.records import StepSizes
from graphmode.selector.capture_costs import (
    GIB,
    CaptureCosts,
    costs_from_dataset,
    default_capture_sizes,
    graphs_per_size,
    kv_bytes_per_token,
    lone_starts,
    measured_kv_bytes_per_token,
    spec_decode_sizes,
)
from graphmode.selector.capture_evidence import CaptureEvidence
from graphmode.selector.capture_steps import (
    PAD_TOKEN_COST,
    Distribution,
    ListStats,
    decode_only,
    list_stats,
    step_distribution,
)
from graphmode.selector.step_predict import StepPrediction

__all__ = [
    "ALWAYS_KEEP",
    "MAX_PAD_RATIO",
    "PAD_TOKEN_COST",
    "CaptureAnswer",
    "CaptureBudget",
    "CaptureCosts",
    "ListStats",
    "check_keep",
    "check_pad_ratio",
    "choose_capture_sizes",
    "costs_from_dataset",
    "default_capture_sizes",
    "graphs_per_size",
    "kv_bytes_per_token",
    "list_stats",
    "lone_starts",
    "measured_kv_bytes_per_token",
    "parse_keep",
    "spec_decode_sizes",
    "step_distribution",
]

ALWAYS_KEEP = (1, 2, 4, 8)  # small graphs cost little; a list without them taxes every quiet hour
# A step pads by at most this factor (or one candidate step): at the H200 8B's 48 running, 208 padded tokens
# cost 47% ITL, ~0.22% per padded token, so 1.25 keeps a burst near the ±3% the races test for.
MAX_PAD_RATIO = 1.25


class CaptureBudget(BaseModel):
    """Limits on what the capture may cost; ``None`` is no limit. ``max_sizes`` counts capture sizes, kept
    ones included. ``always_keep``: sizes every list holds up to its largest (``None``: :data:`ALWAYS_KEEP`).
    ``max_pad_ratio``: the most a step up to the largest size may be padded, as a factor (``None``:
    :data:`MAX_PAD_RATIO`; ``0``: no bound); a budget too small for it drops it and says so."""

    max_sizes: int | None = Field(None, ge=1)
    max_capture_s: float | None = Field(None, gt=0)
    max_graph_gib: float | None = Field(None, gt=0)
    always_keep: list[Annotated[int, Field(strict=True, ge=1, le=65536)]] | None = Field(
        None, max_length=128, description="capture sizes kept whatever the window saw, up to the largest chosen "
        "(default 1, 2, 4, 8; [] for none), so that small batches replay a graph whatever the load")
    max_pad_ratio: float | None = Field(
        None, ge=0, le=64, description="the most any step up to the largest size is padded, as a factor of its "
        "tokens (or by one 8-token candidate step, whichever is more), seen in the window or not (default 1.25; "
        "0 for no bound)")

    @field_validator("max_pad_ratio")
    @classmethod
    def _ratio_above_one(cls, v: float | None) -> float | None:
        if v is not None and 0 < v <= 1:
            raise ValueError("max_pad_ratio must be above 1 (or 0 for no bound)")
        return v


class CaptureAnswer(BaseModel):
    """The chosen ``cudagraph_capture_sizes`` against vLLM's default list, and why."""

    mode: str
    sizes: list[int]
    max_capture_size: int
    default_sizes: list[int]
    chosen: ListStats
    default: ListStats
    capture_s_saved: float | None = None
    graph_gib_saved: float | None = None
    kv_tokens_gained: int | None = Field(None, description="GiB vLLM reserves for graphs less than for the "
                                         "default's (graph GiB saved where no start logged it) / KV bytes per token")
    steps_observed: float = 0.0
    steps_above_limit: float = Field(
        0.0, description="steps no graph can take: above the largest size vLLM allows (and, in FULL_DECODE_ONLY, "
        "the steps with prefill tokens)")
    decode_steps: float | None = None
    mixed_steps: float | None = None
    costs_basis: str = ""
    decode_graph_sizes: list[int] | None = Field(
        None, description="with speculative decoding, the sizes vLLM captures FULL decode graphs at (the list "
        "rounded up to multiples of 1 + k); None without it")
    excluded_modes: dict[str, str] = Field(
        default_factory=dict, description="modes vLLM would downgrade for this deployment, and why")
    evidence: CaptureEvidence | None = Field(
        None, description="the raced list most like this one, for this shape on the model's GPU, and what its "
        "race measured against vLLM's default list (None: no such race in the model's datasets)")
    steps_predicted: StepPrediction | None = Field(
        None, description="set when the steps were predicted from a workload description (not observed): from "
        "which profiled cells, at what load, and how uncertain")
    notes: list[str] = Field(default_factory=list)

    def compilation_config(self) -> dict[str, Any]:
        return {"cudagraph_capture_sizes": self.sizes, "max_cudagraph_capture_size": self.max_capture_size}


MAX_CANDIDATES = 1024  # keeps the O(K n²) DP well under a second
MAX_SIZES = 128  # more sizes than vLLM's default list ever has (51 up to 512, 67 up to 768, ...)
MAX_LIMIT = 65536  # no capture size above this is considered (vLLM's token budget is usually 2048-16384)


def _cand_step(top: int) -> int:
    """Multiples of this are candidates: 8, thinned to 8·k when a large top would give too many."""
    return 8 * max(1, math.ceil(top / 8 / MAX_CANDIDATES))


def _candidates(dist: Distribution, top: int, keep: Sequence[int] = ()) -> list[int]:
    step = _cand_step(top)
    observed = dist.observed
    if len(observed) > MAX_CANDIDATES // 2:  # keep the most frequent batch sizes
        observed = tuple(sorted(sorted(observed, key=lambda n: -dist.weight[n])[: MAX_CANDIDATES // 2]))
    pool = {1, 2, 4, *range(step, top + 1, step), *observed, *keep, top}
    return sorted(c for c in pool if 1 <= c <= top)


def _best_lists(dist: Distribution, cands: list[int], k_max: int,
                must: Collection[int] = (), ratio: float = 0.0) -> list[tuple[float, list[int]]]:
    """For K = 1..k_max: least expected padded tokens (summed over steps) and the sizes, top fixed at cands[-1],
    every size of ``must`` (all candidates) in the list; ascending K, the K no list can have left out.

    ``cost(i, j)`` pads the steps in ``(cands[i], cands[j]]`` up to ``cands[j]``; prefix sums make it O(1),
    so each K is one vectorised pass over (i, j). A size of ``must`` is a breakpoint no segment may step over.
    With ``ratio`` (> 1) no segment may pad its smallest step ``cands[i] + 1`` by more than that factor or by
    more than one candidate step (:func:`_pad_bound`).
    """
    w = dist.weight
    cw = np.concatenate([[0.0], np.cumsum(w)])  # cw[t + 1]: weight of steps of at most t tokens
    ct = np.concatenate([[0.0], np.cumsum(w * np.arange(len(w)))])
    c = np.array(cands)
    n = len(c)

    def upto(arr: np.ndarray, t: np.ndarray) -> np.ndarray:  # sum over tokens 1..t
        out: np.ndarray = arr[np.minimum(t, len(w) - 1) + 1]
        return out

    W, T = upto(cw, c), upto(ct, c)
    # seg[i, j] for i < j: steps in (c[i], c[j]] padded to c[j]; row n stands for "nothing below" (lower 0).
    seg = np.full((n + 1, n), np.inf)
    iu = np.triu_indices(n, 1)
    seg[iu] = c[iu[1]] * (W[iu[1]] - W[iu[0]]) - (T[iu[1]] - T[iu[0]])
    seg[n, :] = c * W - T
    if ratio > 1:
        slack = _cand_step(int(c[-1]))
        far = c[iu[1]] > _pad_bound(c[iu[0]], ratio, slack)
        seg[iu[0][far], iu[1][far]] = np.inf
        seg[n, c > _pad_bound(np.zeros(1, dtype=c.dtype), ratio, slack)] = np.inf
    if must:
        forced = np.concatenate([[0], np.cumsum(np.isin(c, list(must)))])  # forced[j]: must-sizes below c[j]
        skip = forced[iu[1]] > forced[iu[0] + 1]  # a must-size strictly inside (c[i], c[j])
        seg[iu[0][skip], iu[1][skip]] = np.inf
        seg[n, forced[:n] > 0] = np.inf
    best = seg[n, :].copy()  # K = 1: only c[j]
    back: list[np.ndarray] = [np.full(n, n)]
    out = [(float(best[-1]), [int(c[-1])])] if np.isfinite(best[-1]) else []
    for _k in range(2, min(k_max, n) + 1):
        total = best[:, None] + seg[:n, :]
        arg = np.argmin(total, axis=0)
        best = total[arg, np.arange(n)]
        back.append(arg)
        sizes, j = [], n - 1
        for step in reversed(back):
            sizes.append(int(c[j]))
            j = int(step[j])
            if j == n:
                break
        if np.isfinite(best[-1]):
            out.append((float(best[-1]), sorted(sizes)))
    return out


def _pad_bound(lower: np.ndarray, ratio: float, slack: int) -> np.ndarray:
    """The largest size a step of ``lower + 1`` tokens may pad to: ``ratio`` times it, or ``slack`` more tokens
    than ``lower`` where that is more (a step of 9 may pad to 16, as in vLLM's own list)."""
    out: np.ndarray = np.maximum(np.floor(ratio * (lower + 1) + 1e-9), lower + slack)
    return out


def choose_capture_sizes(
    steps: StepSizes | None,
    *,
    mode: str = "FULL_AND_PIECEWISE",
    max_num_seqs: int = 256,
    max_num_batched_tokens: int | None = None,
    limit: int | None = None,
    budget: CaptureBudget | None = None,
    costs: CaptureCosts | None = None,
    kv_bytes_per_token: float | None = None,
    coverage: float = 1.0,
    padding_tolerance: float = 1.0,
    always_keep: Sequence[int] | None = None,
    graph_long_prefill: bool = False,
    max_pad_ratio: float | None = None,
) -> CaptureAnswer:
    """The capture sizes for ``steps`` (see the module docstring), compared with vLLM's default list.

    ``limit`` is the largest size vLLM may capture (default ``max_num_batched_tokens``, else 8192, vLLM's
    usual chunked-prefill budget). An empty or missing distribution keeps vLLM's default list and says so.
    ``always_keep`` (default ``budget.always_keep``, else :data:`ALWAYS_KEEP`; ``()`` for none) are sizes
    in every answer up to its largest size, whatever the window saw. Steps that carry prefill tokens and
    are longer than vLLM's default largest size do not raise the largest size unless ``graph_long_prefill``:
    like under the default list, they run without a graph. ``max_pad_ratio`` (default
    ``budget.max_pad_ratio``, else :data:`MAX_PAD_RATIO`; ``0`` for no bound) bounds the padding of every
    step up to the largest size, seen in the window or not.
    """
    if not 0 < coverage <= 1:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    if steps is not None:
        steps = steps.per_engine_step()
    budget = budget or CaptureBudget()
    kept, ratio = _keep_and_ratio(budget, always_keep, max_pad_ratio)
    default = default_capture_sizes(max_num_seqs, max_num_batched_tokens)
    cap = limit if limit is not None else (max_num_batched_tokens or 8192)
    if cap < 1:
        raise ValueError(f"the capture-size limit must be at least 1, got {cap}")
    cap = min(cap, MAX_LIMIT)
    notes: list[str] = []
    prefill_moved = 0.0
    if steps is not None and mode.upper() == "FULL_DECODE_ONLY" and steps.mixed_steps:
        before = steps.steps[-1] if len(steps.steps) > len(steps.le) else 0.0
        steps = decode_only(steps)
        prefill_moved = steps.steps[-1] - before
        notes.append(f"FULL_DECODE_ONLY graphs decode steps only: the {prefill_moved:g} steps that carry "
                     "prefill tokens run without a graph whatever the list, and count as un-graphed")
    dist = step_distribution(steps, cap) if steps is not None else Distribution(np.zeros(cap + 1), 0.0, ())
    basis = costs.basis if costs is not None else "no cost model"
    graphable = float(dist.weight.sum())
    d_stats = list_stats(default, dist, costs, mode)
    if graphable <= 0:
        why = ("no step in the window" if dist.total <= 0
               else f"every observed step is above {cap} tokens, the largest size vLLM allows")
        notes.append(f"{why}: vLLM's default list is kept")
        return _answer(mode, default, default, dist, d_stats, d_stats, costs, kv_bytes_per_token, steps, basis,
                       notes)
    cum = np.cumsum(dist.weight)
    top = max(int(np.searchsorted(cum, coverage * graphable - 1e-9)), 1)
    # The histogram only bounds a step by its bucket's edge, and sparse running samples can miss the largest
    # batches: the top size is that edge, so every step the histogram allows replays a graph.
    assert steps is not None
    top = min(next((math.floor(e) for e in steps.le if e >= top), top), cap)
    if top > default[-1] and not graph_long_prefill and steps.running:
        top = _lower_for_prefill(steps, dist, top, default[-1], notes)
    if (budget.max_capture_s is not None or budget.max_graph_gib is not None) and (costs is None
                                                                                   or not costs.n_starts):
        notes.append("no measured engine start to predict capture seconds or graph GiB: that budget is not checked")
    pick = functools.partial(_select, dist, budget=budget, costs=costs, mode=mode, default=default,
                             tolerance=padding_tolerance, graphable=graphable)
    sizes, picked_notes = pick(_candidates(dist, top, kept), kept, ratio=ratio)
    notes += picked_notes
    if sizes is None:
        return _answer(mode, default, default, dist, d_stats, d_stats, costs, kv_bytes_per_token, steps, basis,
                       notes)
    chosen = list_stats(sizes, dist, costs, mode)
    if ratio > 1:
        notes += _bound_note(sizes, pick(_candidates(dist, top, kept), kept)[0], ratio, costs, mode)
    if any(k in sizes for k in kept):
        # Against what this window alone would choose: a kept size it would have chosen anyway needs no word.
        alone, _ = pick(_candidates(dist, top), (), ratio=ratio)
        extra = [k for k in kept if k in sizes and (alone is None or k not in alone)]
        if extra and alone is not None:
            pad = next(s for s in alone if s >= extra[0])
            cost = _cost_delta(sizes, alone, costs, mode)
            cost += " against that list" if cost else ""
            notes.append(f"kept {', '.join(map(str, extra))} so that small batches replay a graph whatever the "
                         f"load (this window alone chose {len(alone)} sizes from {alone[0]}: a step of {extra[0]} "
                         f"token{'s' if extra[0] > 1 else ''} would pad to {pad}{cost})")
    notes += _list_notes(sizes, default, dist, dist.above - prefill_moved, cap, costs)
    return _answer(mode, sizes, default, dist, chosen, d_stats, costs, kv_bytes_per_token, steps, basis, notes)


def _lower_for_prefill(steps: StepSizes, dist: Distribution, top: int, default_top: int, notes: list[str]) -> int:
    """The largest size once steps above the default's largest that carry prefill are left un-graphed.

    Above the default's largest size only decode steps raise the top. A long mixed step is mostly prefill
    compute, so its graph saves little, and the largest graph sets the pool: on the H200 (8B shape,
    2026-12-02) a list up to 2048 for 32 req/s took 0.87 GiB of graphs against the default's 0.45
    (-5,280 KV cache tokens) with no latency gain shown.
    """
    batch_max = max(steps.running)
    decode_top = next((math.floor(e) for e in steps.le if e >= batch_max), math.ceil(batch_max))
    lowered = min(max(default_top, decode_top), top)
    if lowered < top:
        share = float(dist.weight[lowered + 1: top + 1].sum()) / dist.total
        notes.append(f"steps of {lowered + 1}-{top} tokens carry prefill ({share:.1%} of steps): like under "
                     f"vLLM's default list they run without a graph, which would cost the most graph memory "
                     f"for the least gain (graph_long_prefill to capture them)")
    return lowered


def _keep_and_ratio(budget: CaptureBudget, always_keep: Sequence[int] | None,
                    max_pad_ratio: float | None) -> tuple[tuple[int, ...], float]:
    """The sizes to always keep and the padding bound, from the arguments or the budget (they must agree)."""
    if always_keep is not None and budget.always_keep is not None and set(always_keep) != set(budget.always_keep):
        raise ValueError(f"always_keep {list(always_keep)} disagrees with the budget's {budget.always_keep}: "
                         "give one")
    kept = check_keep(always_keep if always_keep is not None
                      else budget.always_keep if budget.always_keep is not None else ALWAYS_KEEP)
    if max_pad_ratio is not None and budget.max_pad_ratio is not None and max_pad_ratio != budget.max_pad_ratio:
        raise ValueError(f"max_pad_ratio {max_pad_ratio:g} disagrees with the budget's {budget.max_pad_ratio:g}: "
                         "give one")
    ratio = check_pad_ratio(max_pad_ratio if max_pad_ratio is not None
                            else budget.max_pad_ratio if budget.max_pad_ratio is not None else MAX_PAD_RATIO)
    return kept, ratio


def _list_notes(sizes: list[int], default: list[int], dist: Distribution, beyond: float, cap: int,
                costs: CaptureCosts | None) -> list[str]:
    """What the chosen list leaves un-graphed, reaches beyond the default, or cannot price."""
    notes: list[str] = []
    if beyond > 1e-9:
        share = beyond / dist.total
        notes.append(f"{share:.1%} of steps are above {cap} tokens, the largest size vLLM allows: they run "
                     "without a graph whatever the list")
    if sizes[-1] > default[-1]:
        notes.append(f"the largest size {sizes[-1]} is above the default's {default[-1]}: steps the default "
                     "runs without a graph get one")
    if costs is not None and costs.n_starts and not costs.knows_gib(sizes):
        notes.append(f"graph GiB not predicted: the largest size {sizes[-1]} is above every measured start's "
                     f"({costs.max_top}), and the largest graph sets the shared pool; a lone start of this "
                     "list measures it")
    return notes


def _bound_note(sizes: list[int], loose: list[int] | None, ratio: float, costs: CaptureCosts | None,
                mode: str) -> list[str]:
    """What bounding the padding added to the list the window alone asked for (nothing when it added nothing)."""
    if loose is None or loose == sizes or len(sizes) <= len(loose):
        return []
    worst = _worst_pad(loose)
    cost = _cost_delta(sizes, loose, costs, mode)
    return [f"{len(sizes) - len(loose)} sizes more than the window alone needed, so that no step up to {sizes[-1]} "
            f"pads by more than {ratio:g}x (or 8 tokens): without them a step of {worst[0]} would pad to "
            f"{worst[1]}{cost} (max_pad_ratio 0 to drop the bound)"]


def _cost_delta(sizes: list[int], other: list[int], costs: CaptureCosts | None, mode: str) -> str:
    """``; predicted +X s capture, +Y GiB graphs`` of *sizes* over *other* ("" without measured starts)."""
    if costs is None or not costs.n_starts:
        return ""
    o_s, o_g = costs.predict(other, mode)
    c_s, c_g = costs.predict(sizes, mode)
    out = f"; predicted {c_s - o_s:+.2f} s capture"
    # two lists with one largest size share the pool, so their difference is per-graph only
    if max(sizes) == max(other) or (costs.knows_gib(sizes) and costs.knows_gib(other)):
        out += f", {c_g - o_g:+.3f} GiB graphs"
    return out


def _worst_pad(sizes: Sequence[int]) -> tuple[int, int]:
    """(step, size it pads to) with the largest padding factor under ``sizes``."""
    srt, lower, best = sorted(sizes), 0, (1, 1)
    for s in srt:
        if s / (lower + 1) > best[1] / best[0]:
            best = (lower + 1, s)
        lower = s
    return best


def check_pad_ratio(ratio: Any) -> float:
    """``ratio`` as a padding bound: 0 (none) or a number above 1; anything else is a ValueError."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) \
            or not (ratio == 0 or 1 < ratio <= 64):
        raise ValueError(f"max_pad_ratio must be 0 (no bound) or a number in (1, 64], got {ratio!r}")
    return float(ratio)


def check_keep(keep: Iterable[Any]) -> tuple[int, ...]:
    """``keep`` as sorted distinct sizes; anything but positive integers is a ValueError."""
    if isinstance(keep, (str, bytes)) or not isinstance(keep, Iterable):
        raise ValueError(f"sizes to always keep must be a list of positive integers, got {keep!r}")
    out: set[int] = set()
    for k in keep:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= MAX_LIMIT:
            raise ValueError(f"a size to always keep must be an integer in 1..{MAX_LIMIT}, got {k!r}")
        out.add(int(k))
    return tuple(sorted(out))


def parse_keep(text: str) -> tuple[int, ...]:
    """``"1,2,4,8"`` or ``"none"`` (also ``""``) as sizes to always keep, for command lines."""
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        return check_keep(int(part) for part in text.split(","))
    except ValueError:
        why = f"sizes to always keep must be comma-separated integers in 1..{MAX_LIMIT} or 'none', got {text!r}"
    raise ValueError(why)


def _select(dist: Distribution, cands: list[int], kept: Sequence[int], *, budget: CaptureBudget,
            costs: CaptureCosts | None, mode: str, default: list[int],
            tolerance: float, graphable: float, ratio: float = 0.0) -> tuple[list[int] | None, list[str]]:
    """The fewest sizes within ``tolerance`` padded tokens per step of the least padding any list in the
    budget has, each list holding the kept sizes up to its top and, where the budget allows, padding no step
    by more than ``ratio``; ``None`` when not even one graph fits."""
    notes: list[str] = []
    k_max = min(budget.max_sizes or len(default), len(cands), MAX_SIZES)

    def fit(cs: list[int]) -> tuple[list[tuple[float, list[int]]], list[int]]:
        allowed, dropped = _fitting(dist, cs, kept, k_max, budget, costs, mode, ratio)
        if ratio > 1 and (not allowed or dropped):
            # The bound costs sizes; it goes before any kept size does.
            loose, loose_dropped = _fitting(dist, cs, kept, k_max, budget, costs, mode)
            if loose and (not allowed or len(loose_dropped) < len(dropped)):
                notes.append(f"the budget cannot hold sizes close enough together for every step up to {cs[-1]} "
                             f"to pad by at most {ratio:g}x: that bound is dropped, so a step the window did not "
                             "see may pad up to the next size it did")
                return loose, loose_dropped
        return allowed, dropped

    allowed, dropped = fit(cands)
    if not allowed:
        # Even [top] alone is over budget: the largest top whose single graph fits, then the best lists under it.
        fits = [t for t in cands[:-1] if _within([t], budget, costs, mode)]
        if fits:
            notes.append(f"no list reaching {cands[-1]} fits the budget: the largest size is lowered to "
                         f"{fits[-1]}, larger steps run without a graph")
            allowed, dropped = fit([c for c in cands if c <= fits[-1]])
    if not allowed:
        base = ""
        if costs is not None and costs.gib_base and budget.max_graph_gib is not None \
                and costs.gib_base >= budget.max_graph_gib:
            base = f" (any list's graphs take a predicted {costs.gib_base:.2f} GiB before their sizes count)"
        notes.append(f"even one graph exceeds the budget{base}: vLLM's default list is kept")
        return None, notes
    if dropped:
        notes.append(f"the budget cannot hold every size to always keep with the largest size "
                     f"{allowed[0][1][-1]}: {', '.join(map(str, dropped))} dropped (the largest go first)")
    floor = min(p for p, _ in allowed)
    # ascending K: the fewest sizes within tolerance of the least padding
    return next(s for p, s in allowed if (p - floor) / graphable <= tolerance), notes


def _fitting(dist: Distribution, cands: list[int], kept: Sequence[int], k_max: int, budget: CaptureBudget,
             costs: CaptureCosts | None, mode: str, ratio: float = 0.0) -> tuple[list[tuple[float, list[int]]],
                                                                                 list[int]]:
    """The DP's lists within the budget that hold the top and as many kept sizes as fit, dropping kept sizes
    from the largest down (a one-token step, the likeliest at low load, is the last to lose its graph)."""
    must = [k for k in kept if k < cands[-1]]
    dropped = must[max(k_max - 1, 0):]  # k_max sizes at most, the top among them
    must = must[:max(k_max - 1, 0)]
    while True:
        allowed = [(p, s) for p, s in _best_lists(dist, cands, k_max, must, ratio)
                   if _within(s, budget, costs, mode)]
        if allowed or not must:
            return allowed, dropped
        dropped.insert(0, must.pop())


def _within(sizes: Sequence[int], budget: CaptureBudget, costs: CaptureCosts | None, mode: str) -> bool:
    if budget.max_sizes is not None and len(sizes) > budget.max_sizes:
        return False
    if costs is None or not costs.n_starts:
        return True
    secs, gib = costs.predict(sizes, mode)
    return ((budget.max_capture_s is None or secs <= budget.max_capture_s)
            and (budget.max_graph_gib is None or gib <= budget.max_graph_gib))


def _answer(mode: str, sizes: list[int], default: list[int], dist: Distribution, chosen: ListStats,
            d_stats: ListStats, costs: CaptureCosts | None, kv_bpt: float | None, steps: StepSizes | None,
            basis: str, notes: list[str]) -> CaptureAnswer:
    s_saved = g_saved = None
    if chosen.capture_s is not None and d_stats.capture_s is not None:
        s_saved = round(d_stats.capture_s - chosen.capture_s, 3)
    if chosen.graph_gib is not None and d_stats.graph_gib is not None:
        g_saved = round(d_stats.graph_gib - chosen.graph_gib, 4)
    kv = None
    if g_saved is not None and kv_bpt:
        # g_saved is known only where the fit knows both lists' GiB; vLLM sizes the KV cache by what it
        # reserved for the graphs, so that is the difference the tokens follow where starts logged it
        r_chosen, r_default = (costs.predict_reserved(sizes, mode), costs.predict_reserved(default, mode)) \
            if costs is not None else (None, None)
        saved = r_default - r_chosen if r_chosen is not None and r_default is not None else g_saved
        kv = int(saved * GIB / kv_bpt)
    return CaptureAnswer(
        mode=mode, sizes=sizes, max_capture_size=max(sizes), default_sizes=default, chosen=chosen,
        default=d_stats, capture_s_saved=s_saved, graph_gib_saved=g_saved, kv_tokens_gained=kv,
        steps_observed=round(dist.total, 3), steps_above_limit=round(dist.above, 3),
        decode_steps=steps.decode_steps if steps is not None else None,
        mixed_steps=steps.mixed_steps if steps is not None else None,
        costs_basis=basis, notes=notes,
    )
