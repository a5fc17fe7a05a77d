"""``graphmode watch``: keep one vLLM deployment on the best CUDA Graph mode for its traffic."""

from __future__ import annotations

import contextlib
import logging
import shlex
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from graphmode.cli.common import handle_errors
from graphmode.core.errors import ConfigError, EngineStartError

if TYPE_CHECKING:
    from graphmode.core.records import Fingerprint

console = Console(stderr=True)


def register(app: typer.Typer) -> None:
    @app.command(
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        epilog="Managed mode: everything after -- goes to vLLM. Attached mode (--attach URL) only reports, "
               "unless --k8s-deployment names the Kubernetes Deployment to patch (then it switches).",
    )
    def watch(
        ctx: typer.Context,
        deployment_id: Annotated[str, typer.Option("--deployment-id", envvar="GRAPHMODE_DEPLOYMENT_ID",
                                                   help="Name of this deployment (state file, API).")] = "default",
        attach: Annotated[str | None, typer.Option(
            "--attach", "--server",
            help="Observe a vLLM server graphmode does not run (report-only unless --k8s-deployment).")] = None,
        attach_mode: Annotated[str | None, typer.Option(
            "--attach-mode", help="The attached server's cudagraph_mode.")] = None,
        k8s_deployment: Annotated[str | None, typer.Option(
            "--k8s-deployment", envvar="GRAPHMODE_K8S_DEPLOYMENT",
            help="With --attach: switch by patching this Deployment (NAMESPACE/NAME) from inside the "
                 "cluster; needs get+patch on it.")] = None,
        k8s_container: Annotated[str, typer.Option(
            "--k8s-container", help="The vLLM container of --k8s-deployment whose args are patched.")]
        = "vllm",
        k8s_rollout_timeout: Annotated[float, typer.Option(
            "--k8s-rollout-timeout", min=1,
            help="Seconds a patched rollout may take before it is rolled back.")] = 1200.0,
        listen: Annotated[str, typer.Option("--listen", help="Managed: public HOST:PORT of the proxy.")]
        = "127.0.0.1:8000",
        strategy: Annotated[str, typer.Option(
            "--strategy", help="blue-green (two servers during a switch) or restart (one GPU: downtime).")]
        = "blue-green",
        initial_mode: Annotated[str | None, typer.Option(
            "--initial-mode", help="Managed: first mode (default: the persisted last good one, else "
                                   "the user's, else vLLM's default).")] = None,
        api_port: Annotated[int, typer.Option("--api-port", help="Port of /metrics and /v1/deployments.")]
        = 9100,
        api_host: Annotated[str, typer.Option("--api-host")] = "127.0.0.1",
        interval: Annotated[float, typer.Option("--interval", min=0.1, help="Scrape interval, s.")] = 5.0,
        evaluate_every: Annotated[float, typer.Option("--evaluate-every", min=0.1,
                                                      help="Seconds between decisions.")] = 30.0,
        confirmations: Annotated[int, typer.Option("--confirmations", min=1,
                                                   help="Same winner this many times in a row.")] = 3,
        lost_capacity: Annotated[float | None, typer.Option(
            "--lost-capacity", min=0, max=1,
            help="Capacity lost while a new server starts (default 1 for restart, 0.5 for blue-green).")]
        = None,
        objective: Annotated[str | None, typer.Option("--objective", envvar="GRAPHMODE_OBJECTIVE")] = None,
        constraint: Annotated[list[str] | None, typer.Option("--constraint")] = None,
        selector_url: Annotated[str | None, typer.Option("--selector-url", envvar="GRAPHMODE_SELECTOR_URL")]
        = None,
        models_dir: Annotated[Path | None, typer.Option("--models-dir")] = None,
        model_id: Annotated[str | None, typer.Option("--model-id")] = None,
        state_dir: Annotated[Path | None, typer.Option("--state-dir")] = None,
        vllm_cmd: Annotated[str | None, typer.Option("--vllm-cmd")] = None,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Only report what it would do.")] = False,
        capture_sizes: Annotated[bool, typer.Option(
            "--capture-sizes", help="Also restart with cudagraph_capture_sizes chosen for the observed steps "
            "when that beats the restart cost (managed mode).")] = False,
    ) -> None:
        """Scrape, recommend, and switch mode only when the gain beats the restart cost."""
        import asyncio

        with handle_errors():
            asyncio.run(_watch(ctx.args, deployment_id, attach, attach_mode, listen, strategy, initial_mode,
                               api_host, api_port, interval, evaluate_every, confirmations, lost_capacity,
                               objective, constraint or [], selector_url, models_dir, model_id, state_dir,
                               vllm_cmd, dry_run, k8s_deployment, k8s_container, k8s_rollout_timeout,
                               capture_sizes))


