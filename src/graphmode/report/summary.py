"""A short Markdown summary of a report: which mode wins, what the default loses, how the model does.

The HTML report is megabytes of plotly and is built on demand (``graphmode report``); this summary is
small and deterministic (no timestamps), so it can be committed beside the screenshot and checked
against the data it was built from.
"""

from __future__ import annotations

from collections.abc import Sequence

from graphmode.report.analysis import headline
from graphmode.report.configs import markdown as configs_markdown
from graphmode.report.decision import LoadedModel
from graphmode.report.race import markdown as race_markdown
from graphmode.report.views import ReportData


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}%"


def summary_markdown(data: ReportData, model: LoadedModel | None, command: str) -> str:
    modes = list(data.modes)
    lines = [
        "# graphmode report summary",
        "",
        f"Built by `{command}` from {', '.join(sorted(d.path.name for d in data.datasets))} ({data.n_ok} ok cells, "
        f"{len(data.failed)} failed)" + (f" and model `{model.model_id}`." if model else "."),
        "The HTML report (figures, decision map, noise, per-workload tables) is not committed: "
        "`graphmode report` builds it.",
        "",
        "## Which mode wins (workloads with the best mean), and what vLLM's default loses",
        "",
        _row(["model shape", "objective", "workloads", *modes, "default best or tied", "default loss median",
              "default loss max"]),
        _row(["---"] * (len(modes) + 6)),
    ]
    for h in headline(data):
        worst = _pct(h.default_max_loss_pct)
        if h.default_max_loss_workload:
            worst += f" ({h.default_max_loss_workload})"
        lines.append(_row([h.shape, h.metric, str(h.n), *(str(h.wins.get(m, 0)) for m in modes),
                           f"{h.default_ok}/{h.n}", _pct(h.default_median_loss_pct), worst]))
    if model is not None and model.cv.summaries:
        lines += [
            "",
            f"## The model, held-out workloads ({model.cv.scheme}, {model.cv.folds} folds, "
            f"{model.cv.chosen_regressor} regressors)",
            "",
            _row(["objective", "n", "mean regret", "max regret", "correct", "vs default", "best static mode"]),
            _row(["---"] * 7),
        ]
        for s in [*model.cv.summaries, *model.cv.shape_cv]:
            lines.append(_row([s.objective, str(s.n), _pct(s.mean_regret_pct), _pct(s.max_regret_pct),
                               _pct(s.correct_pct), _pct(s.mean_gain_vs_default_pct), s.static_mode or "–"]))
    lines += configs_markdown(data.configurations)
    if model is not None:
        lines += race_markdown(model.card)
    return "\n".join(lines) + "\n"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"
