"""``graphmode train`` and ``graphmode retrain``: fit a selector model on a profile, cross-validated."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias

import typer
from rich.console import Console
from rich.table import Table

from graphmode.cli import options as o
from graphmode.cli.common import VllmArgsCommand, handle_errors, parse_modes, vllm_invocation
from graphmode.core.errors import ConfigError

if TYPE_CHECKING:
    from graphmode.profiling.runner import ProfileConfig
    from graphmode.selector.card import CVReport
    from graphmode.selector.retrain import RetrainResult
    from graphmode.selector.train import TrainResult

console = Console(stderr=True)
# Piped output (CI logs, files) gets a width that fits the tables instead of rich's 80 columns.
out_console = Console(width=None if sys.stdout.isatty() else 150)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}%"


def _objective(metric: str | None, constraints: list[str] | None) -> Any:
    from graphmode.core.settings import load_settings
    from graphmode.selector.objective import make_objective

    return make_objective(metric or load_settings().selector.objective, constraints or [])


def print_report(report: CVReport, console: Console) -> None:
    """Candidate comparison, per-objective summary and the per-workload table of a CV report."""
    if report.skipped:
        console.print(f"[yellow]cross-validation skipped:[/] {report.skipped}", highlight=False)
        return
    t = Table(
        title=f"Candidates ({report.scheme}, {report.folds} folds, default objective)", title_justify="left"
    )
    for col in ("regressor", "mean regret", "max regret", "correct", "log-RMSE", "µs/row"):
        t.add_column(col, justify="left" if col == "regressor" else "right")
    for c in report.regressor_candidates:
        t.add_row(
            c.kind + (" ◀" if c.kind == report.chosen_regressor else ""),
            _pct(c.mean_regret_pct),
            _pct(c.max_regret_pct),
            _pct(c.correct_pct),
            "-" if c.mean_log_rmse is None else f"{c.mean_log_rmse:.3f}",
            "-" if c.predict_us is None else f"{c.predict_us:.0f}",
        )
    console.print(t)
    s = Table(
        title=f"Selector ({report.chosen_regressor} regressors) vs baselines, held-out workloads",
        title_justify="left",
    )
    for col in (
        "objective",
        "n",
        "regret",
        "max",
        "correct",
        "vs default",
        "vs static",
        "static mode",
        "default's regret",
        "static's regret",
    ):
        s.add_column(col, justify="left" if col in ("objective", "static mode") else "right")
    for x in [*report.summaries, *report.shape_cv]:
        s.add_row(
            x.objective,
            str(x.n),
            _pct(x.mean_regret_pct),
            _pct(x.max_regret_pct),
            _pct(x.correct_pct),
            _pct(x.mean_gain_vs_default_pct),
            _pct(x.mean_gain_vs_static_pct),
            x.static_mode or "-",
            _pct(x.default_regret_pct),
            _pct(x.static_regret_pct),
        )
    console.print(s)
    first = report.summaries[0].objective if report.summaries else None
    w = Table(title=f"Per held-out workload ({first})", title_justify="left")
    for col in ("workload", "oracle", "tied", "chosen", "regret", "vs default", "vs static"):
        w.add_column(col, justify="right" if col in ("regret", "vs default", "vs static") else "left")
    for r in report.workloads:
        if r.objective != first:
            continue
        chosen = r.chosen or "-"
        style = "" if r.correct else "[red]"
        w.add_row(
            r.workload,
            r.oracle,
            ",".join(m for m in r.ties if m != r.oracle) or "-",
            f"{style}{chosen}",
            _pct(r.regret_pct),
            _pct(r.gain_vs_default_pct),
            _pct(r.gain_vs_static_pct),
        )
    console.print(w)
    console.print(f"[dim]{report.reason}[/]", highlight=False)


def _print_result(res: TrainResult, as_json: bool) -> None:
    if as_json:
        out_console.print_json(
            json.dumps(
                {
                    "model_id": res.model_id,
                    "out_dir": str(res.out_dir),
                    "card": res.card.model_dump(mode="json"),
                }
            )
        )
        return
    print_report(res.report, out_console)
    card = res.card
    for d in card.describe:
        if d.feature in ("batch_mean", "concurrency_mean", "batch_cv"):
            out_console.print(
                f"description → {d.feature}: calibration ×{d.calibration:.2f}, median |log error| "
                f"{d.median_abs_log_err_raw or 0:.3f} raw → {d.median_abs_log_err_calibrated or 0:.3f} "
                f"(n={d.n})",
                highlight=False,
            )
    for note in card.notes:
        style = "bold yellow" if "SYNTHETIC" in note else "yellow"
        out_console.print(f"[{style}]note:[/] {note}", highlight=False)
    out_console.print(
        f"[bold green]model {res.model_id}[/] → {res.out_dir} "
        f"({card.dataset.rows_used} rows, fingerprint {', '.join(card.fingerprint_keys)})",
        highlight=False,
    )


# Options of train and retrain.
TrainDatasets: TypeAlias = Annotated[list[Path], typer.Option(
    "--dataset", help="Profile dataset (SQLite) to train on. Repeatable: rows are merged.")]
Out: TypeAlias = Annotated[Path | None, typer.Option(
    "--out", help="Model folder. Default: models/<derived from fingerprint>.")]
TrainObjective: TypeAlias = Annotated[str | None, typer.Option(
    "--objective", help="Default objective metric (e.g. itl_p50).")]
TrainConstraints: TypeAlias = Annotated[list[str] | None, o.constraint(
    "Default-objective constraint, e.g. 'ttft_p99<=200ms'. Repeatable.")]
Regressor: TypeAlias = Annotated[str, typer.Option("--regressor", help="auto|ridge|knn|extra_trees|mean")]
FingerprintKey: TypeAlias = Annotated[str | None, typer.Option(
    "--fingerprint", help="Train on rows of this fingerprint key only.")]
ProfileKey: TypeAlias = Annotated[str | None, typer.Option(
    "--profile-key", help="Train on rows of this profile key only.")]
CaptureDatasets: TypeAlias = Annotated[list[Path] | None, typer.Option(
    "--capture-dataset", help="Dataset read only for capture costs (lone engine starts of "
    "several capture lists, bench/gpu/capture_chain.sh), not trained on. Repeatable.")]
TrainJson: TypeAlias = Annotated[bool, o.json_flag("Print the model card as JSON.")]
Grid: TypeAlias = Annotated[Path | None, typer.Option("--grid", help="Workload grid (default: the bundled grid).")]
RetrainDataset: TypeAlias = Annotated[Path | None, typer.Option(
    "--dataset", help="Profile dataset (default: <models-dir>/_profiles/<profile key>.sqlite).")]
Fresh: TypeAlias = Annotated[bool, typer.Option(
    "--fresh", help="Do not resume: measure every cell again (after a vLLM upgrade with unchanged args).")]
Port: TypeAlias = Annotated[int | None, typer.Option("--port", min=1, max=65535)]
LogDir: TypeAlias = Annotated[Path | None, typer.Option("--log-dir")]
RetrainObjective: TypeAlias = Annotated[str | None, typer.Option("--objective", help="Default objective metric.")]
RetrainJson: TypeAlias = Annotated[bool, o.json_flag("Print the new model card as JSON.")]


def train(
    dataset: TrainDatasets,
    out: Out = None,
    models_dir: o.ModelsDir = None,
    objective: TrainObjective = None,
    constraint: TrainConstraints = None,
    regressor: Regressor = "auto",
    fingerprint: FingerprintKey = None,
    profile_key: ProfileKey = None,
    capture_dataset: CaptureDatasets = None,
    as_json: TrainJson = False,
) -> None:
    """Fit per-mode regressors; print and save leave-one-workload-out CV and the decision table."""
    from graphmode.selector.estimators import REGRESSOR_KINDS
    from graphmode.selector.train import train as run_train

    with handle_errors():
        if regressor != "auto" and regressor not in REGRESSOR_KINDS:
            raise ConfigError(f"--regressor must be auto or one of {', '.join(REGRESSOR_KINDS)}")
        obj = _objective(objective, constraint)
        res = run_train(
            dataset,
            out,
            models_dir=models_dir,
            objective=obj,
            regressor=regressor,  # type: ignore[arg-type]
            fingerprint_key=fingerprint,
            profile_key=profile_key,
            progress=lambda m: console.print(m, highlight=False),
            capture_datasets=capture_dataset or (),
        )
        _print_result(res, as_json)


def _retrain_with_progress(config: ProfileConfig, root: Path, path: Path, fresh: bool,
                           objective: str | None) -> RetrainResult:
    """Profile (resuming unless --fresh) with a progress bar, then train into the registry at ``root``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from graphmode.cli.profile_cmd import RichReporter
    from graphmode.selector.retrain import retrain as run_retrain

    console.print(
        f"retrain: profiling into {path} ({'fresh' if fresh else 'resuming'}), then training "
        f"into {root}",
        highlight=False,
    )
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        reporter = RichReporter(progress, config.planned_cells)
        return run_retrain(
            config,
            models_dir=root,
            dataset=path,
            resume=not fresh,
            objective=_objective(objective, None),
            reporter=reporter,
            progress=lambda m: console.print(m, highlight=False),
        )


