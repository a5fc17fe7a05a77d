"""The report page: ``templates/report.html.j2`` rendered with autoescaping over the report's data.

Every table is a :class:`~graphmode.report.table.Table` rendered by the ``table`` macro; figures are plotly
``<div>``s without plotly.js, which the page loads once (inline, or from a file beside the page).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
from markupsafe import Markup

from graphmode import __version__
from graphmode.report import tables
from graphmode.report.analysis import coalesced_rule
from graphmode.report.capture import CaptureSection
from graphmode.report.decide import Release
from graphmode.report.decision import DecisionMap, LoadedModel
from graphmode.report.figures import MODE_SHORT
from graphmode.report.views import DEFAULT, NOISE_METRICS, VIEWS, HeadlineRow, ParetoPoint, ReportData
from graphmode.selector.paired import PAIRED_MARGIN, PAIRED_MIN_WORKLOADS, paired_verdicts


@dataclass(frozen=True)
class PlotlyJs:
    """How the page loads plotly.js: ``src`` (a file beside the page) or ``inline`` (the script itself)."""

    src: str | None = None
    inline: str | None = None


def fig_html(fig: Any, div_id: str) -> Markup:
    """A plotly figure as a ``<div>`` (plotly's own output: data as JSON, no plotly.js)."""
    config = {"displaylogo": False, "responsive": True, "displayModeBar": False}
    return Markup(fig.to_html(full_html=False, include_plotlyjs=False, config=config, div_id=div_id))


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("graphmode.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["mode_short"] = lambda m: MODE_SHORT.get(m, m)
    return env


def page(
    *,
    data: ReportData,
    headline: Sequence[HeadlineRow],
    releases: Sequence[Release],
    model: LoadedModel | None,
    maps: Sequence[DecisionMap],
    map_figure: Any | None,
    pareto_points: Sequence[ParetoPoint],
    pareto_fig: Any | None,
    capture: CaptureSection,
    plotly: PlotlyJs,
    notes: Sequence[str],
    title: str | None = None,
    generated: _dt.datetime | None = None,
) -> str:
    """The whole page."""
    hosts = data.hosts
    gpus = ", ".join(dict.fromkeys(h.gpu_name or "unknown GPU" for h in hosts))
    vllms = ", ".join(dict.fromkeys(h.vllm_version or "?" for h in hosts))
    delivered, saturated = data.saturation()
    rounds = data.paired_rounds(tables.PAIRED_METRICS)
    verdicts = paired_verdicts(rounds, tables.PAIRED_METRICS)
    noise_sources = [
        (s.short, "; ".join(f"{VIEWS[m].label} {s.ts.noise_cv[m]:.1%} ({s.ts.noise_source[m]})"
                            for m in NOISE_METRICS if m in s.ts.noise_cv))
        for s in data.shapes if s.ts is not None
    ]
    return str(environment().get_template("report.html.j2").render(
        title=title or f"CUDA graph modes on {gpus} · vLLM {vllms}",
        plotly=plotly,
        datasets_text=", ".join(f"{s.path.name} ({s.n_ok} ok, {s.n_failed} failed)" for s in data.datasets),
        datasets=data.datasets,
        model=model,
        generated=(generated or _dt.datetime.now(_dt.UTC)).strftime("%Y-%m-%d %H:%M UTC"),
        chips=tables.chips(data),
        releases=releases,
        headline=tables.headline_table(headline, data.modes) if headline else None,
        findings=tables.findings(headline, {(sh, w) for sh, w, _ in saturated}, verdicts),
        shapes=tables.shapes_table(data),
        default=DEFAULT,
        saturation=None if delivered is None else {"delivered": delivered, "cells": saturated},
        coalesced_rule=coalesced_rule(),
        dropped=data.itl_dropped(),
        notes=notes,
        max_repeats=data.max_repeats,
        map_figure=None if map_figure is None else fig_html(map_figure, "fig-map"),
        map_notes=[n for dm in maps for n in dm.notes],
        pareto_figure=None if pareto_fig is None else fig_html(pareto_fig, "fig-pareto"),
        constants=tables.constants_table(pareto_points, data),
        cv=tables.cv_table(model) if model is not None and not model.cv.skipped else None,
        cv_workloads=tables.cv_workload_table(model) if model is not None else None,
        cv_regressors=tables.regressor_table(model) if model is not None else None,
        cv_noisy=tables.CV_NOISY,
        noise_sources=noise_sources,
        start_table=tables.start_table(data),
        paired_table=tables.paired_table(data),
        paired_verdicts=tables.paired_verdict_table(verdicts),
        paired_margin=PAIRED_MARGIN,
        paired_min_workloads=PAIRED_MIN_WORKLOADS,
        noise_table=tables.noise_table(data),
        capture=capture,
        n_failed=len(data.failed),
        failed_table=tables.failed_table(data),
        version=__version__,
    ))
