"""The decision table: the model's answer for described workloads, precomputed at training time.

``graphmode launch`` decides once, before vLLM starts, from a workload *description* (rate, burstiness,
prompt and output lengths). Loading the model for that (scikit-learn, skops, the compiled regressors)
takes longer than the decision itself, so training writes ``table.json`` beside the card: the
recommender's mode, and the predicted objective value of that mode and of vLLM's default, for every
objective the card evaluates, over a grid of descriptions.

The grid is, per axis, the values the profile measured plus factor-of-two steps from half the smallest
to twice the largest; the table covers the Cartesian product. A lookup takes the **nearest grid point**
(per axis, in log space; no interpolation: modes are categories, and the grid holds every profiled
workload exactly, where the table and the model agree by construction). Outside the grid, with a
concurrency cap, or for an objective the table does not hold, :func:`lookup` returns None and the
caller asks the full model.

This module imports nothing beyond the standard library on the lookup path.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphmode.selector.describe import WorkloadDescription
    from graphmode.selector.objective import Objective
    from graphmode.selector.recommend import Recommender

TABLE_FILE = "table.json"
TABLE_SCHEMA = 1
AXES = ("rate", "burstiness", "input_tokens", "output_tokens")


def axis_values(measured: Iterable[float]) -> list[float]:
    """The measured values plus factor-of-two steps from half the smallest to twice the largest."""
    vals = sorted({float(v) for v in measured if v > 0})
    if not vals:
        return []
    lo, hi = vals[0] / 2, vals[-1] * 2
    steps = [lo * 2.0**k for k in range(math.floor(math.log2(hi / lo) + 1e-9) + 1)]
    return sorted({round(v, 6) for v in [*vals, *steps, hi]})


@dataclass(frozen=True)
class TableAnswer:
    mode: str
    value: float | None  # predicted objective value of the mode
    default_value: float | None  # ... and of vLLM's default
    point: dict[str, float]  # the grid point that answered


def build_table(rec: Recommender, descriptions: Sequence[WorkloadDescription],
                objectives: Sequence[Objective]) -> dict[str, Any]:
    """The table for ``rec`` over the grid spanned by ``descriptions`` (the profiled workloads)."""
    import numpy as np

    from graphmode.core.errors import ObjectiveError
    from graphmode.selector.card import ARTIFACT_FILE
    from graphmode.selector.describe import WorkloadDescription

    axes = {a: axis_values(getattr(d, a) for d in descriptions) for a in AXES}
    modes = list(rec.modes)
    answers: dict[str, dict[str, list[Any]]] = {
        o.describe(): {"mode": [], "value": [], "default_value": []} for o in objectives
    }
    common: set[str] | None = None  # warnings every answer carries are the model's, not the input's
    with np.errstate(over="ignore"):  # grid corners beyond the data may extrapolate to inf: no mode there
        for point in product(*(axes[a] for a in AXES)):
            feats = rec.describe(WorkloadDescription(**dict(zip(AXES, point, strict=True))))  # every objective
            for o in objectives:
                col = answers[o.describe()]
                try:
                    ans = rec.recommend(feats, o, source="description")
                except ObjectiveError:  # no mode predicts the metric here: the full model answers, or says why
                    col["mode"].append(-1)
                    col["value"].append(None)
                    col["default_value"].append(None)
                    continue
                default = next((p.objective_value for p in ans.predictions if p.mode == ans.default_mode), None)
                common = set(ans.warnings) if common is None else common & set(ans.warnings)
                col["mode"].append(modes.index(ans.mode))
                col["value"].append(_round(ans.predicted_value))
                col["default_value"].append(_round(default))
    return {
        "schema": TABLE_SCHEMA,
        "model_id": rec.model_id,
        "artifact_sha256": rec.card.artifacts[ARTIFACT_FILE].sha256,
        "lookup": "nearest grid point, per axis in log space; none outside the grid",
        "warnings": sorted(common or ()),
        "modes": modes,
        "axes": axes,
        "objectives": answers,
    }


def _round(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(f"{v:.5g}")


def save_table(table: dict[str, Any], folder: Path) -> Path:
    path = folder / TABLE_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(table, separators=(",", ":")) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def load_table(folder: Path, artifact_sha256: str) -> dict[str, Any] | None:
    """The folder's table, if it exists and was built for this artifact (a stale table is ignored)."""
    try:
        table = json.loads((folder / TABLE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(table, dict) or table.get("schema") != TABLE_SCHEMA:
        return None
    return table if table.get("artifact_sha256") == artifact_sha256 else None


def _nearest(values: Sequence[float], v: float) -> int | None:
    if not values or not values[0] <= v <= values[-1]:
        return None
    i = bisect.bisect_left(values, v)
    if i == 0:
        return 0
    lo, hi = values[i - 1], values[min(i, len(values) - 1)]
    return i - 1 if abs(math.log(v / lo)) <= abs(math.log(hi / v)) else min(i, len(values) - 1)


def lookup(table: dict[str, Any], desc: WorkloadDescription, objective: str) -> TableAnswer | None:
    """The table's answer for ``desc`` under ``objective`` (its ``describe()``), or None (see module)."""
    col = table["objectives"].get(objective)
    if col is None or desc.concurrency is not None:
        return None
    index, stride, point = 0, 1, {}
    for a in reversed(AXES):
        values = table["axes"][a]
        i = _nearest(values, float(getattr(desc, a)))
        if i is None:
            return None
        index += i * stride
        stride *= len(values)
        point[a] = values[i]
    mode = col["mode"][index]
    if mode < 0:
        return None
    return TableAnswer(table["modes"][mode], col["value"][index], col["default_value"][index],
                       {a: point[a] for a in AXES})

