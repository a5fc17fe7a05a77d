"""``graphmode launch [options] -- <vllm serve args>``: choose the mode, then exec vLLM with it."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from graphmode.cli.common import handle_errors, read_at_file, validation_message, vllm_invocation
from graphmode.core.errors import ConfigError, EngineError

console = Console(stderr=True)


def _workload(text: str | None, rate: float | None, burstiness: float | None, input_tokens: float | None,
              output_tokens: float | None, concurrency: int | None) -> Any:
    from pydantic import ValidationError

    from graphmode.selector.describe import WorkloadDescription

    data: dict[str, Any] = {}
    if text:
        raw = read_at_file(text, "--workload")
        try:
            loaded = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--workload is not valid JSON: {exc.msg}") from None
        if not isinstance(loaded, dict):
            raise ConfigError("--workload must be a JSON object {rate, input_tokens, output_tokens, ...}")
        data.update(loaded)
    for key, v in (("rate", rate), ("burstiness", burstiness), ("input_tokens", input_tokens),
                   ("output_tokens", output_tokens), ("concurrency", concurrency)):
        if v is not None:
            data[key] = v
    if not data:
        return None
    try:
        return WorkloadDescription.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"workload description: {validation_message(exc)} "
                          "(need rate, input_tokens, output_tokens)") from None


def run_child(argv: list[str]) -> int:
    """Run vLLM as a child, forwarding SIGINT/SIGTERM to it; its exit status becomes ours."""
    proc = subprocess.Popen(argv)

    def forward(signum: int, _frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return rc if rc >= 0 else 128 - rc


def register(app: typer.Typer) -> None:
    @app.command(
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        epilog="Everything after -- goes to vLLM (model, --max-model-len, --compilation-config, ...).",
    )
    def launch(
        ctx: typer.Context,
        workload: Annotated[str | None, typer.Option(
            "--workload", envvar="GRAPHMODE_WORKLOAD",
            help="Workload description JSON (or @file): rate, burstiness, input_tokens, output_tokens, "
                 "concurrency.")] = None,
        rate: Annotated[float | None, typer.Option("--rate", help="Described arrival rate, req/s.")] = None,
        burstiness: Annotated[float | None, typer.Option(
            "--burstiness", help="Gamma shape of gaps; 1 = Poisson.")] = None,
        input_tokens: Annotated[float | None, typer.Option(
            "--input-tokens", help="Described mean prompt length.")] = None,
        output_tokens: Annotated[float | None, typer.Option(
            "--output-tokens", help="Described mean output length.")] = None,
        concurrency: Annotated[int | None, typer.Option(
            "--concurrency", help="Client-side cap on requests in flight.")] = None,
        objective: Annotated[str | None, typer.Option(
            "--objective", envvar="GRAPHMODE_OBJECTIVE",
            help="Metric to optimise (default: settings.selector.objective).")] = None,
        constraint: Annotated[list[str] | None, typer.Option(
            "--constraint", help="e.g. 'ttft_p99<=200ms' (repeat).")] = None,
        deployment_id: Annotated[str, typer.Option(
            "--deployment-id", envvar="GRAPHMODE_DEPLOYMENT_ID",
            help="Whose persisted features (from `graphmode watch`) to use.")] = "default",
        state_dir: Annotated[Path | None, typer.Option(
            "--state-dir", help="Default: settings.control.state_dir.")] = None,
        selector_url: Annotated[str | None, typer.Option(
            "--selector-url", envvar="GRAPHMODE_SELECTOR_URL",
            help="graphmode service to ask first (falls back to the local model).")] = None,
        selector_timeout: Annotated[float, typer.Option(
            "--selector-timeout", min=0.05, help="Read timeout for the service, s (connect: 0.3 s).")] = 0.7,
        models_dir: Annotated[Path | None, typer.Option(
            "--models-dir", help="Default: settings.selector.models_dir.")] = None,
        model_id: Annotated[str | None, typer.Option("--model-id", help="Selector model to use.")] = None,
        vllm_cmd: Annotated[str | None, typer.Option(
            "--vllm-cmd", help="Command prefix that starts vLLM (default: settings.vllm.command).")] = None,
        vllm_version: Annotated[str | None, typer.Option(
            "--vllm-version", help="vLLM's release, to pick the model trained on it (default: read from the "
                                   "package metadata of the environment that runs --vllm-cmd).")] = None,
        force: Annotated[bool, typer.Option(
            "--force", help="Override a cudagraph_mode the user passed.")] = False,
        ignore_state: Annotated[bool, typer.Option(
            "--ignore-state", help="Do not use features persisted by `watch`.")] = False,
        dry_run: Annotated[bool, typer.Option(
            "--dry-run", help="Print the vLLM command; start nothing.")] = False,
        as_json: Annotated[bool, typer.Option(
            "--json", help="With --dry-run: print the decision as JSON.")] = False,
        no_exec: Annotated[bool, typer.Option(
            "--no-exec", help="Run vLLM as a child (signals forwarded) instead of exec'ing it.")] = False,
    ) -> None:
        """Choose the CUDA Graph mode, merge it into vLLM's --compilation-config and start vLLM."""
        with handle_errors():
            from graphmode.control.choose import ObjectiveSpec, choose_mode, merge_graph_config, user_choice
            from graphmode.control.state import check_deployment_id, load_state
            from graphmode.core.settings import load_settings

            s = load_settings()
            command, vllm_args = vllm_invocation(ctx.args, vllm_cmd, s.vllm.argv(), need_model=False)
            check_deployment_id(deployment_id)
            mine = user_choice(vllm_args)  # validates a user --compilation-config early
            desc = _workload(workload, rate, burstiness, input_tokens, output_tokens, concurrency)
            features = steps = None
            if desc is None and not ignore_state:
                st = load_state(state_dir or s.control.state_dir, deployment_id)
                features = st.last_features
                steps = st.last_step_sizes  # the step sizes watch saw: capture sizes for them
            if mine is not None and not force:
                from graphmode.control.choose import Choice

                choice = Choice(mine, "user", "user", "the user's --compilation-config sets cudagraph_mode")
            else:
                from graphmode.control.target import launch_target, served_config

                target, target_notes = launch_target(command, vllm_args, vllm_version)
                served = served_config(command, vllm_args) if selector_url else None
                choice = choose_mode(
                    workload=desc, features=features,
                    objective=ObjectiveSpec(objective, tuple(constraint or ())),
                    default_metric=s.selector.objective, selector_url=selector_url,
                    models_dir=models_dir or s.selector.models_dir, model_id=model_id or s.selector.model_id,
                    read_timeout_s=selector_timeout, vllm_args=vllm_args, step_sizes=steps, target=target,
                    served_config=served,
                )
                choice.notes[:0] = target_notes
            plan = merge_graph_config(vllm_args, choice.mode, choice.capture, force=force)
            argv = [*command, *plan.args]
            for note in choice.notes:
                console.print(f"graphmode: note: {note}", highlight=False, soft_wrap=True)
            console.print(f"graphmode: {plan.message} — source {choice.source}, basis {choice.basis}: "
                          f"{choice.reason} [{choice.elapsed_ms:.0f} ms]", highlight=False, soft_wrap=True)
            if dry_run:
                if as_json:
                    typer.echo(json.dumps({**choice.as_dict(), "applied": plan.applied, "argv": argv}))
                else:
                    typer.echo(shlex.join(argv))
                return
            sys.stdout.flush()
            sys.stderr.flush()
            if no_exec:
                raise typer.Exit(run_child(argv))
            try:
                os.execvp(argv[0], argv)
            except OSError as exc:
                raise EngineError(f"cannot exec {argv[0]!r}: {exc.strerror or exc}") from None
