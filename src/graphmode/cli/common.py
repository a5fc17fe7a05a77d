"""Helpers every subcommand shares: settings, error reporting, exit codes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console

from graphmode.core.errors import ConfigError, GraphmodeError
from graphmode.core.modes import CudaGraphMode, parse_mode

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


def vllm_invocation(ctx_args: list[str], vllm_cmd: str | None, default_command: list[str], *,
                    need_model: bool) -> tuple[list[str], list[str]]:
    """(command prefix, vLLM args) from a subcommand's ``--vllm-cmd`` and what follows ``--``."""
    import shlex

    from graphmode.vllm_args import model_arg

    vllm_args = list(ctx_args)
    if vllm_args and vllm_args[0] == "--":
        vllm_args = vllm_args[1:]
    command = shlex.split(vllm_cmd) if vllm_cmd else list(default_command)
    if not command:
        raise ConfigError("--vllm-cmd is empty")
    if need_model and model_arg(command, vllm_args) is None:
        raise ConfigError("no model in the vLLM args: pass e.g. `-- --model DIR` after the options")
    return command, vllm_args
