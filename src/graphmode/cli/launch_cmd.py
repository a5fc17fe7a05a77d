"""``graphmode launch [options] -- <vllm serve args>``: choose the mode, then exec vLLM with it."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeAlias

import typer
from rich.console import Console

from graphmode.cli import options as o
from graphmode.cli.common import VllmArgsCommand, handle_errors, read_at_file, validation_message, vllm_invocation
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


def check_before_start(args: list[str], vllm_version: str | None, models_dir: Path | None,
                       model_id: str | None) -> Any:
    """``graphmode check`` on the args vLLM will start with; its errors and warnings go to stderr (the launch
    goes ahead: the user asked for it, and ``graphmode check`` is the gate). ``None`` when it cannot run."""
    from graphmode.check.load import inputs_for
    from graphmode.check.rules import check_deployment
    from graphmode.core.errors import GraphmodeError

    try:
        inputs, _ = inputs_for(args, vllm_version=vllm_version, gpu_memory_gib=None, models_dir=models_dir,
                               model_id=model_id)
        report = check_deployment(inputs)
    except GraphmodeError as exc:
        console.print(f"graphmode: check: not run ({exc})", highlight=False, soft_wrap=True)
        return None
    for f in report.findings:
        if f.severity != "info":
            fix = f" (fix: {shlex.join(f.fix)})" if f.fix else ""
            console.print(f"graphmode: check: {f.severity} {f.code}: {f.message}{fix}", highlight=False,
                          soft_wrap=True)
    return report


def start(argv: list[str], decision: dict[str, Any], *, dry_run: bool, as_json: bool, no_exec: bool) -> None:
    """Print the command (``--dry-run``; the decision as JSON with ``--json``), or run vLLM: as a child with
    ``--no-exec``, else exec'd in this process's place."""
    if dry_run:
        typer.echo(json.dumps(decision) if as_json else shlex.join(argv))
        return
    sys.stdout.flush()
    sys.stderr.flush()
    if no_exec:
        raise typer.Exit(run_child(argv))
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        raise EngineError(f"cannot exec {argv[0]!r}: {exc.strerror or exc}") from None


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


# Options only launch has.
DeploymentId: TypeAlias = Annotated[str, o.deployment_id("Whose persisted features (from `graphmode watch`) to use.")]
StateDir: TypeAlias = Annotated[Path | None, o.state_dir("Default: settings.control.state_dir.")]
Objective: TypeAlias = Annotated[str | None, o.objective("Metric to optimise (default: settings.selector.objective).")]
Constraints: TypeAlias = Annotated[list[str] | None, o.constraint("e.g. 'ttft_p99<=200ms' (repeat).")]
SelectorUrl: TypeAlias = Annotated[str | None, o.selector_url(
    "graphmode service to ask first (falls back to the local model).")]
SelectorTimeout: TypeAlias = Annotated[float, typer.Option(
    "--selector-timeout", min=0.05, help="Read timeout for the service, s (connect: 0.3 s).")]
ModelId: TypeAlias = Annotated[str | None, o.model_id("Selector model to use.")]
VllmCmd: TypeAlias = Annotated[str | None, o.vllm_cmd(
    "Command prefix that starts vLLM (default: settings.vllm.command).")]
VllmVersion: TypeAlias = Annotated[str | None, o.vllm_version(
    "vLLM's release, to pick the model trained on it (default: read from the package metadata of the "
    "environment that runs --vllm-cmd).")]
IgnoreState: TypeAlias = Annotated[bool, typer.Option(
    "--ignore-state", help="Do not use features persisted by `watch`.")]
DryRun: TypeAlias = Annotated[bool, o.dry_run("Print the vLLM command; start nothing.")]
AsJson: TypeAlias = Annotated[bool, o.json_flag("With --dry-run: print the decision as JSON.")]
NoExec: TypeAlias = Annotated[bool, typer.Option(
    "--no-exec", help="Run vLLM as a child (signals forwarded) instead of exec'ing it.")]


@dataclass(frozen=True)
class _Selection:
    """What picks the mode when the user's own --compilation-config does not: the objective, where the
    model lives, and the service to ask first."""

    objective: str | None
    constraints: tuple[str, ...]
    selector_url: str | None
    selector_timeout: float
    models_dir: Path
    model_id: str | None
    vllm_version: str | None


def _persisted(desc: Any, ignore_state: bool, state_dir: Path, deployment_id: str) -> tuple[Any, Any]:
    """The features and step sizes ``graphmode watch`` saved for this deployment; none when the user described
    the workload (the description wins) or passed --ignore-state."""
    from graphmode.control.state import load_state

    if desc is not None or ignore_state:
        return None, None
    st = load_state(state_dir, deployment_id)
    return st.last_features, st.last_step_sizes  # the step sizes watch saw: capture sizes for them


def _choose(command: list[str], vllm_args: list[str], mine: Any, force: bool, desc: Any, persisted: tuple[Any, Any],
            sel: _Selection, default_metric: str) -> Any:
    """The user's cudagraph_mode (unless --force), else the selector's choice for this vLLM and workload."""
    from graphmode.control.choose import Choice, ObjectiveSpec, choose_mode

    if mine is not None and not force:
        return Choice(mine, "user", "user", "the user's --compilation-config sets cudagraph_mode")
    from graphmode.control.target import launch_target, served_config

    target, target_notes = launch_target(command, vllm_args, sel.vllm_version)
    served = served_config(command, vllm_args)  # the shape, for the service and for capture sizes
    features, steps = persisted
    choice = choose_mode(
        workload=desc, features=features, objective=ObjectiveSpec(sel.objective, sel.constraints),
        default_metric=default_metric, selector_url=sel.selector_url, models_dir=sel.models_dir,
        model_id=sel.model_id, read_timeout_s=sel.selector_timeout, vllm_args=vllm_args, step_sizes=steps,
        target=target, served_config=served,
    )
    choice.notes[:0] = target_notes
    return choice


def _announce(choice: Any, message: str) -> None:
    for note in choice.notes:
        console.print(f"graphmode: note: {note}", highlight=False, soft_wrap=True)
    console.print(f"graphmode: {message} — source {choice.source}, basis {choice.basis}: "
                  f"{choice.reason} [{choice.elapsed_ms:.0f} ms]", highlight=False, soft_wrap=True)


def launch(
    ctx: typer.Context,
    workload: o.WorkloadJson = None,
    rate: o.Rate = None,
    burstiness: o.Burstiness = None,
    input_tokens: o.InputTokens = None,
    output_tokens: o.OutputTokens = None,
    concurrency: o.Concurrency = None,
    objective: Objective = None,
    constraint: Constraints = None,
    deployment_id: DeploymentId = "default",
    state_dir: StateDir = None,
    selector_url: SelectorUrl = None,
    selector_timeout: SelectorTimeout = 0.7,
    models_dir: o.ModelsDirSetting = None,
    model_id: ModelId = None,
    vllm_cmd: VllmCmd = None,
    vllm_version: VllmVersion = None,
    force: o.Force = False,
    ignore_state: IgnoreState = False,
    dry_run: DryRun = False,
    as_json: AsJson = False,
    no_exec: NoExec = False,
) -> None:
    """Choose the CUDA Graph mode, merge it into vLLM's --compilation-config and start vLLM."""
    with handle_errors():
        from graphmode.control.choose import merge_graph_config, user_choice
        from graphmode.control.state import check_deployment_id
        from graphmode.core.settings import load_settings

        s = load_settings()
        command, vllm_args = vllm_invocation(ctx.args, vllm_cmd, s.vllm.argv(), need_model=False)
        check_deployment_id(deployment_id)
        mine = user_choice(vllm_args)  # validates a user --compilation-config early
        desc = _workload(workload, rate, burstiness, input_tokens, output_tokens, concurrency)
        persisted = _persisted(desc, ignore_state, state_dir or s.control.state_dir, deployment_id)
        sel = _Selection(objective, tuple(constraint or ()), selector_url, selector_timeout,
                         models_dir or s.selector.models_dir, model_id or s.selector.model_id, vllm_version)
        choice = _choose(command, vllm_args, mine, force, desc, persisted, sel, s.selector.objective)
        plan = merge_graph_config(vllm_args, choice.mode, choice.capture, force=force)
        argv = [*command, *plan.args]
        _announce(choice, plan.message)
        report = check_before_start(plan.args, vllm_version, sel.models_dir, sel.model_id)
        start(argv, {**choice.as_dict(), "applied": plan.applied, "argv": argv,
                     "check": report.model_dump(mode="json") if report else None},
              dry_run=dry_run, as_json=as_json, no_exec=no_exec)


def register(app: typer.Typer) -> None:
    """Add ``graphmode launch`` to the app."""
    # vLLM's args only after -- (the image's entrypoint is `graphmode launch --`), as for every command that
    # passes them on: a misspelt launch option is an error, not a vLLM arg that starts the wrong deployment.
    app.command(
        cls=VllmArgsCommand,
        epilog="Everything after -- goes to vLLM (model, --max-model-len, --compilation-config, ...).",
    )(launch)
