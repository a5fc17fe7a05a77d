"""The ``graphmode`` command."""

from __future__ import annotations

import typer

from graphmode import __version__
from graphmode.cli import check_cmd, launch_cmd, profile_cmd, recommend_cmd, report_cmd, serve_cmd, train_cmd, watch_cmd
from graphmode.cli.common import run_app

app = typer.Typer(
    name="graphmode",
    help="Pick the right vLLM CUDA Graph mode for the traffic a deployment actually sees.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
profile_cmd.register(app)
train_cmd.register(app)
recommend_cmd.register(app)
launch_cmd.register(app)
watch_cmd.register(app)
serve_cmd.register(app)
report_cmd.register(app)
check_cmd.register(app)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"graphmode {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """graphmode: profile, train, recommend, serve, launch, watch, report."""


def run() -> None:
    """The ``graphmode`` console script."""
    run_app(app)
