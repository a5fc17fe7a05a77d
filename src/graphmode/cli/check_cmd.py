"""``graphmode check [options] -- <vllm serve args>``: the CUDA graph configuration vLLM will build, checked."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from graphmode.cli.common import VllmArgsCommand, handle_errors

out_console = Console()


def register(app: typer.Typer) -> None:
    @app.command(
        cls=VllmArgsCommand,
        epilog="Everything after -- is vLLM's serve args. Exit status 1 when a finding is an error (CI gating).",
    )
    def check(
        ctx: typer.Context,
        vllm_version: Annotated[str | None, typer.Option(
            "--vllm-version", help="vLLM's release (picks the cost model measured on it).")] = None,
        gpu_memory_gib: Annotated[float | None, typer.Option(
            "--gpu-memory-gib", min=1, help="The GPU's memory: vLLM's scheduler defaults and the graphs' share "
                                            "of the KV cache (default: taken as 70 GiB or more, share unknown).")
        ] = None,
        models_dir: Annotated[Path | None, typer.Option(
            "--models-dir", help="Default: settings.selector.models_dir.")] = None,
        model_id: Annotated[str | None, typer.Option("--model-id", help="Selector model for the costs.")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    ) -> None:
        """Check a vLLM command line's CUDA graph configuration before it starts: mode, capture list, costs."""
        with handle_errors():
            from graphmode.check.load import inputs_for
            from graphmode.check.rules import check_deployment
            from graphmode.check.text import report_lines
            from graphmode.core.settings import load_settings

            args = list(ctx.args)
            if args and args[0] == "--":
                args = args[1:]
            s = load_settings()
            inputs, notes = inputs_for(args, vllm_version=vllm_version, gpu_memory_gib=gpu_memory_gib,
                                       models_dir=models_dir or s.selector.models_dir,
                                       model_id=model_id or s.selector.model_id)
            report = check_deployment(inputs)
            if as_json:
                typer.echo(report.model_dump_json())
            else:
                for line in [*(f"[dim]note: {n}[/]" for n in notes), *report_lines(report)]:
                    out_console.print(line, highlight=False, soft_wrap=True)
        if not report.ok:
            raise typer.Exit(1)
