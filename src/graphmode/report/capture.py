"""The report's capture-size section: tokens per engine step per model shape, with the chosen sizes marked.

Each profiled cell records the step-size histogram of its window (``step_sizes``, see
:mod:`graphmode.profiling.features`). Per shape the cells' histograms are summed (step sizes follow the
traffic, not the mode) and :func:`graphmode.selector.capture.choose_capture_sizes` picks the sizes for vLLM's
default mode, priced by that shape's measured engine starts; where the dataset raced a list like the chosen
one, a note gives that race's verdicts. Rows from before step sizes were recorded give a note instead of a
figure.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphmode.core.dataset import ProfileStore, step_sizes_of
from graphmode.core.records import StepSizes
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


def figure(shape: ShapeSteps) -> Any:
    """Steps per histogram bucket (log token axis), chosen sizes as green lines, the default's largest dashed."""
    import plotly.graph_objects as go

    s = shape.steps
    lowers = [0.0, *s.le]
    x = [f"≤{int(e)}" if i == 0 else f"{int(lowers[i]) + 1}–{int(e)}" for i, e in enumerate(s.le)]
    x.append(f">{int(s.le[-1])}" if s.le else "all")
    fig = go.Figure(go.Bar(x=x, y=s.steps, marker_color="#64748b", name="steps",
                           hovertemplate="%{x} tokens: %{y:,.0f} steps<extra></extra>"))

    def bucket_of(size: int) -> int:
        return next((i for i, e in enumerate(s.le) if size <= e), len(s.le))

    marked: dict[int, list[int]] = defaultdict(list)
    for size in shape.answer.sizes:
        marked[bucket_of(size)].append(size)
    for i, sizes in marked.items():
        fig.add_annotation(x=x[i], y=s.steps[i], text="▲ " + ", ".join(map(str, sizes)), showarrow=False,
                           yshift=12, font={"color": "#15803d", "size": 11})
    top = shape.answer.default_sizes[-1]
    fig.add_annotation(x=x[bucket_of(top)], y=0, text=f"default max {top}", showarrow=True, arrowhead=2, ay=-40,
                       font={"color": "#6b7280", "size": 10})
    fig.update_layout(height=260, margin={"l": 50, "r": 10, "t": 24, "b": 40}, showlegend=False,
                      title={"text": f"{shape.label}: tokens per engine step, chosen sizes ▲", "font": {"size": 12}},
                      xaxis_title="tokens per step (vllm:iteration_tokens_total bucket)", yaxis_title="steps")
    return fig


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def fig_html(fig: Any, div_id: str) -> str:
    config = {"displaylogo": False, "responsive": True, "displayModeBar": False}
    return "<div class='fig'>" + str(fig.to_html(full_html=False, include_plotlyjs=False, config=config,
                                                div_id=div_id)) + "</div>"


def insert_section(page: str, datasets: Sequence[Path]) -> str:
    """``page`` with the section before its footer (or at the end of ``<main>``, or of the text)."""
    sec = section(datasets)
    for anchor in ("<footer", "</main>"):
        at = page.rfind(anchor)
        if at >= 0:
            return page[:at] + sec + page[at:]
    return page + sec


def section(datasets: Sequence[Path]) -> str:
    """The section's HTML: per shape the step histogram with the chosen sizes marked, and a table."""
    shapes, missing = shape_steps(datasets)
    parts = ["<section id='capture'><h3>Capture sizes <span class='muted' style='font-weight:400'>— tokens per "
             "engine step and the <code>cudagraph_capture_sizes</code> chosen for them, against vLLM's default "
             "list</span></h3>"]
    if not shapes:
        parts.append(f"<p class='note'>No cell recorded its step sizes ({missing} ok rows from before graphmode "
                     "recorded them): profile again to see this section.</p></section>")
        return "".join(parts)
    rows = []
    for i, sh in enumerate(shapes):
        a = sh.answer
        parts.append(fig_html(figure(sh), f"capture-{i}"))
        rows.append(
            f"<tr><td>{html.escape(sh.label)}</td><td>{sh.cells}</td><td>{a.steps_observed:,.0f}</td>"
            f"<td>{html.escape(', '.join(map(str, a.sizes)))}</td><td>{len(a.default_sizes)}</td>"
            f"<td>{_pct(a.chosen.graphed_share)} / {_pct(a.default.graphed_share)}</td>"
            f"<td>{_num(a.chosen.padded_tokens_per_step, '{:.2f}')} / "
            f"{_num(a.default.padded_tokens_per_step, '{:.2f}')}</td>"
            f"<td>{_pct(a.chosen.padding_cost)} / {_pct(a.default.padding_cost)}</td>"
            f"<td>{_num(a.chosen.capture_s, '{:.1f}')} / {_num(a.default.capture_s, '{:.1f}')}</td>"
            f"<td>{_num(a.chosen.graph_gib, '{:.2f}')} / {_num(a.default.graph_gib, '{:.2f}')}</td>"
            f"<td>{_num(a.kv_tokens_gained, '{:,}')}</td></tr>")
    parts.append("<table><tr><th>shape</th><th>cells</th><th>steps</th><th>chosen sizes</th><th>default sizes</th>"
                 "<th>replaying a graph, chosen / default</th><th>padding tokens/step</th>"
                 "<th>step time padding adds (predicted)</th>"
                 "<th>capture s (predicted)</th><th>graph GiB (predicted)</th>"
                 "<th>KV cache tokens gained (predicted)</th></tr>" + "".join(rows) + "</table>")
    notes = [f"{html.escape(sh.label)}: {html.escape(n)}" for sh in shapes for n in sh.answer.notes]
    basis = "; ".join(dict.fromkeys(html.escape(sh.answer.costs_basis) for sh in shapes))
    notes.append(f"Costs: {basis}. Step time padding adds: graphed steps' padded tokens at "
                 f"{PAD_TOKEN_COST:g} of a step per token (the lower of two H200 8B closed-loop fits). "
                 f"Mode {DEFAULT_MODE}; step sizes summed over every mode's cells of a shape.")
    if missing:
        notes.append(f"{missing} ok rows recorded no step sizes and are left out.")
    parts.append("<ul class='notes'>" + "".join(f"<li>{n}</li>" for n in notes) + "</ul></section>")
    return "".join(parts)
