"""The report's plotly figures. plotly is imported on first use: only ``graphmode report`` needs it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from graphmode.core.errors import GraphmodeError
from graphmode.core.modes import ALL_MODES
from graphmode.report.decision import DecisionMap, MeasuredPoint
from graphmode.report.views import (
    DEFAULT,
    PARETO_METRICS,
    VIEWS,
    ParetoPoint,
)

MODE_COLORS: dict[str, str] = {
    "NONE": "#8c8c8c",
    "PIECEWISE": "#f28e2b",
    "FULL": "#4e79a7",
    "FULL_DECODE_ONLY": "#59a14f",
    "FULL_AND_PIECEWISE": "#d6455a",
}
MODE_SHORT: dict[str, str] = {
    "NONE": "NONE",
    "PIECEWISE": "PW",
    "FULL": "FULL",
    "FULL_DECODE_ONLY": "FDO",
    "FULL_AND_PIECEWISE": "F&P",
}
SHAPE_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "pentagon", "hexagon")
FONT = "Inter, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"


def plotly_modules() -> tuple[Any, Any]:
    """(plotly.graph_objects, plotly.subplots.make_subplots); a clear error when plotly is missing."""
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError:
        raise GraphmodeError(
            "graphmode report needs plotly: pip install 'graphmode[report]' (or pip install plotly)"
        ) from None
    return go, make_subplots


def color(mode: str) -> str:
    return MODE_COLORS.get(mode, "#444444")


def _mode_label(mode: str) -> str:
    return f"{mode} (default)" if mode == DEFAULT else mode


def _frame(fig: Any, *, plot_height: int, menu: bool, titles: bool = True, legend_row: bool = True) -> float:
    """Common style and the space above the plot: from the top, the buttons row (``menu``), the legend
    row and the first row's subplot titles. Titles live in the HTML around the figure. Returns the
    paper y of the buttons row."""
    title_px = 24 if titles else 6
    legend_px = 28 if legend_row else 0
    menu_px = 38 if menu else 0
    top, bottom = title_px + legend_px + menu_px + 4, 40
    fig.update_layout(
        height=plot_height + top + bottom,
        font={"family": FONT, "size": 11, "color": "#222"},
        paper_bgcolor="white",
        plot_bgcolor="#fafafa",
        margin={"l": 60, "r": 20, "t": top, "b": bottom},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0 + title_px / plot_height, "xanchor": "left",
                "x": 0.0, "font": {"size": 11}},
        hoverlabel={"font": {"family": FONT, "size": 11}},
    )
    return 1.0 + (title_px + legend_px) / plot_height


def _menu(buttons: list[dict[str, Any]], y: float) -> dict[str, Any]:
    return {"type": "buttons", "direction": "right", "buttons": buttons, "showactive": True,
            "x": 0.0, "xanchor": "left", "y": y, "yanchor": "bottom", "pad": {"t": 0, "b": 0, "l": 0},
            "font": {"size": 11}, "bgcolor": "#f3f4f6", "bordercolor": "#d1d5db", "active": 0}


def decision_figure(maps: Sequence[DecisionMap], modes: Sequence[str] | None = None) -> Any:
    """The model's chosen mode over rate × ratio (heatmap), measured winners on top; menu per shape."""
    go, make_subplots = plotly_modules()
    modes = list(modes or [m.value for m in ALL_MODES])
    metrics = list(dict.fromkeys(m for dm in maps for m in dm.metrics))
    bursts = sorted({b for dm in maps for b in dm.burstiness}, reverse=True)
    rows, cols = len(metrics), len(bursts)
    titles = [f"{VIEWS[m].label} · burstiness {b:g}{' (Poisson)' if b == 1 else ' (bursty)' if b < 1 else ''}"
              for m in metrics for b in bursts]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.06,
                        vertical_spacing=0.12 if rows > 1 else 0.1, shared_xaxes=False)
    n = len(modes)
    scale: list[list[Any]] = []
    for i, m in enumerate(modes):
        scale += [[i / n, color(m)], [(i + 1) / n, color(m)]]
    per_shape: list[list[int]] = []
    count = 0
    for s, dm in enumerate(maps):
        idx: list[int] = []
        for r, metric in enumerate(metrics, start=1):
            for c, b in enumerate(bursts, start=1):
                grid = dm.choice.get((metric, b))
                if grid is None:
                    continue
                z = [[(modes.index(x) if x in modes else None) for x in row] for row in grid]
                text = [[f"{x or 'no answer'}<br>{inp:.0f} → {out:.0f} tokens" for x in row]
                        for row, (inp, out) in zip(grid, dm.tokens, strict=True)]
                fig.add_trace(go.Heatmap(
                    x=dm.rates, y=dm.ratios, z=z, text=text, zmin=-0.5, zmax=n - 0.5, colorscale=scale,
                    showscale=False, opacity=0.55, visible=s == 0, xgap=0, ygap=0,
                    hovertemplate=("model's choice: %{text}<br>rate %{x:.2f} req/s · prefill/decode %{y:.2f}"
                                   f" · burstiness {b:g}<extra>{dm.shape_label}</extra>"),
                ), row=r, col=c)
                idx.append(count)
                count += 1
                pts = [p for p in dm.measured if p.burstiness == b and metric in p.winner]
                for mode in modes:
                    mine = [p for p in pts if p.winner[metric] == mode]
                    if not mine:
                        continue
                    fig.add_trace(go.Scatter(
                        x=[p.rate for p in mine], y=[p.ratio for p in mine], mode="markers",
                        marker={"color": color(mode), "size": 13,
                                "symbol": ["diamond" if len(p.ties[metric]) > 1 else "circle" for p in mine],
                                "line": {"color": "#111", "width": 1.8}},
                        name=_mode_label(mode), legendgroup=mode, showlegend=False, visible=s == 0,
                        hovertemplate=[_point_hover(p, metric) for p in mine],
                    ), row=r, col=c)
                    idx.append(count)
                    count += 1
        per_shape.append(idx)
    # legend: the mode colours, and what the markers mean (always visible)
    for mode in modes:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=_mode_label(mode), legendgroup=mode,
                                 marker={"color": color(mode), "size": 12, "symbol": "square"}), row=1, col=1)
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="measured winner",
                             marker={"color": "#fff", "size": 11, "symbol": "circle",
                                     "line": {"color": "#111", "width": 1.8}}), row=1, col=1)
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="measured winner, tied within noise",
                             marker={"color": "#fff", "size": 11, "symbol": "diamond",
                                     "line": {"color": "#111", "width": 1.8}}), row=1, col=1)
    always = list(range(count, count + n + 2))
    fig.update_xaxes(type="log", title={"text": "arrival rate (req/s)", "font": {"size": 10}}, showgrid=False,
                     tickvals=_ticks([r for dm in maps for r in dm.rates]))
    fig.update_yaxes(type="log", title={"text": "prefill/decode token ratio", "font": {"size": 10}}, showgrid=False,
                     tickvals=_ticks([r for dm in maps for r in dm.ratios]))
    menu_y = _frame(fig, plot_height=320 * rows - 40, menu=len(maps) > 1)
    for a in fig.layout.annotations:
        a.font = {"size": 12, "color": "#333"}
    if len(maps) > 1:
        buttons = []
        for s, dm in enumerate(maps):
            vis = [False] * (count + n + 2)
            for i in per_shape[s] + always:
                vis[i] = True
            buttons.append({"label": dm.shape_label, "method": "update", "args": [{"visible": vis}, {}]})
        fig.update_layout(updatemenus=[_menu(buttons, menu_y)])
    return fig


