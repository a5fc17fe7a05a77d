"""``graphmode watch``: one controller for one vLLM deployment.

Loop: scrape the active server's ``/metrics`` into a sliding :class:`FeatureWindow`; every evaluation
compute the features, ask the advisor (local model or remote service), let the :class:`Policy` decide,
log the decision with its numbers, persist the state, and — unless dry-run — switch.

Executors (how a switch happens):

* :class:`ManagedExecutor` — watch owns vLLM. ``blue-green``: start the new server on another port, wait
  for ``/health`` and a smoke request, flip the proxy, drain the old one (in-flight requests complete),
  stop it. ``restart`` (one GPU): drain, stop, start the new one on the same port; the downtime is
  measured and stated. If the new server fails, the previous command is started again (restart) or
  simply kept (blue-green), and the reason recorded.
* :class:`AttachedExecutor` — observe a server someone else runs; it can only report (dry-run).
* :class:`~graphmode.control.k8s.K8sExecutor` — attached to a vLLM Deployment on Kubernetes
  (``--attach URL --k8s-deployment NS/NAME``): a switch patches the container's args and Kubernetes rolls
  the Deployment (the old pod serves until the new one is Ready); a rollout that fails or misses its
  deadline is rolled back by patching the previous args back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from graphmode.control.policy import Advice, Decision, Policy
from graphmode.control.proxy import Proxy, Upstream
from graphmode.control.state import DeploymentState, load_state, save_state
from graphmode.core.errors import EngineError, GraphmodeError, ScrapeError
from graphmode.core.modes import CudaGraphMode, parse_mode
from graphmode.core.records import Fingerprint, ObservedFeatures
from graphmode.profiling.engine import VllmServer
from graphmode.profiling.features import FeatureWindow
from graphmode.profiling.hostload import Counters, counters, usage
from graphmode.profiling.metrics import scrape_sync
from graphmode.selector.frontend import frontend_note, process_note
from graphmode.vllm_args import with_mode

log = logging.getLogger("graphmode.watch")
Advisor = Callable[[ObservedFeatures], Advice | None]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class SwitchResult:
    ok: bool
    mode: str
    reason: str
    startup_s: float | None = None
    downtime_s: float | None = None
    command: list[str] | None = None


class Executor(Protocol):
    mode: str | None

    def metrics_url(self) -> str | None: ...

    def command(self) -> list[str] | None: ...

    async def switch(self, mode: CudaGraphMode, vllm_args: list[str] | None = None) -> SwitchResult: ...


class AttachedExecutor:
    """A server run by someone else: observe only."""

    def __init__(self, url: str, mode: str | None) -> None:
        self.url = url.rstrip("/")
        self.mode = mode

    def metrics_url(self) -> str | None:
        return self.url + "/metrics"

    def command(self) -> list[str] | None:
        return None

    async def switch(self, mode: CudaGraphMode, vllm_args: list[str] | None = None) -> SwitchResult:
        return SwitchResult(False, mode.value, "attached to a server graphmode does not run: report only")


class ManagedExecutor:
    def __init__(self, command: list[str], vllm_args: list[str], *, proxy: Proxy, log_dir: Path,
                 strategy: str = "blue-green", host: str = "127.0.0.1", startup_timeout_s: float = 900.0,
                 stop_timeout_s: float = 30.0, drain_timeout_s: float = 120.0) -> None:
        if strategy not in ("blue-green", "restart"):
            raise GraphmodeError(f"unknown switch strategy {strategy!r}: blue-green or restart")
        self.base_command = command
        self.vllm_args = list(vllm_args)
        self.proxy = proxy
        self.log_dir = log_dir
        self.strategy = strategy
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.server: VllmServer | None = None
        self.upstream: Upstream | None = None
        self.mode: str | None = None
        self._n = 0

    def metrics_url(self) -> str | None:
        return self.server.base_url + "/metrics" if self.server else None

    def command(self) -> list[str] | None:
        return self.server.argv if self.server else None

    def _new_server(self, mode: CudaGraphMode, args: list[str], port: int) -> VllmServer:
        self._n += 1
        return VllmServer(self.base_command, with_mode(args, mode), mode=None, host=self.host, port=port,
                          log_path=self.log_dir / f"vllm-{self._n}-{mode.value}.log",
                          startup_timeout_s=self.startup_timeout_s, stop_timeout_s=self.stop_timeout_s)

    async def _start(self, srv: VllmServer) -> str | None:
        """Start and smoke-test ``srv``; the reason on failure (the server is then stopped)."""
        try:
            await asyncio.to_thread(srv.start)
        except EngineError as exc:
            tail = exc.log_tail.strip().splitlines()[-3:]
            return f"{exc}" + (f": {' | '.join(tail)}" if tail else "")
        why = await asyncio.to_thread(smoke_test, srv)
        if why:
            await asyncio.to_thread(srv.stop)
        return why

    async def start_initial(self, mode: CudaGraphMode, port: int | None = None) -> SwitchResult:
        srv = self._new_server(mode, self.vllm_args, port or free_port(self.host))
        why = await self._start(srv)
        if why:
            return SwitchResult(False, mode.value, why, command=srv.argv)
        self._activate(srv, mode)
        return SwitchResult(True, mode.value, "started", startup_s=srv.startup_s, command=srv.argv)

    def _activate(self, srv: VllmServer, mode: CudaGraphMode) -> None:
        self.server, self.mode = srv, mode.value
        self.upstream = Upstream(f"{mode.value}@{srv.port}", srv.base_url)
        self.proxy.active = self.upstream

    async def switch(self, mode: CudaGraphMode, vllm_args: list[str] | None = None) -> SwitchResult:
        old, old_up = self.server, self.upstream
        assert old is not None and old_up is not None and self.mode is not None
        old_mode = parse_mode(self.mode)
        args = vllm_args if vllm_args is not None else self.vllm_args
        if self.strategy == "blue-green":
            new = self._new_server(mode, args, free_port(self.host))
            why = await self._start(new)
            if why:
                return SwitchResult(False, mode.value, f"new server failed, old one kept serving: {why}",
                                    command=new.argv)
            self._activate(new, mode)
            left = await self.proxy.drain(old_up, self.drain_timeout_s)
            await asyncio.to_thread(old.stop)
            note = f"; {left} requests still in flight on the old server were cut" if left else ""
            return SwitchResult(True, mode.value, f"blue-green switch, no downtime{note}",
                                startup_s=new.startup_s, downtime_s=0.0, command=new.argv)
        # stop-then-start on the same port: the accelerator holds one server at a time.
        t0 = time.monotonic()
        self.proxy.active = None
        await self.proxy.drain(old_up, self.drain_timeout_s)
        await asyncio.to_thread(old.stop)
        new = self._new_server(mode, args, old.port)
        why = await self._start(new)
        if not why:
            self._activate(new, mode)
            down = time.monotonic() - t0
            return SwitchResult(True, mode.value, f"stop-then-start: {down:.0f} s of downtime",
                                startup_s=new.startup_s, downtime_s=down, command=new.argv)
        back = self._new_server(old_mode, self.vllm_args, old.port)
        why_back = await self._start(back)
        down = time.monotonic() - t0
        if why_back:
            return SwitchResult(False, mode.value, f"new server failed ({why}) and the rollback failed too "
                                f"({why_back}): NOTHING IS SERVING", downtime_s=down, command=new.argv)
        self._activate(back, old_mode)
        return SwitchResult(False, mode.value, f"new server failed, rolled back to {old_mode.value} after "
                            f"{down:.0f} s of downtime: {why}", downtime_s=down, command=new.argv)

    async def stop(self) -> None:
        self.proxy.active = None
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)


def smoke_test(srv: VllmServer, timeout_s: float = 120.0) -> str | None:
    """One tiny completion (token-id prompt: works without a tokenizer); None when it succeeds."""
    body = {"model": srv.served_model_name() or "", "prompt": [1, 2, 3, 4], "max_tokens": 2, "temperature": 0}
    try:
        r = httpx.post(srv.base_url + "/v1/completions", json=body, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return f"smoke request failed: {exc!r}"
    if r.status_code != 200:
        return f"smoke request answered HTTP {r.status_code}: {r.text[:200]}"
    return None


class Controller:
    def __init__(self, deployment_id: str, executor: Executor, advisor: Advisor, policy: Policy, *,
                 state_dir: Path, window_s: float = 60.0, dry_run: bool = False,
                 capture_sizes: bool = False) -> None:
        self.deployment_id = deployment_id
        self.capture_sizes = capture_sizes  # also weigh restarts with capture sizes chosen for the traffic
        self.executor = executor
        self.advisor = advisor
        self.policy = policy
        self.state_dir = state_dir
        self.dry_run = dry_run
        self.window = FeatureWindow(window_s)
        self.injected: ObservedFeatures | None = None
        self.state: DeploymentState = load_state(state_dir, deployment_id)
        self.last_decision: Decision | None = None
        self._cpu_seen: Counters | None = None  # the served vLLM's process tree at the last step
        self._lock = asyncio.Lock()
        self.registry = CollectorRegistry()
        labels = ["deployment"]
        self.m_mode = Gauge("graphmode_watch_mode", "1 for the mode being served", ["deployment", "mode"],
                            registry=self.registry)
        self.m_decisions = Counter("graphmode_watch_decisions", "policy decisions", ["deployment", "action"],
                                   registry=self.registry)
        self.m_switches = Counter("graphmode_watch_switches", "switch attempts", ["deployment", "result"],
                                  registry=self.registry)
        self.m_gain = Gauge("graphmode_watch_predicted_gain", "relative gain of the best mode", labels,
                            registry=self.registry)
        self.m_benefit = Gauge("graphmode_watch_benefit", "gain x horizon x rate", labels, registry=self.registry)
        self.m_cost = Gauge("graphmode_watch_restart_cost", "startup x lost capacity x rate", labels,
                            registry=self.registry)
        self.m_rate = Gauge("graphmode_watch_request_rate", "observed arrival rate, req/s", labels,
                            registry=self.registry)
        self.m_downtime = Gauge("graphmode_watch_last_downtime_seconds", "downtime of the last switch", labels,
                                registry=self.registry)

    # ------------------------------------------------------------------ state
    def save(self) -> None:
        self.state.updated_at = time.time()
        save_state(self.state_dir, self.state)

    def adopt(self, result: SwitchResult) -> None:
        """Record the server that is serving now as current and last good."""
        self.state.current_mode = result.mode
        self.state.current_command = result.command
        self.state.last_good_mode = result.mode
        self.state.last_good_command = result.command
        if result.startup_s is not None:
            self.state.startup_s = result.startup_s
        if self.state.policy.mode_since is None or self.executor.mode != result.mode:
            self.state.policy.mode_since = self.policy.clock()
        self._set_mode_metric()
        self.save()

    def _set_mode_metric(self) -> None:
        for m in CudaGraphMode:
            self.m_mode.labels(self.deployment_id, m.value).set(1 if m.value == self.executor.mode else 0)

    # ------------------------------------------------------------------ loop
    def scrape(self) -> None:
        url = self.executor.metrics_url()
        if url is None:
            return
        try:
            self.window.add(scrape_sync(url, clock=time.time))
        except (ScrapeError, ValueError) as exc:
            log.debug("scrape failed: %s", exc)

    def features(self) -> ObservedFeatures | None:
        if self.injected is not None:
            return self.injected
        if len(self.window) < 2:
            return None
        return self.window.features()

    async def step(self) -> Decision:
        """One evaluation: features → advice → decision (→ switch). Serialised by a lock."""
        async with self._lock:
            current = self.executor.mode or self.state.current_mode or "FULL_AND_PIECEWISE"
            feats = self.features()
            advice: Advice | None = None
            if feats is not None:
                self.state.last_features = feats.model_dump()
                self.state.last_features_at = time.time()
                steps = None if self.injected is not None else self.window.step_sizes()
                if steps is not None:
                    self.state.last_step_sizes = steps.model_dump(mode="json")
                try:
                    advice = await asyncio.to_thread(self.advisor, feats)
                except GraphmodeError as exc:
                    log.warning("advisor failed: %s", exc)
            rate = None if feats is None else (feats.arrival_rate if feats.arrival_rate is not None
                                               else feats.completion_rate)
            d = self.policy.evaluate(self.state.policy, current, advice, startup_s=self.state.startup_s,
                                     rate=rate)
            notes = [n for n in (frontend_note(feats.frontend_cpu_cores) if feats is not None else None,
                                 self._process_note()) if n]
            self.record(d, list(dict.fromkeys(notes)))
            if d.switch and d.target is not None:
                if self.dry_run:
                    log.info("dry-run: would switch %s → %s", current, d.target)
                else:
                    await self._switch(parse_mode(d.target))
            elif self.capture_sizes and d.action == "stay" and self.injected is None:
                await self._capture_step(current, advice, rate)
            self.save()
            return d

    def _process_note(self) -> str | None:
        """A note when one process of the vLLM that graphmode runs used a full core since the last step (its
        busiest process: with several API servers vLLM exports no process metrics, and the engine core
        never did). Observe-only deployments run elsewhere: None."""
        ex = self.executor
        pid = ex.server.pid if isinstance(ex, ManagedExecutor) and ex.server is not None else None
        now = counters(pid) if pid is not None else None
        before, self._cpu_seen = self._cpu_seen, now
        if before is None or now is None:
            return None
        u = usage(before, now)  # only processes in both snapshots: a switch in between reads None
        cores, title = u["engine_busiest_cores"], u["engine_busiest_process"]
        return process_note(str(title) if title else None, cores if isinstance(cores, float) else None)

    async def _capture_step(self, current: str, advice: Advice | None, rate: float | None) -> None:
        """A capture-size change for the current mode, weighed like a mode switch (policy.capture_decision)."""
        from graphmode.control.policy import capture_decision

        args = getattr(self.executor, "vllm_args", None)
        steps = self.window.step_sizes()
        if current == "NONE" or not isinstance(args, list) or steps is None:
            return
        cd, new_args = capture_decision(self.policy, self.state.policy, current, args, steps, advice, rate=rate,
                                        startup_s=self.state.startup_s)
        self.record(cd)
        if cd.switch and new_args is not None:
            if self.dry_run:
                log.info("dry-run: would restart %s with capture sizes %s", current, cd.target)
                return
            res = await self._switch(parse_mode(current), new_args)
            if res.ok:
                self.executor.vllm_args = new_args  # type: ignore[attr-defined]

    def record(self, d: Decision, notes: Sequence[str] = ()) -> None:
        """Log ``d`` with ``notes``: advice that does not change the decision (a saturated frontend)."""
        self.last_decision = d
        entry = d.as_dict()
        entry["dry_run"] = self.dry_run
        if notes:
            entry["notes"] = list(notes)
        self.state.add_decision(entry)
        self.m_decisions.labels(self.deployment_id, d.action).inc()
        for g, key in ((self.m_gain, "gain"), (self.m_benefit, "benefit"), (self.m_cost, "cost"),
                       (self.m_rate, "rate")):
            v = d.numbers.get(key)
            if isinstance(v, (int, float)):
                g.labels(self.deployment_id).set(float(v))
        log.info("%s%s", "[dry-run] " if self.dry_run else "", d.line())
        for n in notes:
            log.info("note: %s", n)

    async def switch(self, mode: CudaGraphMode, vllm_args: list[str] | None = None) -> SwitchResult:
        async with self._lock:
            return await self._switch(mode, vllm_args)

    async def _switch(self, mode: CudaGraphMode, vllm_args: list[str] | None = None) -> SwitchResult:
        before = self.executor.mode
        log.info("switching %s → %s", before, mode.value)
        res = await self.executor.switch(mode, vllm_args)
        self.policy.record_attempt(self.state.policy, before, mode.value, res.ok, res.reason, res.downtime_s)
        if res.downtime_s is not None:
            self.m_downtime.labels(self.deployment_id).set(res.downtime_s)
        self.m_switches.labels(self.deployment_id, "ok" if res.ok else "failed").inc()
        if res.ok:
            self.state.switches += 1
            self.window = FeatureWindow(self.window.window_s)
            self.injected = None
            self.adopt(res)
            log.info("switched to %s: %s", mode.value, res.reason)
        else:
            self.state.failed_switches += 1
            self.state.last_error = res.reason
            self.state.current_mode = self.executor.mode
            self._set_mode_metric()
            log.warning("switch to %s failed: %s", mode.value, res.reason)
        self.state.add_decision({"t": time.time(), "action": "switched" if res.ok else "switch-failed",
                                 "target": mode.value, "reason": res.reason, "downtime_s": res.downtime_s,
                                 "startup_s": res.startup_s})
        self.save()
        return res

    async def run(self, *, interval_s: float, evaluate_every_s: float, stop: asyncio.Event) -> None:
        last_eval = time.monotonic()
        while not stop.is_set():
            await asyncio.to_thread(self.scrape)
            if time.monotonic() - last_eval >= evaluate_every_s:
                last_eval = time.monotonic()
                await self.step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval_s)

    # ------------------------------------------------------------------ API
    def snapshot(self) -> dict[str, Any]:
        data = self.state.model_dump(mode="json")
        data["serving_mode"] = self.executor.mode
        data["dry_run"] = self.dry_run
        data["last_decision"] = self.last_decision.as_dict() if self.last_decision else None
        data["decisions"] = data["decisions"][-50:]
        return data

    def api(self) -> Starlette:
        async def health(_: Request) -> Response:
            return JSONResponse({"status": "ok", "serving_mode": self.executor.mode})

        async def metrics(_: Request) -> Response:
            return PlainTextResponse(generate_latest(self.registry).decode(),
                                     media_type="text/plain; version=0.0.4")

        async def deployment(request: Request) -> Response:
            if request.path_params["id"] != self.deployment_id:
                return JSONResponse({"error": f"unknown deployment {request.path_params['id']!r}"},
                                    status_code=404)
            return JSONResponse(self.snapshot())

        return Starlette(routes=[Route("/health", health), Route("/metrics", metrics),
                                 Route("/v1/deployments/{id}", deployment)])


def local_advisor(models_dir: Path, model_id: str | None, objective: Any, *, target: Fingerprint | None = None,
                  vllm_args: Sequence[str] | None = None) -> Advisor:
    """The local model's advice for observed features: the model ``target`` picks (the deployment's GPU,
    release and served model, :mod:`graphmode.control.target`), answering for the configuration of
    ``vllm_args`` (its race verdicts, and what vLLM would downgrade)."""
    from graphmode.control.choose import deployment_of_args
    from graphmode.control.policy import advice_from_recommendation
    from graphmode.selector.decide import Request, decide
    from graphmode.selector.recommend import Recommender

    rec = Recommender.load(models_dir, model_id, target=target)
    if vllm_args is not None:  # once: the deployment does not change while it is watched
        rec = rec.for_deployment(deployment_of_args(vllm_args))

    def advise(feats: ObservedFeatures) -> Advice | None:
        return advice_from_recommendation(decide(rec, Request(inputs=feats, objective=objective,
                                                               source="observed")))

    return advise


_NOT_SENT = frozenset({"frontend_cpu_cores", "spec_acceptance_rate", "spec_accept_length"})


def remote_advisor(url: str, objective_payload: dict[str, Any], model_id: str | None,
                   fallback: Advisor | None) -> Advisor:
    from graphmode.control.choose import remote_recommend
    from graphmode.control.policy import advice_from_recommendation

    def advise(feats: ObservedFeatures) -> Advice | None:
        # frontend_cpu_cores only feeds a note the watch writes itself, and no model reads the speculative
        # decoding fields; a service older than a field would refuse the whole request over it
        body: dict[str, Any] = {"features": {k: v for k, v in feats.model_dump().items()
                                             if v is not None and k not in _NOT_SENT},
                                "objective": objective_payload}
        if model_id:
            body["model_id"] = model_id
        try:
            _, data = remote_recommend(url, body, connect_timeout_s=1.0, read_timeout_s=5.0)
            return advice_from_recommendation(data)
        except (GraphmodeError, KeyError, TypeError) as exc:
            if fallback is None:
                raise GraphmodeError(f"selector service: {exc}") from None
            log.warning("selector service failed (%s): using the local model", exc)
            return fallback(feats)

    return advise
