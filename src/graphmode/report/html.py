"""The report page: one self-contained HTML file, plotly.js inlined, every table written here."""

from __future__ import annotations

import datetime as _dt
import html
import math
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from graphmode import __version__
from graphmode.report.data import (
    DEFAULT,
    NOISE_METRICS,
    VIEWS,
    HeadlineRow,
    ParetoPoint,
    ReportData,
    ShapeView,
    coalesced_rule,
)
from graphmode.report.decision import DecisionMap, LoadedModel
from graphmode.report.figures import MODE_COLORS, MODE_SHORT
from graphmode.selector.paired import PAIRED_MARGIN, PAIRED_MIN_WORKLOADS, PairedVerdict, paired_verdicts

CV_NOISY = 0.10  # a repeat CV above this is highlighted in the noise table
PAIRED_METRICS = NOISE_METRICS


def esc(v: object) -> str:
    return html.escape(str(v), quote=True)


def pct(v: float | None, digits: int = 1, signed: bool = False) -> str:
    if v is None or not math.isfinite(v):
        return "–"
    return f"{v:+.{digits}f}%" if signed else f"{v:.{digits}f}%"


def _date(ts: float | None) -> str:
    if ts is None:
        return "?"
    return _dt.datetime.fromtimestamp(ts, tz=_dt.UTC).strftime("%Y-%m-%d %H:%M")


def _day(ts: float | None) -> str:
    return "?" if ts is None else _dt.datetime.fromtimestamp(ts, tz=_dt.UTC).strftime("%Y-%m-%d")


def _mode_head(mode: str) -> str:
    star = "<sup title='vLLM default'>default</sup>" if mode == DEFAULT else ""
    return (f"<th class='mode' title='{esc(mode)}'><span class='sw' style='background:{MODE_COLORS.get(mode, '#444')}'>"
            f"</span>{esc(MODE_SHORT.get(mode, mode))}{star}</th>")


def num(text: str, cls: str = "") -> str:
    """A right-aligned numeric cell."""
    return f"<td class='num{(' ' + cls) if cls else ''}'>{text}</td>"


