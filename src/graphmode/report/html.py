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
CSS = """
:root { --ink:#1f2328; --muted:#6b7280; --line:#e5e7eb; --bg:#ffffff; --accent:#2563eb; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
  font: 13px/1.45 Inter, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; }
main { max-width: 1400px; margin: 0 auto; padding: 14px 28px 40px; }
header h1 { font-size: 22px; margin: 0 0 2px; letter-spacing: -0.01em; }
header .sub { color: var(--muted); margin: 0 0 8px; }
.chips { display:flex; flex-wrap:wrap; gap:6px; margin: 6px 0 10px; }
.chip { background:#f3f4f6; border:1px solid var(--line); border-radius: 999px; padding: 2px 10px; font-size: 12px; }
.top { display:grid; grid-template-columns: minmax(0, 1.2fr) minmax(0, 1fr); gap: 22px; align-items:start;
  margin-top: 6px; }
.top.first { grid-template-columns: max-content minmax(0, 1fr); }
.caption { color: #374151; margin: 2px 0 4px; max-width: 1200px; }
h2 { font-size: 17px; margin: 26px 0 6px; padding-top: 8px; border-top: 1px solid var(--line); }
h3 { font-size: 14px; margin: 14px 0 4px; }
.top h3 { margin-top: 2px; }
table { border-collapse: collapse; width: 100%; font-size: 12px; }
th, td { padding: 3px 7px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { background: #f9fafb; font-weight: 600; color: #374151; white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
th.mode { text-align: right; }
th.mode sup { font-weight: 400; color: var(--muted); margin-left: 2px; }
.sw { display:inline-block; width:9px; height:9px; border-radius:2px; margin-right:4px; vertical-align: baseline; }
.muted { color: var(--muted); }
.nowrap { white-space: nowrap; }
.bad, .badcell { color: #b91c1c; }
td.win { background: #fbfbfd; }
td.noisy { background: #fef3c7; }
td.tie { color: #92400e; font-weight: 600; }
td.verdict { font-weight: 600; }
td.reason { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 11px; }
.headline td, .headline th { padding: 4px 9px; white-space: nowrap; }
.findings { margin: 0; padding-left: 18px; font-size: 12.5px; }
.findings li { margin: 3px 0; }
.note { background:#f8fafc; border-left: 3px solid #94a3b8; padding: 6px 10px; margin: 8px 0; color:#334155; }
.notes { margin: 6px 0 0; padding-left: 18px; color: #374151; font-size: 12px; }
.notes li { margin: 1px 0; }
details { margin: 8px 0; }
summary { cursor: pointer; color: var(--accent); }
.scroll { max-height: 560px; overflow: auto; border: 1px solid var(--line); }
.scroll table th { position: sticky; top: 0; z-index: 1; }
.fig { margin: 4px 0 6px; }
code { font-size: 12px; background: #f3f4f6; padding: 0 3px; border-radius: 3px; }
footer { color: var(--muted); font-size: 11px; margin-top: 30px; }
"""


