"""How much speculative decoding's drafts were accepted in the measurements behind a shape's answers.

A race with speculative decoding measures the steps its drafts made: with dummy weights an EAGLE draft is
never accepted (the H200's 8B EAGLE race, 2026-12-03: 0% of drafts, 1.00 tokens per verification step in
all 20 cells) and a greedy ngram proposer always is (100%, 1+k). A deployment's real draft sits elsewhere,
so the answer says what was measured beside what the deployment's own ``/metrics`` shows, when it does.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from graphmode.selector.featurize import shape_key, shape_of_row

__all__ = ["SpecDecodeMeasured", "spec_decode_by_shape", "spec_decode_note"]


class SpecDecodeMeasured(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    acceptance_rate: float | None = Field(None, description="mean share of draft tokens accepted over the cells")
    accept_length: float | None = Field(None, description="mean tokens per verification step (1 + accepted)")
    cells: int = Field(ge=0, description="ok cells with speculative decoding counters")


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def spec_decode_by_shape(rows: Iterable[Mapping[str, Any]]) -> dict[str, SpecDecodeMeasured]:
    """Shape key -> what the ok cells with speculative decoding counters measured, for shapes that have any."""
    rates: dict[str, list[float]] = defaultdict(list)
    lengths: dict[str, list[float]] = defaultdict(list)
    cells: dict[str, int] = defaultdict(int)
    for r in rows:
        if r.get("status") != "ok":
            continue
        rate, length = _num(r.get("obs_spec_acceptance_rate")), _num(r.get("obs_spec_accept_length"))
        if rate is None and length is None:
            continue
        key = shape_key(shape_of_row(r))
        cells[key] += 1
        if rate is not None:
            rates[key].append(rate)
        if length is not None:
            lengths[key].append(length)
    return {k: SpecDecodeMeasured(
        acceptance_rate=round(sum(rates[k]) / len(rates[k]), 4) if rates[k] else None,
        accept_length=round(sum(lengths[k]) / len(lengths[k]), 3) if lengths[k] else None,
        cells=n) for k, n in sorted(cells.items())}


def spec_decode_note(measured: SpecDecodeMeasured, observed_rate: float | None = None) -> str:
    """The answer's note: what the measurements' drafts did, and the deployment's own rate when known."""
    bits = []
    if measured.acceptance_rate is not None:
        bits.append(f"drafts {measured.acceptance_rate * 100:.0f}% accepted")
    if measured.accept_length is not None:
        bits.append(f"{measured.accept_length:.2f} tokens per verification step")
    text = (f"speculative decoding in the measurements of this configuration: {', '.join(bits)} "
            f"(mean over {measured.cells} cells)")
    if observed_rate is not None and math.isfinite(observed_rate):
        text += f"; this deployment's drafts: {observed_rate * 100:.0f}% accepted"
        if measured.acceptance_rate is not None and abs(observed_rate - measured.acceptance_rate) > 0.2:
            text += ", unlike the measurements: the verdicts hold for the step shapes, not this acceptance"
    elif measured.acceptance_rate is not None and (measured.acceptance_rate < 0.05 or measured.acceptance_rate > 0.95):
        text += ": a real draft's acceptance lies between, so the latencies transfer with caution"
    return text
