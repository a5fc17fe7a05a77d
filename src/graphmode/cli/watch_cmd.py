"""``graphmode watch``: keep one vLLM deployment on the best CUDA Graph mode for its traffic."""

from __future__ import annotations

import contextlib
import logging
import shlex
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeAlias

import typer
from rich.console import Console

from graphmode.cli import options as o
from graphmode.cli.common import VllmArgsCommand, handle_errors
from graphmode.core.errors import ConfigError, EngineStartError

if TYPE_CHECKING:  # the controller's modules load when `graphmode watch` runs, not for --help
    import uvicorn

    from graphmode.control.controller import Advisor, AttachedExecutor, Controller, ManagedExecutor
    from graphmode.control.k8s import K8sExecutor
    from graphmode.control.proxy import Proxy
    from graphmode.core.records import Fingerprint
    from graphmode.core.settings import Settings

    Executor = AttachedExecutor | ManagedExecutor | K8sExecutor

console = Console(stderr=True)


# Options only watch has (its --objective, --constraint, ... carry no help of their own).
DeploymentId: TypeAlias = Annotated[str, o.deployment_id("Name of this deployment (state file, API).")]
Attach: TypeAlias = Annotated[str | None, typer.Option(
    "--attach", "--server",
    help="Observe a vLLM server graphmode does not run (report-only unless --k8s-deployment).")]
AttachMode: TypeAlias = Annotated[str | None, typer.Option(
    "--attach-mode", help="The attached server's cudagraph_mode.")]
K8sDeployment: TypeAlias = Annotated[str | None, typer.Option(
    "--k8s-deployment", envvar="GRAPHMODE_K8S_DEPLOYMENT",
    help="With --attach: switch by patching this Deployment (NAMESPACE/NAME) from inside the "
         "cluster; needs get+patch on it.")]
K8sContainer: TypeAlias = Annotated[str, typer.Option(
    "--k8s-container", help="The vLLM container of --k8s-deployment whose args are patched.")]
K8sRolloutTimeout: TypeAlias = Annotated[float, typer.Option(
    "--k8s-rollout-timeout", min=1, help="Seconds a patched rollout may take before it is rolled back.")]
Listen: TypeAlias = Annotated[str, typer.Option("--listen", help="Managed: public HOST:PORT of the proxy.")]
Strategy: TypeAlias = Annotated[str, typer.Option(
    "--strategy", help="blue-green (two servers during a switch) or restart (one GPU: downtime).")]
InitialMode: TypeAlias = Annotated[str | None, typer.Option(
    "--initial-mode", help="Managed: first mode (default: the persisted last good one, else "
                           "the user's, else vLLM's default).")]
ApiPort: TypeAlias = Annotated[int, typer.Option("--api-port", help="Port of /metrics and /v1/deployments.")]
ApiHost: TypeAlias = Annotated[str, typer.Option("--api-host")]
Interval: TypeAlias = Annotated[float, typer.Option("--interval", min=0.1, help="Scrape interval, s.")]
EvaluateEvery: TypeAlias = Annotated[float, typer.Option(
    "--evaluate-every", min=0.1, help="Seconds between decisions.")]
Confirmations: TypeAlias = Annotated[int, typer.Option(
    "--confirmations", min=1, help="Same winner this many times in a row.")]
LostCapacity: TypeAlias = Annotated[float | None, typer.Option(
    "--lost-capacity", min=0, max=1,
    help="Capacity lost while a new server starts (default 1 for restart, 0.5 for blue-green).")]
ModelsDir: TypeAlias = Annotated[Path | None, o.models_dir()]
VllmCmd: TypeAlias = Annotated[str | None, o.vllm_cmd()]
DryRun: TypeAlias = Annotated[bool, o.dry_run("Only report what it would do.")]
CaptureSizes: TypeAlias = Annotated[bool, typer.Option(
    "--capture-sizes", help="Also restart with cudagraph_capture_sizes chosen for the observed steps "
    "when that beats the restart cost (managed mode).")]


@dataclass
class WatchOptions:
    """``graphmode watch``'s options, as the command line gave them."""

    deployment_id: str = "default"
    attach: str | None = None
    attach_mode: str | None = None
    listen: str = "127.0.0.1:8000"
    strategy: str = "blue-green"
    initial_mode: str | None = None
    api_host: str = "127.0.0.1"
    api_port: int = 9100
    interval: float = 5.0
    evaluate_every: float = 30.0
    confirmations: int = 3
    lost_capacity: float | None = None
    objective: str | None = None
    constraints: list[str] = field(default_factory=list)
    selector_url: str | None = None
    models_dir: Path | None = None
    model_id: str | None = None
    state_dir: Path | None = None
    vllm_cmd: str | None = None
    dry_run: bool = False
    k8s_deployment: str | None = None
    k8s_container: str = "vllm"
    k8s_rollout_timeout: float = 1200.0
    capture_sizes: bool = False