def _ticks(values: Sequence[float]) -> list[float]:
    """1-2-5 ticks inside the range of ``values`` (log axes)."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    out = []
    for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            v = m * 10.0**e
            if lo <= v <= hi:
                out.append(v)
    return out


def _point_hover(p: MeasuredPoint, metric: str) -> str:
    win = p.winner[metric]
    ties = [m for m in p.ties[metric] if m != win]
    pred = p.predicted.get(metric)
    agree = "agrees" if pred == win or pred in p.ties[metric] else "differs"
    return (f"<b>{p.workload}</b><br>measured best {VIEWS[metric].label}: {win}"
            + (f" (tied with {', '.join(ties)})" if ties else "")
            + f"<br>model at the observed features: {pred or '–'} ({agree})"
            + f"<br>observed rate {p.rate:.2f} req/s · prefill/decode {p.ratio:.2f}<extra></extra>")


# ---------------------------------------------------------------- Pareto
def pareto_figure(points: Sequence[ParetoPoint], metrics: Sequence[str] = PARETO_METRICS) -> Any:
    """Relative latency vs CUDA graph memory, marker size = start-up time; Pareto front marked."""
    go, _ = plotly_modules()
    metrics = [m for m in metrics if any(p.rel.get(m) is not None for p in points)]
    shapes = list(dict.fromkeys(p.shape for p in points))
    starts = [p.startup_s for p in points if p.startup_s is not None]
    smax = max(starts) if starts else 1.0
    fig = go.Figure()
    vis: dict[str, list[bool]] = {m: [] for m in metrics}
    for k, metric in enumerate(metrics):
        shown = [p for p in points if p.rel.get(metric) is not None and p.graph_gib is not None]
        where = dict(zip((id(p) for p in shown), _label_positions(shown, metric), strict=True))
        for si, shape in enumerate(shapes):
            pts = [p for p in shown if p.shape == shape]
            if not pts:
                continue
            front = sorted((p for p in pts if p.pareto.get(metric)), key=lambda p: p.graph_gib or 0.0)
            fig.add_trace(go.Scatter(
                x=[p.graph_gib for p in front], y=[p.rel[metric] for p in front], mode="lines",
                line={"color": "#111", "width": 1.2, "dash": "dot"}, name=f"Pareto front · {shape}",
                legendgroup=f"shape{si}", visible=k == 0, hoverinfo="skip", showlegend=False,
            ))
            fig.add_trace(go.Scatter(
                x=[p.graph_gib for p in pts], y=[p.rel[metric] for p in pts], mode="markers+text",
                text=[f"{MODE_SHORT.get(p.mode, p.mode)}{' ★' if p.pareto.get(metric) else ''}" for p in pts],
                textposition=[where[id(p)] for p in pts], textfont={"size": 11},
                marker={"color": [color(p.mode) for p in pts],
                        "size": [14 + 26 * ((p.startup_s or 0.0) / smax) for p in pts],
                        "symbol": SHAPE_SYMBOLS[si % len(SHAPE_SYMBOLS)],
                        "line": {"color": ["#111" if p.pareto.get(metric) else "#fff" for p in pts],
                                 "width": [2.5 if p.pareto.get(metric) else 1 for p in pts]},
                        "opacity": 0.9},
                name=shape, legendgroup=f"shape{si}", visible=k == 0, showlegend=False,
                hovertemplate=[_pareto_hover(p, metric) for p in pts],
            ))
            for mm in metrics:
                vis[mm] += [mm == metric, mm == metric]
    # legend (always shown): the shapes' symbols, the front line, the mode colours
    for si, shape in enumerate(shapes):
        if len(shapes) > 1:
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=shape, legendgroup=f"shape{si}",
                                     marker={"color": "#bbb", "size": 12, "symbol": SHAPE_SYMBOLS[si % 6],
                                             "line": {"color": "#555", "width": 1}}))
            for mm in metrics:
                vis[mm].append(True)
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="Pareto front (per shape)",
                             line={"color": "#111", "width": 1.2, "dash": "dot"}))
    for mode in dict.fromkeys(p.mode for p in points):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=_mode_label(mode),
                                 marker={"color": color(mode), "size": 11, "symbol": "square"}))
    for mm in metrics:
        vis[mm] += [True] * (1 + len(dict.fromkeys(p.mode for p in points)))
    gmax = max((p.graph_gib for p in points if p.graph_gib is not None), default=1.0) or 1.0
    fig.update_xaxes(title={"text": "CUDA graph memory (GiB, from vLLM's capture log)"},
                     range=[-0.07 * gmax, 1.1 * gmax], gridcolor="#e5e5e5", zeroline=False)
    fig.update_yaxes(gridcolor="#e5e5e5")
    menu_y = _frame(fig, plot_height=440, menu=len(metrics) > 1, titles=False, legend_row=False)
    # many entries (shapes, front, modes): a column on the right instead of a row above the plot
    fig.update_layout(yaxis_title=_pareto_y(metrics[0]) if metrics else "",
                      legend={"orientation": "v", "x": 1.01, "xanchor": "left", "y": 1.0, "yanchor": "top"},
                      margin={"r": 240})
    if len(metrics) > 1:
        fig.update_layout(updatemenus=[_menu(
            [{"label": VIEWS[m].label, "method": "update",
              "args": [{"visible": vis[m]}, {"yaxis.title.text": _pareto_y(m)}]} for m in metrics], menu_y)])
    return fig


def _label_positions(pts: Sequence[ParetoPoint], metric: str) -> list[str]:
    """Text positions that keep labels of points at (nearly) the same place apart."""
    cycle = ("top center", "bottom center", "middle right", "middle left")
    out: list[str] = []
    placed: list[tuple[float, float]] = []
    gmax = max((p.graph_gib or 0.0 for p in pts), default=0.0) or 1.0
    ys = [p.rel.get(metric) or 0.0 for p in pts]
    yspan = (max(ys) - min(ys)) if ys else 1.0
    for p in pts:
        x, y = p.graph_gib or 0.0, p.rel.get(metric) or 0.0
        near = sum(1 for (a, b) in placed if abs(a - x) <= 0.04 * gmax and abs(b - y) <= 0.06 * (yspan or 1.0))
        out.append(cycle[near % len(cycle)])
        placed.append((x, y))
    return out


def _pareto_y(metric: str) -> str:
    return f"{VIEWS[metric].label}: median over workloads of mode / best (×)"


def _pareto_hover(p: ParetoPoint, metric: str) -> str:
    def f(v: float | None, fmt: str) -> str:
        return "–" if v is None or not math.isfinite(v) else format(v, fmt)

    return (f"<b>{_mode_label(p.mode)}</b> · {p.shape}<br>{VIEWS[metric].label}: ×{f(p.rel.get(metric), '.3f')} "
            f"the per-workload best (median over {p.n.get(metric, 0)} workloads)"
            f"<br>graph memory {f(p.graph_gib, '.2f')} GiB · capture {f(p.capture_s, '.1f')} s"
            f"<br>start-up {f(p.startup_s, '.0f')} s (mean over engine starts)"
            f"<br>Pareto-optimal: {'yes' if p.pareto.get(metric) else 'no'} (latency, memory); "
            f"{'yes' if p.pareto3.get(metric) else 'no'} with start-up as a third axis<extra></extra>")