def retrain(
    ctx: typer.Context,
    grid: Grid = None,
    vllm_cmd: o.VllmCmd = None,
    models_dir: o.ModelsDir = None,
    dataset: RetrainDataset = None,
    modes: o.Modes = None,
    workloads: o.Workloads = None,
    repeats: o.Repeats = None,
    fresh: Fresh = False,
    port: Port = None,
    log_dir: LogDir = None,
    objective: RetrainObjective = None,
    as_json: RetrainJson = False,
) -> None:
    """Profile the current fingerprint (resuming) and train a model for it into the registry."""
    from graphmode.core.settings import load_settings
    from graphmode.profiling.grid import load_grid
    from graphmode.profiling.runner import ProfileConfig
    from graphmode.selector.retrain import retrain_dataset_path

    with handle_errors():
        s = load_settings()
        g = load_grid(grid or s.profile.grid)
        selected = g.select([n for n in (workloads or "").split(",") if n])
        command, vllm_args = vllm_invocation(ctx.args, vllm_cmd, s.vllm.argv(), need_model=True)
        root = models_dir or s.selector.models_dir
        config = ProfileConfig.from_settings(
            s, command=command, vllm_args=vllm_args, modes=parse_modes(modes), workloads=selected,
            dataset=dataset or Path("unused"), log_dir=log_dir, port=port, resume=not fresh, repeats=repeats)
        res = _retrain_with_progress(config, root, dataset or retrain_dataset_path(config, root), fresh,
                                     objective)
        console.print(
            f"profile: {res.profile.ok} ok, {res.profile.failed} failed, {res.profile.skipped} "
            "already done",
            highlight=False,
        )
        _print_result(res.train, as_json)


def register(app: typer.Typer) -> None:
    """Add ``graphmode train`` and ``graphmode retrain`` to the app."""
    app.command()(train)
    app.command(
        cls=VllmArgsCommand,
        epilog="Everything after -- goes to vLLM unchanged (model, --max-model-len, ...).",
    )(retrain)
