"""``python -m graphmode.profiling``: the profiler alone, for a GPU host that has vLLM's environment but
not the selector's dependencies (scikit-learn, skops, FastAPI)."""

from __future__ import annotations

import typer

from graphmode.cli import profile_cmd
from graphmode.cli.common import run_app

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
profile_cmd.register(app)


@app.callback()
def _root() -> None:
    """graphmode profiler."""


if __name__ == "__main__":
    run_app(app, prog_name="python -m graphmode.profiling")
