"""Switching mode on Kubernetes: patch the vLLM Deployment's container args and let Kubernetes roll it.

:class:`K8sExecutor` is the Kubernetes counterpart of :class:`~graphmode.control.controller.ManagedExecutor`.
A switch:

1. GETs the Deployment (``apps/v1``), finds the container by name and computes the new args with
   :func:`~graphmode.vllm_args.with_mode` (only ``cudagraph_mode`` changes; every other compilation-config
   key and every other flag is kept);
2. PATCHes them (strategic merge: containers merge by name, so only that container's ``args`` change;
   the patch carries the ``resourceVersion`` it was computed from, so a concurrent edit makes it fail
   with 409 instead of being overwritten). Kubernetes rolls the Deployment: with RollingUpdate the old
   pod keeps serving until the new one is Ready, which is the "start the new one, move traffic, drain
   the old one" of blue/green;
3. polls the Deployment until the rollout is complete (as ``kubectl rollout status``) or fails
   (``ProgressDeadlineExceeded``) or our own deadline passes;
4. on failure PATCHes the previous args back (rollback), waits for that rollout, and reports why.

Only ``get`` and ``patch`` on that one Deployment are needed (the rollout status is part of the object
GET returns): the RBAC in ``deploy/k8s/controller.yaml``.

:class:`KubeClient` is a small httpx client with in-cluster configuration: ``KUBERNETES_SERVICE_HOST`` /
``KUBERNETES_SERVICE_PORT``, the service-account token re-read on every request (it is rotated), and the
cluster CA. Tests pass ``base_url``, ``token`` and ``verify`` instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from graphmode.control.controller import SwitchResult
from graphmode.core.errors import ConfigError, GraphmodeError
from graphmode.core.modes import DEFAULT_MODE, CudaGraphMode
from graphmode.vllm_args import user_mode, with_mode

log = logging.getLogger("graphmode.watch")

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_PATH = SA_DIR / "token"
CA_PATH = SA_DIR / "ca.crt"
STRATEGIC_MERGE = "application/strategic-merge-patch+json"


class KubernetesError(GraphmodeError):
    """The Kubernetes API refused or failed a request (``status`` is the HTTP status, None if unreachable)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def parse_deployment_ref(value: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` (or ``NAME``: namespace from the pod's service account, else ``default``)."""
    ns, sep, name = value.partition("/")
    if not sep:
        ns, name = _in_cluster_namespace(), value
    if not ns or not name or "/" in name:
        raise ConfigError(f"--k8s-deployment must be NAMESPACE/NAME, got {value!r}")
    return ns, name


def _in_cluster_namespace() -> str:
    try:
        return (SA_DIR / "namespace").read_text().strip() or "default"
    except OSError:
        return "default"


class KubeClient:
    """GET and strategic-merge PATCH of apps/v1 Deployments."""

    def __init__(self, base_url: str | None = None, *, token: str | Callable[[], str | None] | None = None,
                 verify: bool | str | ssl.SSLContext | None = None, connect_timeout_s: float = 5.0,
                 read_timeout_s: float = 30.0) -> None:
        if base_url is None:
            host = os.environ.get("KUBERNETES_SERVICE_HOST")
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise ConfigError("not running in a Kubernetes pod: KUBERNETES_SERVICE_HOST is not set "
                                  "(--k8s-deployment needs the in-cluster API)")
            if ":" in host and not host.startswith("["):  # IPv6
                host = f"[{host}]"
            base_url = f"https://{host}:{port}"
        self.base_url = base_url.rstrip("/")
        self._token: Callable[[], str | None]
        if token is None:
            self._token = _read_token
        elif isinstance(token, str):
            tok = token
            self._token = lambda: tok
        else:
            self._token = token
        if verify is None:
            verify = str(CA_PATH) if CA_PATH.exists() else True
        ctx: bool | ssl.SSLContext = ssl.create_default_context(cafile=verify) if isinstance(verify, str) \
            else verify
        self._http = httpx.Client(verify=ctx, timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s))

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, body: Any = None, content_type: str | None = None) -> Any:
        headers = {"Accept": "application/json"}
        tok = self._token()
        if tok:
            headers["Authorization"] = f"Bearer {tok}"
        if content_type:
            headers["Content-Type"] = content_type
        url = self.base_url + path
        try:
            r = self._http.request(method, url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise KubernetesError(f"Kubernetes API {method} {path}: {exc!r}") from None
        if r.status_code >= 400:
            raise KubernetesError(_explain(method, path, r), r.status_code)
        try:
            return r.json()
        except ValueError:
            raise KubernetesError(f"Kubernetes API {method} {path}: not JSON: {r.text[:200]!r}",
                                  r.status_code) from None

    @staticmethod
    def deployment_path(namespace: str, name: str) -> str:
        return f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"

    def get_deployment(self, namespace: str, name: str) -> dict[str, Any]:
        out = self._request("GET", self.deployment_path(namespace, name))
        if not isinstance(out, dict):
            raise KubernetesError(f"Kubernetes API GET deployment {namespace}/{name}: not an object")
        return out

    def patch_deployment(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        out = self._request("PATCH", self.deployment_path(namespace, name), patch, STRATEGIC_MERGE)
        if not isinstance(out, dict):
            raise KubernetesError(f"Kubernetes API PATCH deployment {namespace}/{name}: not an object")
        return out


def _read_token() -> str | None:
    try:
        return TOKEN_PATH.read_text().strip() or None
    except OSError:
        return None


def _explain(method: str, path: str, r: httpx.Response) -> str:
    try:
        detail = str(r.json().get("message") or r.text)
    except (ValueError, AttributeError):
        detail = r.text
    detail = detail.strip()[:300]
    head = f"Kubernetes API {method} {path}: HTTP {r.status_code}"
    if r.status_code == 401:
        return f"{head} unauthorized (no or an expired service-account token): {detail}"
    if r.status_code == 403:
        verb = "get" if method == "GET" else "patch"
        return (f"{head} forbidden: the controller's service account lacks '{verb}' on this Deployment "
                f"(RBAC: deploy/k8s/controller.yaml grants get+patch on deployments/<name>): {detail}")
    if r.status_code == 404:
        return f"{head} not found (wrong --k8s-deployment NAMESPACE/NAME?): {detail}"
    if r.status_code == 409:
        return f"{head} conflict: the Deployment changed since it was read: {detail}"
    return f"{head}: {detail}"


def container_args(dep: dict[str, Any], container: str) -> list[str]:
    containers = dep.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []) or []
    for c in containers:
        if c.get("name") == container:
            return [str(a) for a in c.get("args") or []]
    names = ", ".join(str(c.get("name")) for c in containers) or "none"
    raise ConfigError(f"Deployment {dep.get('metadata', {}).get('name')!r} has no container {container!r} "
                      f"(it has: {names})")


def args_patch(container: str, args: list[str], resource_version: str | None = None) -> dict[str, Any]:
    patch: dict[str, Any] = {"spec": {"template": {"spec": {"containers": [{"name": container,
                                                                           "args": list(args)}]}}}}
    if resource_version:
        patch["metadata"] = {"resourceVersion": resource_version}
    return patch


def rollout_status(dep: dict[str, Any]) -> tuple[bool, str | None]:
    """``(done, failure)`` of the Deployment's latest rollout, the way ``kubectl rollout status`` reads it.

    ``failure`` is set when the rollout cannot complete (``ProgressDeadlineExceeded``); ``done`` when the
    controller has seen the latest spec and every replica is updated and available, none unavailable and
    no old replica left.
    """
    meta, spec, st = dep.get("metadata", {}), dep.get("spec", {}), dep.get("status", {}) or {}
    generation = int(meta.get("generation") or 0)
    if int(st.get("observedGeneration") or 0) < generation:
        return False, None
    for cond in st.get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            return False, f"ProgressDeadlineExceeded: {cond.get('message') or 'the rollout made no progress'}"
    want = int(spec.get("replicas", 1))
    updated = int(st.get("updatedReplicas") or 0)
    available = int(st.get("availableReplicas") or 0)
    unavailable = int(st.get("unavailableReplicas") or 0)
    total = int(st.get("replicas") or 0)
    done = updated == available == want and unavailable == 0 and total <= want
    return done, None


class K8sExecutor:
    """Switch by patching a Deployment's container args; Kubernetes rolls it (see the module docstring)."""

    def __init__(self, client: KubeClient, namespace: str, name: str, container: str, *,
                 metrics_url: str | None = None, rollout_timeout_s: float = 1200.0, poll_s: float = 5.0) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.container = container
        self._metrics_url = metrics_url.rstrip("/") + "/metrics" if metrics_url else None
        self.rollout_timeout_s = rollout_timeout_s
        self.poll_s = poll_s
        self.args: list[str] | None = None
        self.mode: str | None = None

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def metrics_url(self) -> str | None:
        return self._metrics_url

    def command(self) -> list[str] | None:
        return self.args

    def _get(self) -> dict[str, Any]:
        return self.client.get_deployment(self.namespace, self.name)

    def load(self) -> SwitchResult:
        """Read the Deployment: the serving mode is its explicit ``cudagraph_mode``, else vLLM's default.

        Raises :class:`KubernetesError` (unreachable, 401/403/404) or :class:`ConfigError` (no such
        container, unreadable compilation config): the controller should not start then.
        """
        dep = self._get()
        args = container_args(dep, self.container)
        mode = user_mode(args) or DEFAULT_MODE
        self.args, self.mode = args, mode.value
        return SwitchResult(True, mode.value, f"observed Deployment {self.ref}", command=args)

    async def _wait(self, deadline: float) -> str | None:
        """Poll until the rollout completes (None) or fails / the deadline passes (the reason)."""
        last_err: str | None = None
        while True:
            try:
                dep = await asyncio.to_thread(self._get)
            except KubernetesError as exc:
                if exc.status in (401, 403, 404):
                    return str(exc)
                last_err = str(exc)  # transient (unreachable, 5xx): keep polling until the deadline
                log.warning("rollout status of %s: %s", self.ref, exc)
            else:
                done, failure = rollout_status(dep)
                if failure:
                    return failure
                if done:
                    return None
            left = deadline - time.monotonic()
            if left <= 0:
                return (f"the rollout did not complete within {self.rollout_timeout_s:.0f} s"
                        + (f" (last error: {last_err})" if last_err else ""))
            await asyncio.sleep(min(self.poll_s, left))

    async def switch(self, mode: CudaGraphMode, vllm_args: list[str] | None = None) -> SwitchResult:
        try:
            dep = await asyncio.to_thread(self._get)
            current = container_args(dep, self.container)
        except GraphmodeError as exc:
            return SwitchResult(False, mode.value, f"could not read Deployment {self.ref}: {exc}")
        before_mode = user_mode(current) or DEFAULT_MODE
        self.args, self.mode = current, before_mode.value
        new = with_mode(vllm_args if vllm_args is not None else current, mode)
        recreate = (dep.get("spec", {}).get("strategy") or {}).get("type") == "Recreate"
        rv = dep.get("metadata", {}).get("resourceVersion")
        t0 = time.monotonic()
        try:
            await asyncio.to_thread(self.client.patch_deployment, self.namespace, self.name,
                                    args_patch(self.container, new, rv))
        except GraphmodeError as exc:
            return SwitchResult(False, mode.value, f"patching Deployment {self.ref} failed, nothing changed: "
                                                   f"{exc}", command=new)
        log.info("patched %s container %s: rolling out %s", self.ref, self.container, mode.value)
        why = await self._wait(t0 + self.rollout_timeout_s)
        took = time.monotonic() - t0
        if why is None:
            self.args, self.mode = new, mode.value
            how = ("Recreate rollout: the old pod was stopped first" if recreate else
                   "rolling update, the old pod served until the new one was ready")
            return SwitchResult(True, mode.value, f"Deployment {self.ref} rolled out in {took:.0f} s ({how})",
                                startup_s=took, downtime_s=took if recreate else 0.0, command=new)
        return await self._rollback(mode, current, new, before_mode, why, t0)

    async def _rollback(self, mode: CudaGraphMode, previous: list[str], new: list[str],
                        before_mode: CudaGraphMode, why: str, t0: float) -> SwitchResult:
        log.warning("rollout of %s to %s failed (%s): restoring the previous args", self.ref, mode.value, why)
        try:
            dep = await asyncio.to_thread(self._get)
            now_args = container_args(dep, self.container)
            if now_args != new:  # someone else changed it meanwhile: theirs wins, do not clobber it
                self.args = now_args
                self.mode = (user_mode(now_args) or DEFAULT_MODE).value
                return SwitchResult(False, mode.value, f"rollout failed ({why}); the Deployment's args were "
                                    "changed by someone else meanwhile, so they were left as they are",
                                    command=new)
            await asyncio.to_thread(self.client.patch_deployment, self.namespace, self.name,
                                    args_patch(self.container, previous,
                                               dep.get("metadata", {}).get("resourceVersion")))
        except GraphmodeError as exc:
            self.mode = None  # unknown: the Deployment holds the failed args
            return SwitchResult(False, mode.value, f"rollout failed ({why}) and the rollback PATCH failed too "
                                f"({exc}): Deployment {self.ref} is left on the new args", command=new)
        why_back = await self._wait(time.monotonic() + self.rollout_timeout_s)
        self.args, self.mode = previous, before_mode.value
        took = time.monotonic() - t0
        if why_back:
            return SwitchResult(False, mode.value, f"rollout failed ({why}); the previous args were restored but "
                                f"their rollout has not completed either ({why_back})", command=new)
        return SwitchResult(False, mode.value, f"rollout failed, rolled back to {before_mode.value} after "
                            f"{took:.0f} s: {why}", command=new)

    def close(self) -> None:
        self.client.close()
