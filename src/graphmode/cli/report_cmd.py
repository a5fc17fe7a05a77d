"""``graphmode report``: a self-contained HTML report of profile datasets and the trained model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from graphmode.cli.common import handle_errors
from graphmode.core.errors import ConfigError

console = Console(stderr=True)
SIZE_WARN_BYTES = 10 * 1024 * 1024


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        dataset: Annotated[
            list[Path] | None,
            typer.Option("--dataset", help="Profile dataset (SQLite). Repeatable. Default: the ones --model-dir "
                                           "was trained on, else <models-dir>/profiles/*.sqlite."),
        ] = None,
        model_dir: Annotated[
            Path | None,
            typer.Option("--model-dir", help="Model folder (card.json, model.skops, cv.json). Default: the "
                                             "registry's model for the data's GPU and vLLM, as recommend picks it."),
        ] = None,
        models_dir: Annotated[
            Path | None, typer.Option("--models-dir", help="Registry root (default: settings).")
        ] = None,
        no_model: Annotated[
            bool, typer.Option("--no-model", help="Leave the model out: no decision map, no CV table.")
        ] = False,
        out: Annotated[Path, typer.Option("--out", help="HTML file to write.")] = Path("report.html"),
        grid_points: Annotated[
            int, typer.Option("--grid-points", min=4, max=200, help="Decision-map grid points per axis.")
        ] = 8,  # report.decision.DEFAULT_GRID_POINTS (not imported: the CLI starts without the report extra)
        title: Annotated[str | None, typer.Option("--title", help="Page title.")] = None,
        inline_plotly: Annotated[bool, typer.Option(
            "--inline-plotly", help="Carry plotly.js (3.5 MB) in the page instead of a file beside it.")] = False,
        summary: Annotated[Path | None, typer.Option(
            "--summary", help="Also write a short Markdown summary (no timestamps), e.g. docs/report-summary.md."),
        ] = None,
    ) -> None:
        """Write one HTML page (and plotly.js beside it; opens offline): per GPU × vLLM release the race verdicts
        and the bundled model's answers, then the model's decision map and CV, the measurements, noise, capture
        sizes and failed cells."""
        from graphmode.report import build_report, default_datasets
        from graphmode.selector.registry import default_models_dir

        with handle_errors():
            if no_model and model_dir is not None:
                raise ConfigError("--no-model and --model-dir contradict each other")
            root = models_dir or default_models_dir()
            if dataset:
                paths, note = list(dataset), None
            elif model_dir is not None and not no_model:
                from graphmode.selector.card import ModelCard

                paths, note = [s.resolve(model_dir) for s in ModelCard.load(model_dir).dataset.cost_sources()], None
            else:
                paths, note = default_datasets(root)
            res = build_report(paths, out, model_dir=model_dir, models_dir=root, use_model=not no_model,
                               grid_points=grid_points, title=title, notes=[note] if note else [],
                               inline_plotly=inline_plotly)
            if summary is not None:
                from graphmode.report.summary import summary_markdown

                summary.write_text(summary_markdown(res.data, res.model, "graphmode report --summary FILE"),
                                   encoding="utf-8")
            for note in res.notes:
                console.print(f"[yellow]note:[/] {note}", highlight=False)
            size = res.bytes / 1024 / 1024
            model = res.model.model_id if res.model else "no model"
            script = f" + {res.script.name} ({res.script_bytes / 1024 / 1024:.1f} MB)" if res.script else ""
            console.print(
                f"[bold green]report[/] → {res.out} ({size:.1f} MB){script}: {len(res.data.shapes)} shapes, "
                f"{res.data.n_ok} ok cells, {len(res.data.failed)} failed; {model}",
                highlight=False,
            )
            if res.bytes > SIZE_WARN_BYTES:
                console.print(f"[yellow]note:[/] the report is {size:.1f} MB (over 10 MB)", highlight=False)
