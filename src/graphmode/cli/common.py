"""Helpers every subcommand shares: settings, error reporting, exit codes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console

from graphmode.errors import ConfigError, GraphmodeError
from graphmode.modes import CudaGraphMode, parse_mode

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_PARTIAL = 3  # the job finished but some cells/requests failed

err_console = Console(stderr=True)


@contextmanager
def handle_errors() -> Iterator[None]:
    """Print graphmode's own errors as one clear message and exit non-zero, no traceback."""
    try:
        yield
    except ConfigError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None
    except GraphmodeError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(EXIT_ERROR) from None


def parse_modes(value: str | None) -> list[CudaGraphMode]:
    if not value:
        return list(CudaGraphMode)
    try:
        modes = [parse_mode(v) for v in value.split(",") if v.strip()]
    except ValueError as exc:
        raise ConfigError(f"--modes: {exc}") from None
    if not modes:
        raise ConfigError("--modes: no mode given")
    return list(dict.fromkeys(modes))
