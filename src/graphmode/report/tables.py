"""The report's measurement tables as :class:`~graphmode.report.table.Table` data (rendered by the templates).

What was measured, which mode wins, the model's cross-validation, run-to-run noise, graph memory and
start-up, failed cells. The decision tables (verdicts per GPU × vLLM release) are :mod:`graphmode.report.decide`.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from graphmode.report.decision import LoadedModel
from graphmode.report.figures import MODE_COLORS, MODE_SHORT
from graphmode.report.table import Cell, Table, num
from graphmode.report.views import DEFAULT, NOISE_METRICS, VIEWS, HeadlineRow, ParetoPoint, ReportData
from graphmode.selector.paired import PairedVerdict

CV_NOISY = 0.10  # a repeat CV above this is highlighted in the noise table
PAIRED_METRICS = NOISE_METRICS
DASH = Cell("–", cls="num muted")


def pct(v: float | None, digits: int = 1, signed: bool = False) -> str:
    if v is None or not math.isfinite(v):
        return "–"
    return f"{v:+.{digits}f}%" if signed else f"{v:.{digits}f}%"


def date(ts: float | None) -> str:
    if ts is None:
        return "?"
    return _dt.datetime.fromtimestamp(ts, tz=_dt.UTC).strftime("%Y-%m-%d %H:%M")


def _day(ts: float | None) -> str:
    return "?" if ts is None else _dt.datetime.fromtimestamp(ts, tz=_dt.UTC).strftime("%Y-%m-%d")


def mode_head(mode: str) -> Cell:
    return Cell(MODE_SHORT.get(mode, mode), cls="mode", title=mode, swatch=MODE_COLORS.get(mode, "#444"),
                sup="default" if mode == DEFAULT else "")


def mode_cell(mode: str) -> Cell:
    return Cell(mode, swatch=MODE_COLORS.get(mode, "#444"), note="(default)" if mode == DEFAULT else "")


# ---------------------------------------------------------------- header
@dataclass(frozen=True)
class Chip:
    strong: str
    text: str = ""
    bad: str = ""


def chips(data: ReportData) -> list[Chip]:
    """The facts under the title: GPUs, driver, vLLM, what was measured, when."""
    out = []
    for h in data.hosts:
        n = f"{h.gpu_count}× " if h.gpu_count and h.gpu_count > 1 else ""
        mem = f" · {h.gpu_memory_gib:.0f} GiB" if h.gpu_memory_gib else ""
        out += [Chip(f"{n}{h.gpu_name or 'unknown GPU'}", mem),
                Chip("", f"driver {h.driver_version or '?'} · CUDA {h.cuda_version or '?'}"),
                Chip(f"vLLM {h.vllm_version or '?'}", f" · torch {h.torch_version or '?'}")]
    first = min((s.first for s in data.shapes if s.first), default=None)
    last = max((s.last for s in data.shapes if s.last), default=None)
    n_w = sum(len(s.workloads) for s in data.shapes)
    out.append(Chip("", f"{len(data.shapes)} model shape{'s' if len(data.shapes) != 1 else ''} · {n_w} workloads · "
                        f"{len(data.modes)} modes"))
    out.append(Chip("", f"{data.n_ok} ok cells · ", f"{len(data.failed)} failed" if data.failed else ""))
    out.append(Chip("", f"{date(first)} → {date(last)} UTC"))
    return out


def shapes_table(data: ReportData) -> Table:
    modes = data.modes
    head = [Cell("model shape"), Cell("attention · runner"), *[mode_head(m) for m in modes], Cell("measured")]
    rows = []
    for s in data.shapes:
        att = sorted({a for m in s.modes for a in s.attention.get(m, [])})
        run = sorted({a for m in s.modes for a in s.runner.get(m, [])})
        per_mode_att = {m: ", ".join(s.attention.get(m, [])) for m in s.modes}
        att_text = ", ".join(att) or "?"
        if len(set(per_mode_att.values())) > 1:
            att_text = "; ".join(f"{MODE_SHORT.get(m, m)}: {v or '?'}" for m, v in per_mode_att.items())
        cells = []
        for m in modes:
            if m not in s.ok_rows:
                cells.append(DASH)
                continue
            lo, hi = s.repeats[m]
            rep = f"{lo}" if lo == hi else f"{lo}–{hi}"
            fail = s.failed_rows.get(m, 0)
            n_w = sum(1 for w in s.workloads if m in w.cells)
            cells.append(Cell(str(s.ok_rows[m]), cls="num", strong=True, note=f"· {n_w}×{rep}",
                              bad=f"+{fail}✗" if fail else "",
                              title=f"{s.ok_rows[m]} ok cells over {n_w} workloads, {rep} repeats each"))
        day = _day(s.first) + ("" if _day(s.first) == _day(s.last) else f" → {_day(s.last)}")
        rows.append([Cell(s.short, title=s.label, strong=True), Cell(f"{att_text} · {', '.join(run) or '?'}"),
                     *cells, Cell(day, cls="nowrap")])
    return Table(head, rows, "compact")


def headline_table(rows: Sequence[HeadlineRow], modes: Sequence[str]) -> Table:
    head = [Cell("model shape"), Cell("objective"), Cell("workloads", cls="num"), *[mode_head(m) for m in modes],
            Cell("ties", cls="num", title="workloads whose best mode is within the noise of another"),
            Cell("default loss median", cls="num"), Cell("default loss max", cls="num")]
    out = []
    for r in rows:
        view = VIEWS[r.metric]
        top = max(r.wins.values(), default=0)
        cells = []
        for m in modes:
            n = r.wins.get(m)
            if n is None:
                cells.append(DASH)
            elif n == top and n > 0:
                bar = f"box-shadow: inset 0 -3px 0 {MODE_COLORS.get(m, '#444')}"
                cells.append(num(str(n), "win", strong=True, style=bar))
            else:
                cells.append(num(str(n), "muted" if n == 0 else ""))
        worst = num(pct(r.default_max_loss_pct), title=r.default_max_loss_workload or "")
        out.append([Cell(r.shape, strong=True), Cell(f"{view.direction} {view.label}"), num(str(r.n)), *cells,
                    num(str(r.ties)), num(pct(r.default_median_loss_pct)), worst])
    return Table(head, out, "headline")


@dataclass(frozen=True)
class Finding:
    shape: str
    text: str


def findings(rows: Sequence[HeadlineRow], saturated: Collection[tuple[str, str]] = (),
             paired: Sequence[PairedVerdict] = ()) -> list[Finding]:
    """Per shape: on how many workloads the default is fine, and its worst case per latency objective;
    then every mode that beat the default on the same side in every paired round.

    A throughput worst case is named only on a ``saturated`` (shape, workload): elsewhere the engine
    delivers the offered load in every mode and the gap is which bursts the window caught."""
    items = []
    for shape in dict.fromkeys(r.shape for r in rows):
        mine = [r for r in rows if r.shape == shape]
        ok = " · ".join(f"{VIEWS[r.metric].label} {r.default_ok}/{r.n}" for r in mine)
        worst = []
        for r in mine:
            view = VIEWS[r.metric]
            if not (r.default_max_loss_pct and r.worst_best_mode) or (
                    view.direction == "max" and r.default_max_loss_pct < 5):
                continue
            if r.metric == "output_tok_s" and (r.shape, r.default_max_loss_workload) not in saturated:
                continue
            worst.append(f"{view.label} {pct(r.default_max_loss_pct)} worse on {r.default_max_loss_workload} "
                         f"({r.worst_best_mode} {view.fmt(r.worst_best_value)} vs {view.fmt(r.worst_default_value)} "
                         f"{view.unit})")
        text = f"default best or tied: {ok}."
        if worst:
            text += " Worst: " + "; ".join(worst) + "."
        wins = [v for v in paired if v.shape == shape and v.verdict == "lower"]
        if wins:
            text += " Paired inside rounds: " + "; ".join(
                f"{v.mode} {VIEWS[v.metric].label} " + "/".join(f"{x:.2f}×" for _, _, x in v.rounds)
                + f" the default's, lower in {len(v.rounds)} of {len(v.rounds)} rounds ("
                + ", ".join(str(n) for _, n, _ in v.rounds) + " workloads)" for v in wins) + "."
        items.append(Finding(shape, text))
    return items


# ---------------------------------------------------------------- model / CV
def cv_table(model: LoadedModel) -> Table:
    head = ["objective", "n", "regret vs oracle (mean)", "median", "max", "correct", "gain vs default",
            "gain vs best static", "best static mode", "default's regret", "static's regret"]
    rows = [[Cell(s.objective), num(str(s.n)), num(pct(s.mean_regret_pct)), num(pct(s.median_regret_pct)),
             num(pct(s.max_regret_pct)), num(pct(s.correct_pct, 0)), num(pct(s.mean_gain_vs_default_pct, signed=True)),
             num(pct(s.mean_gain_vs_static_pct, signed=True)), Cell(s.static_mode or "–"),
             num(pct(s.default_regret_pct)), num(pct(s.static_regret_pct))]
            for s in [*model.cv.summaries, *model.cv.shape_cv]]
    return Table.of(head, rows, "cv")


def cv_workload_table(model: LoadedModel) -> Table:
    """Per held-out workload of the first objective."""
    cv = model.cv
    first = cv.summaries[0].objective if cv.summaries else None
    rows = [[Cell(w.workload), Cell(w.shape), Cell(w.oracle),
             Cell(", ".join(m for m in w.ties if m != w.oracle) or "–"),
             Cell(w.chosen or "–", cls="" if w.correct else "badcell"), num(pct(w.regret_pct)),
             num(pct(w.gain_vs_default_pct, signed=True)), num(pct(w.gain_vs_static_pct, signed=True))]
            for w in cv.workloads if w.objective == first]
    return Table.of(["held-out workload", "shape", "oracle", "tied with oracle", "chosen", "regret", "vs default",
                     "vs static"], rows, "cv", caption=f"Per held-out workload ({first})")


def regressor_table(model: LoadedModel) -> Table:
    cv = model.cv
    rows = [[Cell(c.kind + (" ◀" if c.kind == cv.chosen_regressor else "")), num(pct(c.mean_regret_pct)),
             num(pct(c.max_regret_pct)), num(pct(c.correct_pct, 0)),
             num("–" if c.mean_log_rmse is None else f"{c.mean_log_rmse:.3f}")] for c in cv.regressor_candidates]
    return Table.of(["regressor", "mean regret", "max regret", "correct", "log-RMSE"], rows, "cv")


# ---------------------------------------------------------------- noise
def start_table(data: ReportData, metric: str = "itl_p50") -> Table:
    rows = [[Cell(e.shape), Cell(e.mode), num(str(e.workloads)), num(f"{e.median_ratio:.2f}"),
             num(f"{e.min_ratio:.2f}–{e.max_ratio:.2f}"), num(f"{e.share_slower:.0%}"),
             num("–" if e.median_cv is None else f"{e.median_cv:.1%}")] for e in data.start_effects(metric)]
    return Table.of(["model shape", "mode", "workloads", "later / first start (median)", "range",
                     "later start slower", "CV over starts (median)"], rows, caption=VIEWS[metric].label)


def paired_table(data: ReportData) -> Table:
    def cell(r: tuple[int, float] | None) -> Cell:
        return num("–") if r is None else num(f"{r[1]:.2f} ({r[0]})")

    rows = [[Cell(p.shape), Cell(p.mode), num(str(p.repeat)), Cell(p.block),
             *[cell(p.ratios.get(m)) for m in PAIRED_METRICS]] for p in data.paired_rounds(PAIRED_METRICS)]
    return Table.of(["model shape", "mode", "repeat", "GPU (or run)",
                     *[f"{VIEWS[m].label}: mode / default (workloads)" for m in PAIRED_METRICS]], rows)


def paired_verdict_table(verdicts: Sequence[PairedVerdict]) -> Table:
    rows = [[Cell(v.shape), Cell(v.mode), Cell(VIEWS[v.metric].label),
             num(", ".join(f"r{rep} ({n})" for rep, n, _ in v.rounds)),
             num(" · ".join(f"{x:.2f}" for _, _, x in v.rounds)),
             Cell(v.verdict, cls="verdict" if v.decisive else "")] for v in verdicts]
    return Table.of(["model shape", "mode", "metric", "rounds (workloads)", "mode / default per round", "verdict"],
                    rows)


def noise_table(data: ReportData) -> Table:
    head = [Cell("model shape"), Cell("workload"), Cell("metric"), *[mode_head(m) for m in data.modes],
            Cell("best mean"), Cell("tied within noise")]
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
                    if c is None or not c.vals(metric):
                        cells.append(DASH)
                    elif cv is None:
                        ci = c.ci_median(metric)
                        cells.append(num("n=1", "muted", title="one repeat") if ci is None else
                                     num(f"±{ci:.1%} CI", "muted",
                                         title="one repeat; 95% CI half-width within its measurement window"))
                    else:
                        cells.append(num(f"{cv:.1%}", "noisy" if cv > CV_NOISY else "",
                                         title=f"{len(c.vals(metric))} repeats"))
                v = w.verdicts.get(metric)
                if v is None:
                    best, tie = Cell("–", cls="muted"), Cell("–", cls="muted")
                else:
                    best = Cell(v.best)
                    tie = Cell(f"TIE: {', '.join(v.ties[1:])}", cls="tie") if v.tied else Cell("no", cls="muted")
                rows.append([Cell(s.short), Cell(w.label), Cell(VIEWS[metric].label), *cells, best, tie])
    return Table(head, rows, "noise")


def constants_table(points: Sequence[ParetoPoint], data: ReportData) -> Table:
    def f(v: float | None, fmt: str) -> str:
        return "–" if v is None else format(v, fmt)

    rows = []
    for s in data.shapes:
        for m in s.modes:
            p = next((q for q in points if q.shape == s.short and q.mode == m), None)
            c = s.constants.get(m, {})
            rel = [num(("–" if p is None or p.rel.get(k) is None else f"×{p.rel[k]:.2f}")
                       + (" ★" if p is not None and p.pareto.get(k) else ""))
                   for k in ("itl_p50", "ttft_p50", "tpot_p50")]
            rows.append([Cell(s.short), mode_cell(m), num(f(c.get("startup_s"), ".0f")),
                         num(str(s.starts.get(m, 0))), num(f(c.get("capture_s"), ".1f")),
                         num(f(c.get("graph_gib"), ".2f")), *rel])
    return Table.of(["model shape", "mode", "start-up s (mean)", "engine starts", "capture s", "graph GiB",
                     "ITL p50 vs best", "TTFT p50 vs best", "TPOT p50 vs best"], rows, "compact")


def failed_table(data: ReportData) -> Table:
    rows = [[Cell(f.dataset), Cell(f.shape), Cell(f.mode), Cell(f.workload), num(str(f.repeat)),
             Cell(date(f.started_at)),
             Cell(f.reason.splitlines()[0][:300] if f.reason else "", cls="reason")] for f in data.failed]
    return Table.of(["dataset", "shape", "mode", "workload", "repeat", "started (UTC)", "reason (first line)"], rows,
                    "compact")