def watch(
    ctx: typer.Context,
    deployment_id: DeploymentId = "default",
    attach: Attach = None,
    attach_mode: AttachMode = None,
    k8s_deployment: K8sDeployment = None,
    k8s_container: K8sContainer = "vllm",
    k8s_rollout_timeout: K8sRolloutTimeout = 1200.0,
    listen: Listen = "127.0.0.1:8000",
    strategy: Strategy = "blue-green",
    initial_mode: InitialMode = None,
    api_port: ApiPort = 9100,
    api_host: ApiHost = "127.0.0.1",
    interval: Interval = 5.0,
    evaluate_every: EvaluateEvery = 30.0,
    confirmations: Confirmations = 3,
    lost_capacity: LostCapacity = None,
    objective: o.Objective = None,
    constraint: o.Constraints = None,
    selector_url: o.SelectorUrl = None,
    models_dir: ModelsDir = None,
    model_id: o.ModelId = None,
    state_dir: o.StateDir = None,
    vllm_cmd: VllmCmd = None,
    dry_run: DryRun = False,
    capture_sizes: CaptureSizes = False,
) -> None:
    """Scrape, recommend, and switch mode only when the gain beats the restart cost."""
    import asyncio

    opts = WatchOptions(
        deployment_id=deployment_id, attach=attach, attach_mode=attach_mode, listen=listen, strategy=strategy,
        initial_mode=initial_mode, api_host=api_host, api_port=api_port, interval=interval,
        evaluate_every=evaluate_every, confirmations=confirmations, lost_capacity=lost_capacity,
        objective=objective, constraints=constraint or [], selector_url=selector_url, models_dir=models_dir,
        model_id=model_id, state_dir=state_dir, vllm_cmd=vllm_cmd, dry_run=dry_run,
        k8s_deployment=k8s_deployment, k8s_container=k8s_container, k8s_rollout_timeout=k8s_rollout_timeout,
        capture_sizes=capture_sizes)
    with handle_errors():
        asyncio.run(_watch(ctx.args, opts))


def register(app: typer.Typer) -> None:
    """Add ``graphmode watch`` to the app."""
    app.command(
        cls=VllmArgsCommand,
        epilog="Managed mode: everything after -- goes to vLLM. Attached mode (--attach URL) only reports, "
               "unless --k8s-deployment names the Kubernetes Deployment to patch (then it switches).",
    )(watch)


def _check_k8s(opts: WatchOptions, args: list[str]) -> None:
    if opts.k8s_deployment and not opts.attach:
        raise ConfigError("--k8s-deployment needs --attach URL (the Service to scrape /metrics from)")
    if opts.k8s_deployment and args:
        raise ConfigError("--k8s-deployment patches the Deployment's own args: give no vLLM args after --")


def _advisor(s: Settings, opts: WatchOptions, command: list[str], args: list[str]) -> Advisor:
    """The local model for this vLLM (its release and model shape), asked through the service first when
    --selector-url names one; without a local model the service must answer alone."""
    from graphmode.control.choose import ObjectiveSpec
    from graphmode.control.controller import local_advisor, remote_advisor

    spec = ObjectiveSpec(opts.objective, tuple(opts.constraints))
    obj = spec.build(s.selector.objective)
    local = None
    target, target_notes = _target(opts.attach, command, args)
    for note in target_notes:
        console.print(f"watch: note: {note}", highlight=False, soft_wrap=True)
    try:
        local = local_advisor(opts.models_dir or s.selector.models_dir, opts.model_id or s.selector.model_id, obj,
                              target=target, vllm_args=args if not opts.attach else None)
    except Exception as exc:  # no local model: the remote one must answer
        if not opts.selector_url:
            raise ConfigError(f"no selector: the local model failed ({exc}) and no --selector-url") from None
        console.print(f"watch: local model unavailable ({exc}); using only {opts.selector_url}")
    advisor = (remote_advisor(opts.selector_url, spec.payload(s.selector.objective), opts.model_id, local)
               if opts.selector_url else local)
    assert advisor is not None
    return advisor


def _executor(s: Settings, opts: WatchOptions, command: list[str], args: list[str], sdir: Path,
              k8s_ref: tuple[str, str] | None) -> tuple[Executor, Proxy | None]:
    """Who switches the mode: a patched Kubernetes Deployment, nobody (attached: report only), or the vLLM
    servers graphmode runs itself behind its proxy (managed)."""
    from graphmode.control.controller import AttachedExecutor, ManagedExecutor
    from graphmode.control.k8s import K8sExecutor, KubeClient
    from graphmode.control.proxy import Proxy

    if opts.attach and k8s_ref:
        # the mode is read from the Deployment (load below), not from --attach-mode
        return K8sExecutor(KubeClient(), *k8s_ref, opts.k8s_container,
                           metrics_url=opts.attach, rollout_timeout_s=opts.k8s_rollout_timeout,
                           poll_s=min(5.0, opts.interval)), None
    if opts.attach:
        return AttachedExecutor(opts.attach, opts.attach_mode), None
    if not args:
        raise ConfigError("managed mode needs the vLLM args after -- (or use --attach URL)")
    proxy = Proxy()
    return ManagedExecutor(command, args, proxy=proxy, log_dir=sdir / "logs" / opts.deployment_id,
                           strategy=opts.strategy, startup_timeout_s=s.vllm.startup_timeout_s,
                           stop_timeout_s=s.vllm.stop_timeout_s), proxy


