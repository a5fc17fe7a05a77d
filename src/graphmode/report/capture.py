"""The report's capture-size section: per model shape, the capture sizes chosen for its tokens per engine step.

Each profiled cell records the step-size histogram of its window (``step_sizes``, see
:mod:`graphmode.profiling.features`). Per shape the cells' histograms are summed (step sizes follow the
traffic, not the mode) and :func:`graphmode.selector.capture.choose_capture_sizes` picks the sizes for vLLM's
default mode, priced by that shape's measured engine starts; where the dataset raced a list like the chosen
one, a note gives that race's verdicts. Rows from before step sizes were recorded give a note instead of a
row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphmode.core.dataset import ProfileStore, step_sizes_of
from graphmode.core.records import StepSizes
from graphmode.report.table import Table
from graphmode.selector.capture import CaptureAnswer, choose_capture_sizes
from graphmode.selector.capture_costs import costs_from_dataset, measured_kv_bytes_per_token
from graphmode.selector.capture_evidence import capture_evidence
from graphmode.selector.capture_steps import PAD_TOKEN_COST

DEFAULT_MODE = "FULL_AND_PIECEWISE"


@dataclass
class ShapeSteps:
    label: str
    path: Path
    config_hash: str | None
    steps: StepSizes
    cells: int
    answer: CaptureAnswer


def shape_label(row: dict[str, Any]) -> str:
    arch = row.get("fp_model_architecture") or "?"
    params = row.get("fp_num_params_b")
    return f"{arch} {params:.1f}B" if isinstance(params, int | float) else str(arch)


def add_steps(total: StepSizes | None, s: StepSizes) -> StepSizes | None:
    if total is None:
        return s.model_copy(deep=True)
    if total.le != s.le:
        return None  # cells with different bucket edges cannot be summed
    running = dict(total.running)
    for k, v in s.running.items():
        running[k] = running.get(k, 0) + v

    def plus(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a + b

    return StepSizes(le=total.le, steps=[a + b for a, b in zip(total.steps, s.steps, strict=True)],
                     running=running, decode_steps=plus(total.decode_steps, s.decode_steps),
                     mixed_steps=plus(total.mixed_steps, s.mixed_steps))


def shape_steps(datasets: Sequence[Path]) -> tuple[list[ShapeSteps], int]:
    """Summed step sizes and the capture answer per shape, and how many ok rows had no step sizes."""
    out: list[ShapeSteps] = []
    missing = 0
    for path in datasets:
        with ProfileStore(path, readonly=True) as store:
            rows = store.rows(status="ok")
        groups: dict[tuple[str, str | None], list[StepSizes]] = defaultdict(list)
        for r in rows:
            s = step_sizes_of(r)
            if s is None:
                missing += 1
                continue
            groups[(shape_label(r), r.get("fp_model_config_hash"))].append(s)
        for (label, chash), items in groups.items():
            total: StepSizes | None = None
            for s in items:
                total = add_steps(total, s)
                if total is None:
                    break
            if total is None:
                continue
            costs = costs_from_dataset(path, model_config_hash=chash)
            answer = choose_capture_sizes(total, mode=DEFAULT_MODE, costs=costs,
                                          kv_bytes_per_token=measured_kv_bytes_per_token(rows, chash))
            # what the dataset's races of capture lists measured for a list like this one, if any
            answer.evidence = capture_evidence([path], answer.sizes, model_config_hash=chash)
            if answer.evidence is not None:
                answer.notes.append(answer.evidence.note())
            out.append(ShapeSteps(label, path, chash, total, len(items), answer))
    return out, missing


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


@dataclass
class CaptureSection:
    """The capture-size section: a row of the table per shape, and its notes."""

    shapes: list[ShapeSteps]
    table: Table
    notes: list[str]
    missing: int


def section(datasets: Sequence[Path]) -> CaptureSection:
    """Per shape the chosen sizes against the default list, and the notes."""
    shapes, missing = shape_steps(datasets)
    rows = []
    for sh in shapes:
        a = sh.answer
        rows.append([sh.label, str(sh.cells), f"{a.steps_observed:,.0f}", ", ".join(map(str, a.sizes)),
                     str(len(a.default_sizes)), f"{_pct(a.chosen.graphed_share)} / {_pct(a.default.graphed_share)}",
                     f"{_num(a.chosen.padded_tokens_per_step, '{:.2f}')} / "
                     f"{_num(a.default.padded_tokens_per_step, '{:.2f}')}",
                     f"{_pct(a.chosen.padding_cost)} / {_pct(a.default.padding_cost)}",
                     f"{_num(a.chosen.capture_s, '{:.1f}')} / {_num(a.default.capture_s, '{:.1f}')}",
                     f"{_num(a.chosen.graph_gib, '{:.2f}')} / {_num(a.default.graph_gib, '{:.2f}')}",
                     _num(a.kv_tokens_gained, '{:,}')])
    table = Table.of(["shape", "cells", "steps", "chosen sizes", "default sizes", "replaying a graph, chosen / default",
                      "padding tokens/step", "step time padding adds (predicted)", "capture s (predicted)",
                      "graph GiB (predicted)", "KV cache tokens gained (predicted)"], rows)
    notes = [f"{sh.label}: {n}" for sh in shapes for n in sh.answer.notes]
    if shapes:
        basis = "; ".join(dict.fromkeys(sh.answer.costs_basis for sh in shapes))
        notes.append(f"Costs: {basis}. Step time padding adds: graphed steps' padded tokens at "
                     f"{PAD_TOKEN_COST:g} of a step per token (the lower of two H200 8B closed-loop fits). "
                     f"Mode {DEFAULT_MODE}; step sizes summed over every mode's cells of a shape.")
    if missing:
        notes.append(f"{missing} ok rows recorded no step sizes and are left out.")
    return CaptureSection(shapes, table, notes, missing)