async def _watch(extra: list[str], deployment_id: str, attach: str | None, attach_mode: str | None,
                 listen: str, strategy: str, initial_mode: str | None, api_host: str, api_port: int,
                 interval: float, evaluate_every: float, confirmations: int, lost_capacity: float | None,
                 objective: str | None, constraints: list[str], selector_url: str | None,
                 models_dir: Path | None, model_id: str | None, state_dir: Path | None,
                 vllm_cmd: str | None, dry_run: bool, k8s_deployment: str | None = None,
                 k8s_container: str = "vllm", k8s_rollout_timeout: float = 1200.0,
                 capture_sizes: bool = False) -> None:
    import asyncio

    import uvicorn

    from graphmode.control.choose import ObjectiveSpec
    from graphmode.control.controller import (
        AttachedExecutor,
        Controller,
        ManagedExecutor,
        local_advisor,
        remote_advisor,
    )
    from graphmode.control.k8s import K8sExecutor, KubeClient, parse_deployment_ref
    from graphmode.control.policy import Policy, PolicyConfig
    from graphmode.control.proxy import Proxy
    from graphmode.control.state import check_deployment_id
    from graphmode.core.modes import DEFAULT_MODE, parse_mode
    from graphmode.core.settings import load_settings
    from graphmode.vllm_args import user_mode

    logging.basicConfig(level=logging.INFO, format="%(asctime)s graphmode.watch %(message)s")
    s = load_settings()
    check_deployment_id(deployment_id)
    sdir = state_dir or s.control.state_dir
    args = extra[1:] if extra and extra[0] == "--" else list(extra)
    if k8s_deployment and not attach:
        raise ConfigError("--k8s-deployment needs --attach URL (the Service to scrape /metrics from)")
    if k8s_deployment and args:
        raise ConfigError("--k8s-deployment patches the Deployment's own args: give no vLLM args after --")
    k8s_ref = parse_deployment_ref(k8s_deployment) if k8s_deployment else None
    spec = ObjectiveSpec(objective, tuple(constraints))
    obj = spec.build(s.selector.objective)
    local = None
    command = shlex.split(vllm_cmd) if vllm_cmd else s.vllm.argv()
    target, target_notes = _target(attach, command, args)
    for note in target_notes:
        console.print(f"watch: note: {note}", highlight=False, soft_wrap=True)
    try:
        local = local_advisor(models_dir or s.selector.models_dir, model_id or s.selector.model_id, obj,
                              target=target, vllm_args=args if not attach else None)
    except Exception as exc:  # no local model: the remote one must answer
        if not selector_url:
            raise ConfigError(f"no selector: the local model failed ({exc}) and no --selector-url") from None
        console.print(f"watch: local model unavailable ({exc}); using only {selector_url}")
    advisor = (remote_advisor(selector_url, spec.payload(s.selector.objective), model_id, local)
               if selector_url else local)
    assert advisor is not None
    lost = lost_capacity if lost_capacity is not None else (1.0 if strategy == "restart" else 0.5)
    policy = Policy(PolicyConfig.from_settings(s.control, confirmations=confirmations, lost_capacity=lost))
    proxy: Proxy | None = None
    servers: list[uvicorn.Server] = []
    executor: AttachedExecutor | ManagedExecutor | K8sExecutor
    if attach and k8s_ref:
        # the mode is read from the Deployment (load below), not from --attach-mode
        executor = K8sExecutor(KubeClient(), *k8s_ref, k8s_container,
                               metrics_url=attach, rollout_timeout_s=k8s_rollout_timeout,
                               poll_s=min(5.0, interval))
    elif attach:
        executor = AttachedExecutor(attach, attach_mode)
        dry_run = True
    else:
        if not args:
            raise ConfigError("managed mode needs the vLLM args after -- (or use --attach URL)")
        proxy = Proxy()
        executor = ManagedExecutor(command, args, proxy=proxy,
                                   log_dir=sdir / "logs" / deployment_id, strategy=strategy,
                                   startup_timeout_s=s.vllm.startup_timeout_s,
                                   stop_timeout_s=s.vllm.stop_timeout_s)
    ctl = Controller(deployment_id, executor, advisor, policy, state_dir=sdir, window_s=s.control.window_s,
                     dry_run=dry_run, capture_sizes=capture_sizes)
    if isinstance(executor, ManagedExecutor):
        first = (parse_mode(initial_mode) if initial_mode else
                 parse_mode(ctl.state.last_good_mode) if ctl.state.last_good_mode else
                 user_mode(args) or DEFAULT_MODE)
        console.print(f"watch: starting vLLM in {first.value} ({strategy})")
        res = await executor.start_initial(first)
        if not res.ok:
            raise EngineStartError(f"the first vLLM server did not start: {res.reason}")
        ctl.adopt(res)
        host, _, port = listen.rpartition(":")
        assert proxy is not None
        servers.append(uvicorn.Server(uvicorn.Config(proxy.app, host=host or "127.0.0.1", port=int(port),
                                                     log_level="warning")))
    if isinstance(executor, K8sExecutor):
        res = await asyncio.to_thread(executor.load)  # fails fast on RBAC / a wrong name or container
        console.print(f"watch: Deployment {executor.ref} container {k8s_container} serves {res.mode}"
                      + (" (dry-run: it will not be patched)" if dry_run else ""))
        ctl.adopt(res)
    servers.append(uvicorn.Server(uvicorn.Config(ctl.api(), host=api_host, port=api_port, log_level="warning")))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(srv.serve()) for srv in servers]
    try:
        await ctl.run(interval_s=interval, evaluate_every_s=evaluate_every, stop=stop)
    finally:
        for srv in servers:
            srv.should_exit = True
        for t in tasks:
            with contextlib.suppress(Exception):
                await t
        if isinstance(executor, ManagedExecutor):
            await executor.stop()
        if isinstance(executor, K8sExecutor):
            executor.close()
        if proxy is not None:
            await proxy.aclose()
        ctl.save()


def _target(attach: str | None, command: list[str], args: list[str]) -> tuple[Fingerprint, list[str]]:
    """The fingerprint that picks the local model: what an attached server says about itself (its release,
    and its model's shape where the model directory is readable here), else what the managed vLLM will run
    (:func:`graphmode.control.target.launch_target`)."""
    from graphmode.control.target import launch_target
    from graphmode.selector.registry import target_fingerprint

    if attach:
        target = target_fingerprint(server_url=attach)
        if target.vllm_version is None:
            return target, [f"{attach} did not say its vLLM release (not up yet?): the local model is picked "
                            "without it"]
        return target, []
    return launch_target(command, args)