async def _start_managed(ctl: Controller, executor: ManagedExecutor, proxy: Proxy, opts: WatchOptions,
                         args: list[str]) -> uvicorn.Server:
    """Start the first vLLM server (the asked, last good, user's or default mode) and the proxy before it."""
    import uvicorn

    from graphmode.core.modes import DEFAULT_MODE, parse_mode
    from graphmode.vllm_args import user_mode

    first = (parse_mode(opts.initial_mode) if opts.initial_mode else
             parse_mode(ctl.state.last_good_mode) if ctl.state.last_good_mode else
             user_mode(args) or DEFAULT_MODE)
    console.print(f"watch: starting vLLM in {first.value} ({opts.strategy})")
    res = await executor.start_initial(first)
    if not res.ok:
        raise EngineStartError(f"the first vLLM server did not start: {res.reason}")
    ctl.adopt(res)
    host, _, port = opts.listen.rpartition(":")
    return uvicorn.Server(uvicorn.Config(proxy.app, host=host or "127.0.0.1", port=int(port), log_level="warning"))


async def _adopt_k8s(ctl: Controller, executor: K8sExecutor, opts: WatchOptions, dry_run: bool) -> None:
    import asyncio

    res = await asyncio.to_thread(executor.load)  # fails fast on RBAC / a wrong name or container
    console.print(f"watch: Deployment {executor.ref} container {opts.k8s_container} serves {res.mode}"
                  + (" (dry-run: it will not be patched)" if dry_run else ""))
    ctl.adopt(res)


async def _run(ctl: Controller, executor: Executor, proxy: Proxy | None, servers: list[uvicorn.Server],
               opts: WatchOptions) -> None:
    """Serve the API (and proxy) and run the control loop until SIGINT/SIGTERM; then stop what was started
    and save the state."""
    import asyncio

    from graphmode.control.controller import ManagedExecutor
    from graphmode.control.k8s import K8sExecutor

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(srv.serve()) for srv in servers]
    try:
        await ctl.run(interval_s=opts.interval, evaluate_every_s=opts.evaluate_every, stop=stop)
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


def configure_logging() -> None:
    """Decisions, switches and notes at INFO; httpx's line per request stays at WARNING: the proxy's client
    would log every proxied request, and the scrapes, and bury the decision log under them."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s graphmode.watch %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)


async def _watch(extra: list[str], opts: WatchOptions) -> None:
    import uvicorn

    from graphmode.control.controller import AttachedExecutor, Controller, ManagedExecutor
    from graphmode.control.k8s import K8sExecutor, parse_deployment_ref
    from graphmode.control.policy import Policy, PolicyConfig
    from graphmode.control.state import check_deployment_id
    from graphmode.core.settings import load_settings

    configure_logging()
    s = load_settings()
    check_deployment_id(opts.deployment_id)
    sdir = opts.state_dir or s.control.state_dir
    args = extra[1:] if extra and extra[0] == "--" else list(extra)
    _check_k8s(opts, args)
    k8s_ref = parse_deployment_ref(opts.k8s_deployment) if opts.k8s_deployment else None
    command = shlex.split(opts.vllm_cmd) if opts.vllm_cmd else s.vllm.argv()
    advisor = _advisor(s, opts, command, args)
    lost = opts.lost_capacity if opts.lost_capacity is not None else (1.0 if opts.strategy == "restart" else 0.5)
    policy = Policy(PolicyConfig.from_settings(s.control, confirmations=opts.confirmations, lost_capacity=lost))
    executor, proxy = _executor(s, opts, command, args, sdir, k8s_ref)
    dry_run = opts.dry_run or isinstance(executor, AttachedExecutor)  # attached without k8s: report only
    ctl = Controller(opts.deployment_id, executor, advisor, policy, state_dir=sdir, window_s=s.control.window_s,
                     dry_run=dry_run, capture_sizes=opts.capture_sizes)
    servers: list[uvicorn.Server] = []
    if isinstance(executor, ManagedExecutor):
        assert proxy is not None
        servers.append(await _start_managed(ctl, executor, proxy, opts, args))
    if isinstance(executor, K8sExecutor):
        await _adopt_k8s(ctl, executor, opts, dry_run)
    servers.append(uvicorn.Server(uvicorn.Config(ctl.api(), host=opts.api_host, port=opts.api_port,
                                                 log_level="warning")))
    await _run(ctl, executor, proxy, servers, opts)


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