def table(head: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "", raw_head: bool = False) -> str:
    """An HTML table; cells are already-escaped HTML."""
    h = "".join(x if raw_head else f"<th>{esc(x)}</th>" for x in head)
    body = "".join("<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class='{cls}'><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


# ---------------------------------------------------------------- header
def measured_facts(data: ReportData) -> str:
    parts = []
    for h in data.hosts:
        gpu = esc(h.gpu_name or "unknown GPU")
        mem = f" · {h.gpu_memory_gib:.0f} GiB" if h.gpu_memory_gib else ""
        n = f"{h.gpu_count}× " if h.gpu_count and h.gpu_count > 1 else ""
        parts.append(
            f"<span class='chip'><b>{n}{gpu}</b>{mem}</span>"
            f"<span class='chip'>driver {esc(h.driver_version or '?')} · CUDA {esc(h.cuda_version or '?')}</span>"
            f"<span class='chip'><b>vLLM {esc(h.vllm_version or '?')}</b> · torch {esc(h.torch_version or '?')}</span>"
        )
    first = min((s.first for s in data.shapes if s.first), default=None)
    last = max((s.last for s in data.shapes if s.last), default=None)
    n_w = sum(len(s.workloads) for s in data.shapes)
    parts.append(f"<span class='chip'>{len(data.shapes)} model shape{'s' if len(data.shapes) != 1 else ''} · "
                 f"{n_w} workloads · {len(data.modes)} modes</span>")
    failed = f" · <span class='bad'>{len(data.failed)} failed</span>" if data.failed else " · 0 failed"
    parts.append(f"<span class='chip'>{data.n_ok} ok cells{failed}</span>")
    parts.append(f"<span class='chip'>{_date(first)} → {_date(last)} UTC</span>")
    return "<div class='chips'>" + "".join(parts) + "</div>"


def shapes_table(data: ReportData) -> str:
    modes = data.modes
    head = ["<th>model shape</th>", "<th>attention · runner</th>", *[_mode_head(m) for m in modes],
            "<th>measured</th>"]
    rows = []
    for s in data.shapes:
        att = sorted({a for m in s.modes for a in s.attention.get(m, [])})
        run = sorted({a for m in s.modes for a in s.runner.get(m, [])})
        per_mode_att = {m: ", ".join(s.attention.get(m, [])) for m in s.modes}
        att_text = esc(", ".join(att) or "?")
        if len(set(per_mode_att.values())) > 1:
            att_text = "; ".join(f"{esc(MODE_SHORT.get(m, m))}: {esc(v or '?')}" for m, v in per_mode_att.items())
        cells = []
        for m in modes:
            if m not in s.ok_rows:
                cells.append("<td class='num muted'>–</td>")
                continue
            lo, hi = s.repeats[m]
            rep = f"{lo}" if lo == hi else f"{lo}–{hi}"
            fail = s.failed_rows.get(m, 0)
            f = f" <span class='bad'>+{fail}✗</span>" if fail else ""
            n_w = sum(1 for w in s.workloads if m in w.cells)
            cells.append(f"<td class='num' title='{s.ok_rows[m]} ok cells over {n_w} workloads, "
                         f"{rep} repeats each'><b>{s.ok_rows[m]}</b><span class='muted'> · {n_w}×{rep}</span>"
                         f"{f}</td>")
        rows.append([f"<td title='{esc(s.label)}'><b>{esc(s.short)}</b></td>",
                     f"{att_text} · {esc(', '.join(run) or '?')}", *cells,
                     f"<td class='nowrap'>{_day(s.first)}"
                     + ("" if _day(s.first) == _day(s.last) else f" → {_day(s.last)}") + "</td>"])
    return table(head, rows, "compact", raw_head=True)


def headline_table(rows: Sequence[HeadlineRow], modes: Sequence[str]) -> str:
    head = ["<th>model shape</th>", "<th>objective</th>", "<th class='num'>workloads</th>",
            *[_mode_head(m) for m in modes], "<th class='num' title='workloads whose best mode is within "
            "the noise of another'>ties</th>",
            "<th class='num'>default loss<br>median</th>", "<th class='num'>default loss<br>max</th>"]
    out = []
    for r in rows:
        view = VIEWS[r.metric]
        top = max(r.wins.values(), default=0)
        cells = []
        for m in modes:
            n = r.wins.get(m)
            if n is None:
                cells.append("<td class='num muted'>–</td>")
            elif n == top and n > 0:
                cells.append(f"<td class='num win' style='box-shadow: inset 0 -3px 0 {MODE_COLORS.get(m, '#444')}'>"
                             f"<b>{n}</b></td>")
            else:
                cells.append(f"<td class='num{' muted' if n == 0 else ''}'>{n}</td>")
        worst = (f"<td class='num' title='{esc(r.default_max_loss_workload)}'>{pct(r.default_max_loss_pct)}</td>"
                 if r.default_max_loss_workload else "<td class='num'>–</td>")
        better = "min" if view.direction == "min" else "max"
        out.append([f"<b>{esc(r.shape)}</b>", f"{better} {esc(view.label)}", num(f"{r.n}"), *cells,
                    num(f"{r.ties}"), num(f"{pct(r.default_median_loss_pct)}"),
                    worst])
    return table(head, out, "headline", raw_head=True)


def findings(rows: Sequence[HeadlineRow], saturated: Collection[tuple[str, str]] = (),
             paired: Sequence[PairedVerdict] = ()) -> str:
    """Per shape: on how many workloads the default is fine, and its worst case per latency objective;
    then every mode that beat the default on the same side in every paired round.

    A throughput worst case is named only on a ``saturated`` (shape, workload): elsewhere the engine
    delivers the offered load in every mode and the gap is which bursts the window caught."""
    items = []
    for shape in dict.fromkeys(r.shape for r in rows):
        mine = [r for r in rows if r.shape == shape]
        ok = " · ".join(f"{esc(VIEWS[r.metric].label)} <b>{r.default_ok}/{r.n}</b>" for r in mine)
        worst = []
        for r in mine:
            view = VIEWS[r.metric]
            if not (r.default_max_loss_pct and r.worst_best_mode) or (
                    view.direction == "max" and r.default_max_loss_pct < 5):
                continue
            if r.metric == "output_tok_s" and (r.shape, r.default_max_loss_workload) not in saturated:
                continue
            worst.append(f"{esc(view.label)} {pct(r.default_max_loss_pct)} worse on "
                         f"{esc(r.default_max_loss_workload)} ({esc(r.worst_best_mode)} {view.fmt(r.worst_best_value)}"
                         f" vs {view.fmt(r.worst_default_value)} {esc(view.unit)})")
        text = f"<b>{esc(shape)}</b> — default best or tied: {ok}."
        if worst:
            text += " Worst: " + "; ".join(worst) + "."
        wins = [v for v in paired if v.shape == shape and v.verdict == "lower"]
        if wins:
            text += " Paired inside rounds: " + "; ".join(
                f"{esc(v.mode)} {esc(VIEWS[v.metric].label)} "
                + "/".join(f"{x:.2f}×" for _, _, x in v.rounds)
                + f" the default's, lower in {len(v.rounds)} of {len(v.rounds)} rounds ("
                + ", ".join(str(n) for _, n, _ in v.rounds) + " workloads)" for v in wins) + "."
        items.append(f"<li>{text}</li>")
    return f"<ul class='findings'>{''.join(items)}</ul>" if items else ""


# ---------------------------------------------------------------- model / CV
def cv_tables(model: LoadedModel) -> str:
    cv = model.cv
    if cv.skipped:
        return f"<p class='note'>Cross-validation was skipped: {esc(cv.skipped)}</p>"
    head = ["objective", "n", "regret vs oracle (mean)", "median", "max", "correct", "gain vs default",
            "gain vs best static", "best static mode", "default's regret", "static's regret"]
    rows = []
    summaries = [*cv.summaries, *cv.shape_cv]
    for s in summaries:
        rows.append([esc(s.objective), num(f"{s.n}"),
                     num(f"{pct(s.mean_regret_pct)}"), num(f"{pct(s.median_regret_pct)}"),
                     num(f"{pct(s.max_regret_pct)}"), num(f"{pct(s.correct_pct, 0)}"),
                     num(f"{pct(s.mean_gain_vs_default_pct, signed=True)}"),
                     num(f"{pct(s.mean_gain_vs_static_pct, signed=True)}"), esc(s.static_mode or "–"),
                     num(f"{pct(s.default_regret_pct)}"),
                     num(f"{pct(s.static_regret_pct)}")])
    out = [f"<p>{esc(cv.scheme)}, {cv.folds} folds; regressors <b>{esc(cv.chosen_regressor)}</b>. "
           "Regret = how much worse the held-out choice is than the measured "
           "best (oracle); gain = how much better than always running vLLM's default / the best single static "
           f"mode (negative: worse). Source: <code>{esc(model.cv_source)}</code>.</p>",
           table(head, rows, "cv")]
    first = cv.summaries[0].objective if cv.summaries else None
    wl = [w for w in cv.workloads if w.objective == first]
    if wl:
        rows = [[esc(w.workload), esc(w.shape), esc(w.oracle),
                 esc(", ".join(m for m in w.ties if m != w.oracle) or "–"),
                 f"<td class='{'' if w.correct else 'badcell'}'>{esc(w.chosen or '–')}</td>",
                 num(f"{pct(w.regret_pct)}"),
                 num(f"{pct(w.gain_vs_default_pct, signed=True)}"),
                 num(f"{pct(w.gain_vs_static_pct, signed=True)}")] for w in wl]
        out.append(f"<details><summary>Per held-out workload ({esc(first)})</summary>"
                   + table(["held-out workload", "shape", "oracle", "tied with oracle", "chosen", "regret",
                            "vs default", "vs static"], rows, "cv") + "</details>")
    if cv.regressor_candidates:
        rows = [[esc(c.kind) + (" ◀" if c.kind == cv.chosen_regressor else ""), num(f"{pct(c.mean_regret_pct)}"),
                 num(f"{pct(c.max_regret_pct)}"), num(f"{pct(c.correct_pct, 0)}"),
                 num(f"{'–' if c.mean_log_rmse is None else f'{c.mean_log_rmse:.3f}'}")]
                for c in cv.regressor_candidates]
        out.append("<details><summary>Regressor candidates</summary>" + table(
            ["regressor", "mean regret", "max regret", "correct", "log-RMSE"], rows,
            "cv") + f"<p class='muted'>{esc(cv.reason)}</p></details>")
    return "".join(out)


# ---------------------------------------------------------------- noise
def start_table(data: ReportData, metric: str = "itl_p50") -> str:
    effects = data.start_effects(metric)
    if not effects:
        return ""
    head = ["model shape", "mode", "workloads", "later / first start (median)", "range", "later start slower",
            "CV over starts (median)"]
    rows = [[esc(e.shape), esc(e.mode), num(str(e.workloads)), num(f"{e.median_ratio:.2f}"),
             num(f"{e.min_ratio:.2f}–{e.max_ratio:.2f}"), num(f"{e.share_slower:.0%}"),
             num("–" if e.median_cv is None else f"{e.median_cv:.1%}")] for e in effects]
    return ("<h3>Between engine starts</h3><p>Each repeat is a fresh engine start. "
            f"{esc(VIEWS[metric].label)} of a later start against the first start of the same mode, over the "
            "workloads measured in both. When a start's ratio sits on the same side for most workloads, the "
            "start itself was slower or faster: that shift is shared by the cells of a start, so only more "
            "starts, not longer windows, narrow a comparison between modes.</p>" + table(head, rows))


def paired_table(data: ReportData) -> str:
    rounds = data.paired_rounds(PAIRED_METRICS)
    if not rounds:
        return ""
    head = ["model shape", "mode", "repeat", "GPU (or run)",
            *[f"{VIEWS[m].label}: mode / default (workloads)" for m in PAIRED_METRICS]]

    def cell(r: tuple[int, float] | None) -> str:
        return num("–") if r is None else num(f"{r[1]:.2f} ({r[0]})")

    rows = [[esc(p.shape), esc(p.mode), num(str(p.repeat)), esc(p.block),
             *[cell(p.ratios.get(m)) for m in PAIRED_METRICS]] for p in rounds]
    return ("<h3>Inside a round, on one GPU</h3><p>Each mode against vLLM's default where both were measured "
            "in the same round (repeat) on the same GPU: the median over those workloads of mode / default. "
            "Hosts differ in how fast they run vLLM's Python, and that moves every mode of a start; a ratio "
            "inside a round cancels it. A ratio on the same side of 1 in every round is a mode effect even "
            "where the spread over all starts (the ties above) calls it noise.</p>" + table(head, rows)
            + verdict_table(paired_verdicts(rounds, PAIRED_METRICS)))


def verdict_table(verdicts: Sequence[PairedVerdict]) -> str:
    if not verdicts:
        return ""
    head = ["model shape", "mode", "metric", "rounds (workloads)", "mode / default per round", "verdict"]
    rows = [[esc(v.shape), esc(v.mode), esc(VIEWS[v.metric].label),
             num(", ".join(f"r{rep} ({n})" for rep, n, _ in v.rounds)),
             num(" · ".join(f"{x:.2f}" for _, _, x in v.rounds)),
             f"<td class='{'verdict' if v.decisive else ''}'>{esc(v.verdict)}</td>"]
            for v in verdicts]
    return (f"<h3>Across rounds</h3><p>Per mode and metric, every paired round with at least "
            f"{PAIRED_MIN_WORKLOADS} workloads. <b>lower</b> / <b>higher</b>: beyond ±{PAIRED_MARGIN:.0%} of the "
            "default on the same side in every round (two rounds at least); <b>same</b>: within it in every "
            "round; <b>mixed</b>: rounds disagree, so one engine start's luck decides; <b>one round</b>: "
            "nothing to agree with yet. The selector's tie rule does not use this yet: it takes the spread "
            "over all starts, hosts included, and keeps the default.</p>" + table(head, rows))


def noise_table(data: ReportData) -> str:
    head_cells = ["<th>model shape</th>", "<th>workload</th>", "<th>metric</th>",
                  *[_mode_head(m) for m in data.modes], "<th>best mean</th>", "<th>tied within noise</th>"]
    rows = []
    for s in data.shapes:
        for w in s.workloads:
            for metric in NOISE_METRICS:
                if not any(metric in c.values for c in w.cells.values()):
                    continue
                cells = []
                for m in data.modes:
                    c = w.cells.get(m)
                    cv = c.cv(metric) if c else None
                    n = len(c.vals(metric)) if c else 0
                    if c is None or n == 0:
                        cells.append("<td class='num muted'>–</td>")
                    elif cv is None:
                        ci = c.ci_median(metric)
                        cells.append("<td class='num muted' title='one repeat'>n=1</td>" if ci is None else
                                     f"<td class='num muted' title='one repeat; 95% CI half-width within its "
                                     f"measurement window'>±{ci:.1%} CI</td>")
                    else:
                        cls = "num noisy" if cv > CV_NOISY else "num"
                        cells.append(f"<td class='{cls}' title='{n} repeats'>{cv:.1%}</td>")
                v = w.verdicts.get(metric)
                if v is None:
                    best, tie = "<td class='muted'>–</td>", "<td class='muted'>–</td>"
                else:
                    best = f"<td>{esc(v.best)}</td>"
                    tie = (f"<td class='tie'>TIE: {esc(', '.join(v.ties[1:]))}</td>" if v.tied
                           else "<td class='muted'>no</td>")
                rows.append([esc(s.short), esc(w.label), esc(VIEWS[metric].label), *cells, best, tie])
    return table(head_cells, rows, "noise", raw_head=True)


def constants_table(points: Sequence[ParetoPoint], data: ReportData) -> str:
    rows = []
    for s in data.shapes:
        for m in s.modes:
            p = next((q for q in points if q.shape == s.short and q.mode == m), None)
            c = s.constants.get(m, {})

            def f(v: float | None, fmt: str) -> str:
                return "–" if v is None else format(v, fmt)

            rel = [f"<td class='num'>{'–' if p is None or p.rel.get(k) is None else f'×{p.rel[k]:.2f}'}"
                   f"{' ★' if p is not None and p.pareto.get(k) else ''}</td>"
                   for k in ("itl_p50", "ttft_p50", "tpot_p50")]
            rows.append([esc(s.short), _mode_cell(m), num(f"{f(c.get('startup_s'), '.0f')}"),
                         num(f"{s.starts.get(m, 0)}"), num(f"{f(c.get('capture_s'), '.1f')}"),
                         num(f"{f(c.get('graph_gib'), '.2f')}"), *rel])
    return table(["model shape", "mode", "start-up s (mean)", "engine starts", "capture s", "graph GiB",
                  "ITL p50 vs best", "TTFT p50 vs best", "TPOT p50 vs best"], rows, "compact")


def _mode_cell(mode: str) -> str:
    return (f"<td><span class='sw' style='background:{MODE_COLORS.get(mode, '#444')}'></span>{esc(mode)}"
            f"{' <span class=muted>(default)</span>' if mode == DEFAULT else ''}</td>")


def failed_table(data: ReportData) -> str:
    if not data.failed:
        return "<p class='muted'>No failed cells.</p>"
    rows = [[esc(f.dataset), esc(f.shape), esc(f.mode), esc(f.workload), num(f"{f.repeat}"),
             esc(_date(f.started_at)), f"<td class='reason'>{esc(f.reason.splitlines()[0][:300])}</td>"]
            for f in data.failed]
    return table(["dataset", "shape", "mode", "workload", "repeat", "started (UTC)", "reason (first line)"], rows,
                 "compact")


# ---------------------------------------------------------------- page
def _fig_html(fig: Any, div_id: str) -> str:
    config = {"displaylogo": False, "responsive": True, "displayModeBar": False}
    return "<div class='fig'>" + str(fig.to_html(full_html=False, include_plotlyjs=False, config=config,
                                                div_id=div_id)) + "</div>"


def _environment() -> Any:
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("graphmode.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["mode_short"] = lambda m: MODE_SHORT.get(m, m)
    return env


def page(
    *,
    data: ReportData,
    headline: Sequence[HeadlineRow],
    bar_figures: Sequence[tuple[ShapeView, Any]],
    model: LoadedModel | None,
    maps: Sequence[DecisionMap],
    map_figure: Any | None,
    pareto_points: Sequence[ParetoPoint],
    pareto_fig: Any | None,
    plotly_js: str,
    notes: Sequence[str],
    title: str | None = None,
    generated: _dt.datetime | None = None,
) -> str:
    """The page (templates/report.html.j2) around the tables and figures built here."""
    from markupsafe import Markup

    hosts = data.hosts
    gpus = ", ".join(dict.fromkeys(h.gpu_name or "unknown GPU" for h in hosts))
    vllms = ", ".join(dict.fromkeys(h.vllm_version or "?" for h in hosts))
    delivered, saturated = data.saturation()
    verdicts = paired_verdicts(data.paired_rounds(PAIRED_METRICS), PAIRED_METRICS)
    noise_sources = [
        (s.short, "; ".join(f"{VIEWS[m].label} {s.ts.noise_cv[m]:.1%} ({s.ts.noise_source[m]})"
                            for m in NOISE_METRICS if m in s.ts.noise_cv))
        for s in data.shapes if s.ts is not None
    ]
    return str(_environment().get_template("report.html.j2").render(
        title=title or f"CUDA graph modes on {gpus} · vLLM {vllms}",
        plotly_js=Markup(plotly_js),
        datasets_text=", ".join(f"{s.path.name} ({s.n_ok} ok, {s.n_failed} failed)" for s in data.datasets),
        datasets=data.datasets,
        model=model,
        generated=(generated or _dt.datetime.now(_dt.UTC)).strftime("%Y-%m-%d %H:%M UTC"),
        facts=Markup(measured_facts(data)),
        headline=Markup(headline_table(headline, data.modes)) if headline else None,
        findings=Markup(findings(headline, {(sh, w) for sh, w, _ in saturated}, verdicts)),
        shapes=Markup(shapes_table(data)),
        default=DEFAULT,
        saturation=None if delivered is None else {"delivered": delivered, "cells": saturated},
        coalesced_rule=coalesced_rule(),
        dropped=data.itl_dropped(),
        notes=notes,
        max_repeats=data.max_repeats,
        bar_figures=[(shape.label, Markup(_fig_html(fig, f"fig-bars-{i}"))) for i, (shape, fig) in
                     enumerate(bar_figures)],
        map_figure=None if map_figure is None else Markup(_fig_html(map_figure, "fig-map")),
        map_notes=[n for dm in maps for n in dm.notes],
        pareto_figure=None if pareto_fig is None else Markup(_fig_html(pareto_fig, "fig-pareto")),
        constants=Markup(constants_table(pareto_points, data)),
        cv=Markup(cv_tables(model)) if model is not None else None,
        cv_noisy=CV_NOISY,
        noise_sources=noise_sources,
        start_table=Markup(start_table(data)),
        paired_table=Markup(paired_table(data)),
        noise_table=Markup(noise_table(data)),
        n_failed=len(data.failed),
        failed_table=Markup(failed_table(data)),
        version=__version__,
    ))
