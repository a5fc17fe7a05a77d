"""``graphmode report`` end to end: datasets (+ model) → data → tables and figures → one HTML file.

plotly.js (3.5 MB) is written once beside the page (``plotly-<version>.min.js``) unless ``inline_plotly``
asks for a page that carries it.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from graphmode.core.errors import DatasetError
from graphmode.report import figures, html
from graphmode.report.analysis import headline, pareto
from graphmode.report.capture import section as capture_section
from graphmode.report.decide import releases
from graphmode.report.decision import DEFAULT_GRID_POINTS, LoadedModel, decision_maps, default_model_folder, load_model
from graphmode.report.load import load_report_data
from graphmode.report.views import ReportData
from graphmode.selector.train import load_rows


@dataclass
class ReportResult:
    out: Path
    bytes: int  # the page
    data: ReportData
    model: LoadedModel | None
    notes: list[str] = field(default_factory=list)
    script: Path | None = None  # plotly.js beside the page, when not inlined
    script_bytes: int = 0


def default_datasets(models_dir: Path) -> tuple[list[Path], str | None]:
    """``<models_dir>/profiles/*.sqlite``, else the ones in its subfolders (e.g. ``pilot/``), with a note.

    DatasetError when there is none at all.
    """
    root = models_dir / "profiles"
    found = sorted(root.glob("*.sqlite"))
    if found:
        return found, None
    nested = sorted(root.glob("*/**/*.sqlite"))
    if nested:
        names = ", ".join(str(p.relative_to(root)) for p in nested)
        return nested, f"no dataset directly under {root}; using the ones in its subfolders: {names}"
    raise DatasetError(f"no profile datasets under {root}: pass --dataset PATH")


def _model_notes(folder: Path, model: LoadedModel, data: ReportData, datasets: Sequence[Path]) -> list[str]:
    """Where the model and the datasets disagree: another GPU or release, or rows it was not trained on."""
    notes = []
    c = model.card
    hosts = {(h.gpu_name, h.vllm_version) for h in data.hosts}
    if (c.gpu_name, c.vllm_version) not in hosts:
        notes.append(f"model {c.model_id} was trained on {c.gpu_name}, vLLM {c.vllm_version}; the datasets come from "
                     + "; ".join(f"{g}, vLLM {v}" for g, v in sorted(hosts, key=str)))
    # What training would take from these datasets: not the card's capture-cost datasets, not the rows of
    # capture-size arms (they measured a list, not a mode).
    capture = {(folder / s.path).resolve() for s in c.dataset.capture_sources}
    trainable = [Path(p) for p in datasets if Path(p).resolve() not in capture]
    n_trainable = len(load_rows(trainable)[0]) if trainable else 0
    if c.dataset.rows_sha256 and c.dataset.rows_used != n_trainable:
        notes.append(f"model {c.model_id} was trained on {c.dataset.rows_used} ok rows; the datasets here hold "
                     f"{n_trainable} it could train on: retrain to include them")
    return notes


def _plotly_js(out: Path, inline: bool) -> tuple[html.PlotlyJs, Path | None, int]:
    """plotly.js inline, or written once beside ``out`` (kept when it is already there)."""
    from plotly import __version__ as plotly_version
    from plotly.offline import get_plotlyjs

    if inline:
        return html.PlotlyJs(inline=get_plotlyjs()), None, 0
    script = out.with_name(f"plotly-{plotly_version}.min.js")
    if not script.is_file():
        text = get_plotlyjs()
        tmp = script.with_name(script.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(script)
    return html.PlotlyJs(src=script.name), script, script.stat().st_size


def build_report(
    datasets: Sequence[Path],
    out: Path,
    *,
    model_dir: Path | None = None,
    models_dir: Path | None = None,
    use_model: bool = True,
    grid_points: int = DEFAULT_GRID_POINTS,
    title: str | None = None,
    generated: _dt.datetime | None = None,
    notes: Sequence[str] = (),
    inline_plotly: bool = False,
) -> ReportResult:
    """Write the report for ``datasets`` to ``out``.

    ``model_dir`` names the model folder; without it the registry under ``models_dir`` picks the model
    ``graphmode recommend`` would use for the data's GPU and vLLM (none there: the decision map and the CV
    table are skipped with a note). ``use_model=False`` skips the model altogether. The decision section
    asks the registry's model of each GPU × vLLM release in the data.
    """
    figures.plotly_modules()  # a clear error before any work when plotly is missing
    shapes_dir = (models_dir / "shapes") if models_dir is not None else None
    data = load_report_data(datasets, shapes_dir=shapes_dir)
    notes = [*notes, *data.notes]
    model: LoadedModel | None = None
    if use_model:
        folder = model_dir
        if folder is None and models_dir is not None:
            folder = default_model_folder(models_dir, data)
            if folder is None:
                notes.append(f"no trained model under {models_dir}: decision map and CV skipped")
        if folder is not None:
            model = load_model(folder)
            notes += _model_notes(folder, model, data, datasets)
    else:
        notes.append("model skipped (--no-model): no decision map, no CV table")

    maps = decision_maps(model, data, points=grid_points) if model is not None else []
    points = pareto(data)
    pareto_fig = (figures.pareto_figure(points)
                  if any(p.graph_gib is not None and any(v is not None for v in p.rel.values()) for p in points)
                  else None)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plotly, script, script_bytes = _plotly_js(out, inline_plotly)
    text = html.page(
        data=data,
        headline=headline(data),
        releases=releases(data.configurations, models_dir, use_model),
        model=model,
        maps=maps,
        map_figure=figures.decision_figure(maps, data.modes or None) if maps else None,
        pareto_points=points,
        pareto_fig=pareto_fig,
        capture=capture_section(datasets),
        plotly=plotly,
        notes=notes,
        title=title,
        generated=generated,
    )
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    return ReportResult(out, len(text.encode("utf-8")), data, model, notes, script, script_bytes)
