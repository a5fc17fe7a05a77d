"""Options several ``graphmode`` commands share, declared once: name, type, environment variable and help.

A command's signature then reads ``rate: Rate = None``. Where every command says the same thing about an option
it is an ``Annotated`` alias here; where a command's help says something of its own (``--json`` prints a
different thing in each command), the option is built by a function here that takes that help, so the option's
name and environment variable still live in one place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypeAlias

import typer


def objective(help: str | None = None) -> Any:
    """``--objective``: the metric to optimise; ``GRAPHMODE_OBJECTIVE`` where the command reads it."""
    return typer.Option("--objective", envvar="GRAPHMODE_OBJECTIVE", help=help)


def constraint(help: str | None = None) -> Any:
    """``--constraint`` (repeatable): a bound such as ``ttft_p99<=200ms``."""
    return typer.Option("--constraint", help=help)


def selector_url(help: str | None = None) -> Any:
    """``--selector-url``: the graphmode service to ask first."""
    return typer.Option("--selector-url", envvar="GRAPHMODE_SELECTOR_URL", help=help)


def deployment_id(help: str | None = None) -> Any:
    """``--deployment-id``: whose state (``graphmode watch``'s persisted features) a command reads or writes."""
    return typer.Option("--deployment-id", envvar="GRAPHMODE_DEPLOYMENT_ID", help=help)


def models_dir(help: str | None = None) -> Any:
    """``--models-dir``: the registry root of trained selector models."""
    return typer.Option("--models-dir", help=help)


def model_id(help: str | None = None) -> Any:
    """``--model-id``: one model of the registry instead of the best fingerprint match."""
    return typer.Option("--model-id", help=help)


def state_dir(help: str | None = None) -> Any:
    """``--state-dir``: where per-deployment state files live."""
    return typer.Option("--state-dir", help=help)


def vllm_cmd(help: str | None = None) -> Any:
    """``--vllm-cmd``: the command prefix that starts vLLM."""
    return typer.Option("--vllm-cmd", help=help)


def vllm_version(help: str | None = None) -> Any:
    """``--vllm-version``: the vLLM release the answer is for."""
    return typer.Option("--vllm-version", help=help)


def json_flag(help: str) -> Any:
    """``--json``: machine-readable output (what it prints is the command's own)."""
    return typer.Option("--json", help=help)


def dry_run(help: str) -> Any:
    """``--dry-run``: start nothing (what it prints instead is the command's own)."""
    return typer.Option("--dry-run", help=help)


# The workload description (launch; the fields of graphmode.selector.describe.WorkloadDescription).
WorkloadJson: TypeAlias = Annotated[str | None, typer.Option(
    "--workload", envvar="GRAPHMODE_WORKLOAD",
    help="Workload description JSON (or @file): rate, burstiness, input_tokens, output_tokens, concurrency.")]
Rate: TypeAlias = Annotated[float | None, typer.Option("--rate", help="Described arrival rate, req/s.")]
Burstiness: TypeAlias = Annotated[float | None, typer.Option(
    "--burstiness", help="Gamma shape of gaps; 1 = Poisson.")]
InputTokens: TypeAlias = Annotated[float | None, typer.Option(
    "--input-tokens", help="Described mean prompt length.")]
OutputTokens: TypeAlias = Annotated[float | None, typer.Option(
    "--output-tokens", help="Described mean output length.")]
Concurrency: TypeAlias = Annotated[int | None, typer.Option(
    "--concurrency", help="Client-side cap on requests in flight.")]

# The selector model and its objective.
ModelsDir: TypeAlias = Annotated[Path | None, models_dir("Registry root (default: settings).")]
ModelsDirSetting: TypeAlias = Annotated[Path | None, models_dir("Default: settings.selector.models_dir.")]
Objective: TypeAlias = Annotated[str | None, objective()]
Constraints: TypeAlias = Annotated[list[str] | None, constraint()]
SelectorUrl: TypeAlias = Annotated[str | None, selector_url()]
ModelId: TypeAlias = Annotated[str | None, model_id()]
StateDir: TypeAlias = Annotated[Path | None, state_dir()]
Force: TypeAlias = Annotated[bool, typer.Option("--force", help="Override a cudagraph_mode the user passed.")]

# Starting vLLM and measuring it (profile, retrain).
VllmCmd: TypeAlias = Annotated[str | None, vllm_cmd("Command prefix that starts vLLM.")]
Modes: TypeAlias = Annotated[str | None, typer.Option(
    "--modes", help="Comma-separated modes (default: all five).")]
Workloads: TypeAlias = Annotated[str | None, typer.Option("--workloads", help="Comma-separated workload names.")]
Repeats: TypeAlias = Annotated[int | None, typer.Option(
    "--repeats", min=1, max=20, help="Override every workload's repeats.")]