def _fig_html(fig: Any, div_id: str) -> str:
    config = {"displaylogo": False, "responsive": True, "displayModeBar": False}
    return "<div class='fig'>" + str(fig.to_html(full_html=False, include_plotlyjs=False, config=config,
                                                div_id=div_id)) + "</div>"


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
    hosts = data.hosts
    gpus = ", ".join(dict.fromkeys(h.gpu_name or "unknown GPU" for h in hosts))
    vllms = ", ".join(dict.fromkeys(h.vllm_version or "?" for h in hosts))
    title = title or f"CUDA graph modes on {gpus} · vLLM {vllms}"
    when = (generated or _dt.datetime.now(_dt.UTC)).strftime("%Y-%m-%d %H:%M UTC")
    ds = ", ".join(f"{s.path.name} ({s.n_ok} ok, {s.n_failed} failed)" for s in data.datasets)
    model_txt = (f"model <code>{esc(model.model_id)}</code> ({model.card.dataset.rows_used} rows, "
                 f"{esc(model.card.regressor_kind)} regressors)" if model else "no model")
    repeats_note = ("" if data.max_repeats >= 2 else
                    "<li>Every cell was measured once: no error bars, no coefficient of variation; ties use the "
                    "assumed noise (selector/aggregate.py).</li>")
    note_items = "".join(f"<li>{esc(n)}</li>" for n in notes) + repeats_note
    dropped = data.itl_dropped()
    if dropped:
        lst = ", ".join(f"{esc(w)} {esc(MODE_SHORT.get(m, m))}" for _, w, m, _, _ in dropped[:8])
        more = f" and {len(dropped) - 8} more" if len(dropped) > 8 else ""
        dropped_note = f"<li>{esc(coalesced_rule())}: ITL dropped in {len(dropped)} cells ({lst}{more}).</li>"
    else:
        dropped_note = f"<li>{esc(coalesced_rule())}: no cell affected.</li>"
    median_delivered, saturated = data.saturation()
    saturated_keys = {(sh, w) for sh, w, _ in saturated}
    if median_delivered is None:
        saturation_note = ""
    else:
        sat = "; ".join(f"{esc(sh)} {esc(w)} ({', '.join(esc(MODE_SHORT.get(m, m)) for m in ms)})"
                        for sh, w, ms in saturated[:8])
        more = f" and {len(saturated) - 8} more" if len(saturated) > 8 else ""
        saturation_note = (
            f"<li><b>Throughput</b> follows the offered load below saturation: unsaturated cells delivered a "
            f"median {median_delivered:.2f}× the offered output tokens, so throughput wins there are window "
            "noise. " + (f"Saturated (vLLM queue ≥ 1 request on average): {sat}{more}.</li>" if saturated else
                         "No cell saturated: this grid cannot rank the modes on capacity.</li>"))
    default_note = ("<li><b>Wins</b> = workloads where the mode has the best mean over repeats (even when within "
                    "noise: <b>ties</b> counts those, selector tie rule). <b>Default loss</b> = how much worse vLLM's "
                    f"default {esc(DEFAULT)} is than the best mode, % of the best.</li>")

    verdicts = paired_verdicts(data.paired_rounds(PAIRED_METRICS), PAIRED_METRICS)
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{esc(title)}</title>"
             "<meta name='viewport' content='width=device-width, initial-scale=1'>"
             f"<style>{CSS}</style><script type='text/javascript'>{plotly_js}</script></head><body><main>"]
    parts.append(f"<header><h1>{esc(title)}</h1><p class='sub'>graphmode measurement report · {esc(ds)} · "
                 f"{model_txt} · generated {esc(when)}</p>{measured_facts(data)}</header>")
    parts.append("<div class='top first'><section><h3>Which mode wins <span class='muted' style='font-weight:400'>— "
                 "workloads won per mode (best mean), and how much vLLM's default loses</span></h3>"
                 + (headline_table(headline, data.modes) if headline else
                    "<p class='note'>No verdicts: the selector could not aggregate these rows.</p>")
                 + "</section><section><h3>In short</h3>"
                 + f"{findings(headline, saturated_keys, verdicts)}</section></div>")
    parts.append("<div class='top'><section><h3>What was measured <span class='muted' style='font-weight:400'>"
                 "— ok cells per mode · workloads × repeats</span></h3>" + shapes_table(data)
                 + "</section><section><ul class='notes'>"
                 + f"{default_note}{saturation_note}{dropped_note}{note_items}</ul></section></div>")

    parts.append("<h2 id='workloads'>1 · Every workload, every mode</h2>")
    parts.append("<p class='caption'>Bar = mean over repeats; whiskers = min and max over repeats (none with one "
                 "repeat); <b>black outline</b> = best mean; <b>hatched</b> = within the noise of the best. "
                 "One panel per workload: rows are prefill/decode length pairs, columns arrival rate × "
                 "burstiness. The buttons switch the metric; click a mode in the legend to hide it.</p>")
    if data.max_repeats < 2:
        parts.append("<p class='note'>One repeat per cell: the bars carry no error bars.</p>")
    for i, (shape, fig) in enumerate(bar_figures):
        parts.append(f"<h3>{esc(shape.label)}</h3>")
        parts.append(_fig_html(fig, f"fig-bars-{i}"))

    parts.append("<h2 id='map'>2 · Decision map: the trained model's choice over the feature space</h2>")
    if model is None or map_figure is None:
        why = "no trained model was found or given" if model is None else "the model predicts neither ITL nor TTFT"
        parts.append(f"<p class='note'>Decision map skipped: {esc(why)} (<code>graphmode train</code>, "
                     "then <code>graphmode report --model-dir DIR</code>).</p>")
    else:
        feats = ", ".join(model.card.features.names) or "none"
        parts.append(
            f"<p>Model <code>{esc(model.model_id)}</code> takes the observed features <code>{esc(feats)}</code>"
            + (" plus model-shape features" if model.card.features.uses_shape else "")
            + ". Each grid point is a workload description (rate, burstiness, input/output tokens) turned into "
              "those features exactly as <code>graphmode recommend --rate …</code> does (Little's law for the "
              "running batch, burstiness → batch CV), then ranked as the recommender ranks (a tie within the "
              "predicted noise goes to the default). Markers: the measured best mode of each profiled "
              "workload at its observed rate and ratio (diamond: tied within noise); hover for the model's "
              "answer there. Token lengths along the ratio axis: input = G·√ratio, output = G/√ratio, with G "
              "interpolated between the profiled workloads so the map passes through them.</p>")
        for dm in maps:
            for n in dm.notes:
                parts.append(f"<p class='note'>{esc(n)}</p>")
        parts.append(_fig_html(map_figure, "fig-map"))

    parts.append("<h2 id='pareto'>3 · Latency vs CUDA graph memory vs start-up</h2>")
    if pareto_fig is not None:
        parts.append("<p class='caption'>One point per (model shape, mode). y: the median over workloads of the "
                     "mode's mean divided by that workload's best mean (1 = always best); x: CUDA graph memory "
                     "from vLLM's capture log; marker area ∝ start-up time. ★ with black outline = Pareto-optimal "
                     "in (latency, graph memory) within its shape; lower-left is better; hover says whether it "
                     "stays optimal with start-up time as a third axis.</p>")
        parts.append(_fig_html(pareto_fig, "fig-pareto"))
    else:
        parts.append("<p class='note'>No mode has both a latency and a graph-memory figure.</p>")
    parts.append("<details open><summary>Start-up, capture and graph memory per mode</summary>"
                 + constants_table(pareto_points, data)
                 + "<p class='muted'>Start-up is the wall clock from spawn to /health OK, averaged over engine "
                   "starts; the first start of a session compiles with a cold torch.compile cache. NONE captures "
                   "no graphs (0 GiB). ★ = Pareto-optimal in (that latency, graph memory).</p></details>")

    parts.append("<h2 id='cv'>4 · Selector cross-validation</h2>")
    if model is None:
        parts.append("<p class='note'>No model: no cross-validation to show.</p>")
    else:
        for n in model.notes:
            parts.append(f"<p class='note'>{esc(n)}</p>")
        parts.append(cv_tables(model))

    parts.append("<h2 id='noise'>5 · Run-to-run noise and ties</h2>")
    noise_src = []
    for s in data.shapes:
        if s.ts is not None:
            src = "; ".join(f"{VIEWS[m].label} {s.ts.noise_cv[m]:.1%} ({s.ts.noise_source[m]})"
                            for m in NOISE_METRICS if m in s.ts.noise_cv)
            noise_src.append(f"<li>{esc(s.short)}: pooled noise {esc(src)}</li>")
    parts.append(
        "<p>Coefficient of variation (sample std / mean) of each cell over its repeats; cells above "
        f"{CV_NOISY:.0%} are shaded. A cell measured once shows the 95% confidence half-width of its own "
        "window where the row records one (adaptive windows), else n=1. A workload's winner is a <b>tie</b> "
        "when another mode's mean is within 2 standard errors (each cell's spread shrunk towards the pooled "
        "noise: selector/aggregate.py cell_sigma, selector/objective.py rank):"
        " the measurement cannot tell them apart.</p>"
        f"<ul class='notes'>{''.join(noise_src)}</ul>"
        f"{start_table(data)}{paired_table(data)}<div class='scroll'>{noise_table(data)}</div>")

    parts.append(f"<h2 id='failed'>6 · Failed cells ({len(data.failed)})</h2>"
                 "<p class='muted'>Counted and listed here, never plotted.</p>" + failed_table(data))
    parts.append(f"<footer>graphmode {esc(__version__)} · <code>graphmode report</code> · datasets: "
                 + ", ".join(f"<code>{esc(s.path)}</code>" for s in data.datasets)
                 + (f" · model: <code>{esc(model.folder)}</code>" if model else "")
                 + "</footer></main></body></html>")
    return "".join(parts)
