"""A described workload's step sizes, predicted from the profiled cells' observed ones.

Capture sizes follow the tokens per engine step (:mod:`graphmode.selector.capture`), which a live server's
``/metrics`` shows and a description (rate, lengths, concurrency cap) does not. Every profiled cell recorded
its window's step-size histogram (``step_sizes``, rows of the model's datasets), so a description borrows
the nearest cells' histograms, moved to its own load:

* The described load (requests running) is the recommender's ``batch_mean`` for the description when given
  (Little's law on the model's predicted latency, :mod:`graphmode.selector.describe`), else the rate times
  each cell's own end-to-end latency per output token times the described output length; either way at
  most the client's concurrency cap and the deployment's ``max_num_seqs`` (vLLM never runs more).
* Cells are ranked by the distance ``|log L_d/L_c| + |log in_d/in_c| + |log out_d/out_c|`` (load, prompt and
  output length) and the :data:`NEAREST` nearest are used, each with equal weight.
* A cell's histogram is moved to the described load: a decode step has one token per running request, so
  steps up to the cell's largest batch scale by ``L_d / L_c`` (at most ``max_num_seqs``); a step holding
  prefill keeps its prefill tokens and trades the cell's largest batch for the described one.

The answer says that the steps were predicted, from which cells, and how far apart the cells' moved largest
batches are (the uncertainty of where the list must end).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from graphmode.core.dataset import step_sizes_of
from graphmode.core.records import StepSizes, split_decode_mixed
from graphmode.selector.capture_steps import step_distribution
from graphmode.selector.describe import WorkloadDescription

__all__ = ["NEAREST", "PredictedCell", "StepPrediction", "predict_steps", "shape_rows"]

NEAREST = 4  # cells whose histograms are pooled: one grid workload's repeats, or its neighbours
_LIMIT = 65536


class PredictedCell(BaseModel):
    """One profiled cell a prediction borrowed from."""

    dataset: str
    workload: str | None = None
    rate: float
    input_tokens: float
    output_tokens: float
    max_num_seqs: int | None = None
    cell_load: float = Field(description="the cell's mean running requests")
    predicted_load: float = Field(description="the described workload's running requests, from this cell")
    scale: float = Field(description="how the cell's decode steps were moved: predicted_load / cell_load")
    distance: float
    largest_batch: int = Field(description="the cell's largest running batch, moved to the described load")


class StepPrediction(BaseModel):
    """How the steps behind a capture answer were predicted from a description."""

    predicted: bool = True
    load: float = Field(description="running requests predicted for the description (mean over the cells)")
    load_source: str
    max_num_seqs: int
    cells: list[PredictedCell]
    largest_batch_range: tuple[int, int] = Field(
        description="lowest and highest of the cells' moved largest batches: where the decode steps end")
    uncertainty: str

    def note(self) -> str:
        lo, hi = self.largest_batch_range
        names = ", ".join(sorted({f"{c.workload or '?'} ({c.dataset})" for c in self.cells}))
        return (f"step sizes predicted from the description, not observed: {len(self.cells)} profiled cells "
                f"({names}) moved to {self.load:.0f} running requests ({self.load_source}); their largest "
                f"decode batches land at {lo}-{hi}. {self.uncertainty}")


def shape_rows(paths: Iterable[Any], model_config_hash: str | None = None,
               num_params_b: float | None = None) -> list[dict[str, Any]]:
    """Ok rows with step sizes from ``paths``: of the shape with ``model_config_hash`` when present, else of
    the shape nearest in parameters, else all. Read once per file version: the service predicts for many
    requests from one model folder."""
    rows: list[dict[str, Any]] = []
    for p in paths:
        st = os.stat(p)
        rows += _rows_with_steps(str(p), st.st_mtime_ns, st.st_size)
    hashes = {r.get("fp_model_config_hash") for r in rows}
    if model_config_hash in hashes:
        return [r for r in rows if r.get("fp_model_config_hash") == model_config_hash]
    sized = [(abs(float(r["fp_num_params_b"]) - num_params_b), r.get("fp_model_config_hash")) for r in rows
             if num_params_b is not None and isinstance(r.get("fp_num_params_b"), int | float)]
    if sized:
        pick = min(sized)[1]
        return [r for r in rows if r.get("fp_model_config_hash") == pick]
    return rows


@functools.lru_cache(maxsize=64)
def _rows_with_steps(path: str, _mtime_ns: int, _size: int) -> tuple[dict[str, Any], ...]:
    from graphmode.core.dataset import ProfileStore

    out = []
    with ProfileStore(path, readonly=True) as store:
        for r in store.rows(status="ok"):
            if not r.get("step_sizes"):
                continue
            row = dict(r, _dataset=path)
            steps = step_sizes_of(row)  # parsed once per file version, not per request
            row["_parsed"] = (steps, _spec(row), _cell_load(steps, row) if steps is not None else None)
            out.append(row)
    return tuple(out)


def _spec(row: Mapping[str, Any]) -> WorkloadDescription | None:
    raw = row.get("workload_spec")
    try:
        spec = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None
    return WorkloadDescription.from_spec(spec) if isinstance(spec, Mapping) else None


def _cell_load(steps: StepSizes, row: Mapping[str, Any]) -> float | None:
    total = sum(steps.running.values())
    if total > 0 and any(k > 0 for k in steps.running):
        return sum(k * c for k, c in steps.running.items()) / total
    mean = row.get("obs_batch_mean")
    return float(mean) if isinstance(mean, int | float) and mean > 0 else None


def _described_load(desc: WorkloadDescription, row: Mapping[str, Any], spec: WorkloadDescription,
                    batch_mean: float | None, max_num_seqs: int) -> tuple[float, str] | None:
    if batch_mean is not None and batch_mean > 0:
        load, how = batch_mean, "the recommender's Little's-law load"
    else:
        e2e = row.get("e2e_p50")
        if not isinstance(e2e, int | float) or e2e <= 0:
            return None
        load, how = desc.rate * e2e / spec.output_tokens * desc.output_tokens, "rate x the cells' latency"
    if desc.concurrency is not None:
        load = min(load, float(desc.concurrency))
    return max(min(load, float(max_num_seqs)), 1.0), how


def _moved(steps: StepSizes, scale: float, max_num_seqs: int,
           row: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[int, int], int]:
    """The cell's steps as a weight per token count after moving its decode batches by ``scale`` (the cell's
    distribution kept in its cached *row*: the same cells answer many requests)."""
    dist = row.get("_dist") if row is not None else None
    if dist is None:
        dist = step_distribution(steps, _LIMIT)
        if row is not None:
            row["_dist"] = dist
    b_cell = max((k for k in steps.running if k > 0), default=1)
    b_new = min(max(round(b_cell * scale), 1), max_num_seqs)
    out = np.zeros(_LIMIT + 1)
    total = max(dist.total, 1e-12)  # once: it sums the whole weight array
    for n in np.nonzero(dist.weight)[0]:
        m = min(max(round(n * scale), 1), max_num_seqs) if n <= b_cell else n - b_cell + b_new
        out[min(m, _LIMIT)] += dist.weight[n] / total
    running: dict[int, int] = {}
    for k, c in steps.running.items():
        key = min(max(round(k * scale), 1), max_num_seqs) if k > 0 else 0
        running[key] = running.get(key, 0) + c
    return out, running, b_new


def predict_steps(desc: WorkloadDescription, rows: Iterable[Mapping[str, Any]], *, max_num_seqs: int,
                  batch_mean: float | None = None, nearest: int = NEAREST) -> tuple[StepSizes, StepPrediction] | None:
    """The predicted :class:`StepSizes` of ``desc`` (see the module docstring) and how; ``None`` without a
    profiled cell that has step sizes, a workload spec and a load."""
    scored = []
    for r in rows:
        parsed = r.get("_parsed")
        if parsed is None:
            steps = step_sizes_of(dict(r))
            parsed = (steps, _spec(r), _cell_load(steps, r) if steps is not None else None)
        steps, spec, load_c = parsed
        if steps is None or spec is None or not steps.steps:
            continue
        got = _described_load(desc, r, spec, batch_mean, max_num_seqs)
        if load_c is None or got is None:
            continue
        load_d, how = got
        dist = (abs(math.log(load_d / load_c)) + abs(math.log(desc.input_tokens / spec.input_tokens))
                + abs(math.log(desc.output_tokens / spec.output_tokens)))
        scored.append((dist, str(r.get("_dataset", "")), r, steps, spec, load_c, load_d, how))
    if not scored:
        return None
    scored.sort(key=lambda t: (t[0], t[1]))
    picked = scored[:nearest]
    le = list(picked[0][3].le)
    weight = np.zeros(_LIMIT + 1)
    running: dict[int, int] = {}
    cells: list[PredictedCell] = []
    for dist, path, r, steps, spec, load_c, load_d, _how in picked:
        w, run, b_new = _moved(steps, load_d / load_c, max_num_seqs, r if isinstance(r, dict) else None)
        weight += w
        for k, c in run.items():
            running[k] = running.get(k, 0) + c
        cells.append(PredictedCell(
            dataset=path.rsplit("/", 1)[-1], workload=r.get("workload") or None, rate=spec.rate,
            input_tokens=spec.input_tokens, output_tokens=spec.output_tokens,
            max_num_seqs=r.get("dep_max_num_seqs"), cell_load=round(load_c, 2), predicted_load=round(load_d, 2),
            scale=round(load_d / load_c, 4), distance=round(dist, 4), largest_batch=b_new))
    n_steps = float(np.mean([sum(s.steps) for _, _, _, s, *_ in picked]))
    steps_out = _rebin(weight * n_steps / len(picked), le, running)
    tops = [c.largest_batch for c in cells]
    spread = (f"uncertainty: nearest cell at distance {cells[0].distance:.2f} (0 = same load and lengths); "
              + ("the cells agree on the largest batch" if min(tops) == max(tops)
                 else f"the largest batch varies {min(tops)}-{max(tops)} across them"))
    pred = StepPrediction(load=round(float(np.mean([c.predicted_load for c in cells])), 2),
                          load_source=picked[0][7], max_num_seqs=max_num_seqs, cells=cells,
                          largest_batch_range=(min(tops), max(tops)), uncertainty=spread)
    return steps_out, pred


def _rebin(weight: np.ndarray, le: list[float], running: dict[int, int]) -> StepSizes:
    """A weight per token count as a histogram on the edges ``le`` (plus the steps above the last)."""
    edges = [0, *(math.floor(e) for e in le)]
    cum = np.concatenate([[0.0], np.cumsum(weight)])
    steps = [float(cum[min(hi, len(weight) - 1) + 1] - cum[min(lo, len(weight) - 1) + 1])
             for lo, hi in itertools.pairwise(edges)]
    steps.append(float(cum[-1] - cum[min(edges[-1], len(weight) - 1) + 1]))
    steps = [round(s, 6) for s in steps]
    decode, mixed = split_decode_mixed(le, steps, running)
    return StepSizes(le=le, steps=steps, running=running, decode_steps=decode, mixed_steps=mixed, api_servers=1)
