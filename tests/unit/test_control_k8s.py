"""``graphmode watch --k8s-deployment``: switching by patching a Deployment, against a fake Kubernetes API.

The fake API server (http.server on loopback, in a thread) stores one Deployment, applies strategic-merge
patches to its containers (merged by name), bumps ``generation`` when the pod template changes, and
simulates the rollout on the following GETs: it completes, or — for a mode listed in ``bad_modes`` —
reports ``ProgressDeadlineExceeded``, or — with ``stall`` — never finishes.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from graphmode.cli.main import app
from graphmode.control import k8s as k8s_mod
from graphmode.control.controller import Controller
from graphmode.control.k8s import K8sExecutor, KubeClient, KubernetesError, rollout_status
from graphmode.control.policy import Advice, Policy, PolicyConfig
from graphmode.control.state import load_state
from graphmode.core.modes import CudaGraphMode
from graphmode.core.records import ObservedFeatures
from graphmode.vllm_args import compilation_config_of
from tests.support.net import Request, serve_http

TOKEN = "sa-token-1"
NS, NAME = "graphmode", "vllm"
PATH = f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}"
CC = {"cudagraph_mode": "PIECEWISE", "compile_sizes": [1, 2, 4], "level": 3}
ARGS = ["meta-llama/Llama-3.2-1B-Instruct", "--host", "0.0.0.0", "--max-model-len", "8192",
        "--compilation-config", json.dumps(CC), "--enable-prefix-caching"]
SIDECAR = {"name": "exporter", "image": "exporter:1", "args": ["--port", "9400"]}


class FakeKube:
    def __init__(self, args: list[str]) -> None:
        self.dep: dict[str, Any] = {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": NAME, "namespace": NS, "generation": 1, "resourceVersion": "100"},
            "spec": {"replicas": 1, "strategy": {"type": "RollingUpdate"},
                     "template": {"spec": {"containers": [
                         {"name": "vllm", "image": "graphmode-vllm:latest", "args": list(args)},
                         copy.deepcopy(SIDECAR)]}}},
            "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1,
                       "availableReplicas": 1},
        }
        self.token = TOKEN
        self.forbid: set[str] = set()  # HTTP methods answered 403
        self.bad_modes: set[str] = set()
        self.stall = False
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, Authorization
        self.patches: list[dict[str, Any]] = []
        self.content_types: list[str | None] = []
        self._polls = 0
        self.lock = threading.Lock()

    # ------------------------------------------------------------ behaviour
    def vllm_args(self) -> list[str]:
        return list(self.dep["spec"]["template"]["spec"]["containers"][0]["args"])

    def _bad(self) -> bool:
        try:
            mode = compilation_config_of(self.vllm_args()).get("cudagraph_mode")
        except Exception:
            return True
        return mode in self.bad_modes

    def advance(self) -> None:
        """One step of the rollout, on every GET."""
        st, gen = self.dep["status"], self.dep["metadata"]["generation"]
        if st["observedGeneration"] < gen:  # the controller sees the new template: surge a new pod
            st.update(observedGeneration=gen, replicas=2, updatedReplicas=1, availableReplicas=1,
                      unavailableReplicas=1)
            st["conditions"] = [{"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}]
            self._polls = 0
            return
        if st.get("unavailableReplicas"):
            self._polls += 1
            if self.stall or self._polls < 2:
                return
            if self._bad():  # the new pod never becomes ready
                st["conditions"] = [{"type": "Progressing", "status": "False",
                                     "reason": "ProgressDeadlineExceeded",
                                     "message": 'ReplicaSet "vllm-7d9" has timed out progressing.'}]
                return
            st.update(replicas=1, updatedReplicas=1, availableReplicas=1, unavailableReplicas=0)
            st["conditions"] = [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]

    def patch(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        rv = body.get("metadata", {}).get("resourceVersion")
        if rv is not None and rv != self.dep["metadata"]["resourceVersion"]:
            return 409, {"kind": "Status", "message": "the object has been modified"}
        before = copy.deepcopy(self.dep["spec"]["template"])
        containers = self.dep["spec"]["template"]["spec"]["containers"]
        for pc in body.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            for c in containers:  # strategic merge: containers merge on name
                if c["name"] == pc["name"]:
                    c.update({k: v for k, v in pc.items() if k != "name"})
                    break
            else:
                containers.append(pc)
        md = self.dep["metadata"]
        md["resourceVersion"] = str(int(md["resourceVersion"]) + 1)
        if self.dep["spec"]["template"] != before:
            md["generation"] += 1
        return 200, self.dep

    # ------------------------------------------------------------ HTTP
    def respond(self, req: Request) -> tuple[int, dict[str, Any]]:
        with self.lock:
            auth = req.headers.get("Authorization")
            self.requests.append((req.method, req.path, auth))
            if auth != f"Bearer {self.token}":
                return 401, {"kind": "Status", "message": "Unauthorized"}
            if req.method in self.forbid:
                verb = req.method.lower()
                return 403, {"kind": "Status", "reason": "Forbidden", "message":
                             f'deployments.apps "{NAME}" is forbidden: User "system:serviceaccount:'
                             f'graphmode:graphmode-controller" cannot {verb} resource "deployments"'}
            if req.path != PATH:
                return 404, {"kind": "Status", "message": "not found"}
            if req.method == "GET":
                self.advance()
                return 200, self.dep
            self.content_types.append(req.headers.get("Content-Type"))
            self.patches.append(req.json())
            return self.patch(req.json())


@pytest.fixture
def kube() -> Iterator[tuple[FakeKube, str]]:
    fake = FakeKube(ARGS)
    with serve_http(fake.respond) as url:
        yield fake, url


def executor(url: str, *, timeout_s: float = 10.0) -> K8sExecutor:
    client = KubeClient(url, token=TOKEN, verify=False, connect_timeout_s=1.0, read_timeout_s=5.0)
    return K8sExecutor(client, NS, NAME, "vllm", metrics_url="http://127.0.0.1:9/", rollout_timeout_s=timeout_s,
                       poll_s=0.01)


def controller(tmp_path: Path, ex: K8sExecutor, best: str = "FULL") -> Controller:
    def advisor(_: ObservedFeatures) -> Advice:
        return Advice(best=best, scores={"PIECEWISE": 0.010, best: 0.005})

    policy = Policy(PolicyConfig(min_dwell_s=0, cooldown_s=0, confirmations=1, max_attempts=2, retry_in_s=3600))
    ctl = Controller("k8s-vllm", ex, advisor, policy, state_dir=tmp_path)
    ctl.adopt(ex.load())
    ctl.injected = ObservedFeatures(arrival_rate=5.0)
    return ctl


def test_load_reads_the_mode_from_the_deployment(kube: tuple[FakeKube, str]) -> None:
    fake, url = kube
    ex = executor(url)
    res = ex.load()
    assert res.ok and ex.mode == "PIECEWISE" and ex.command() == ARGS
    assert ex.metrics_url() == "http://127.0.0.1:9/metrics"
    # no cudagraph_mode in the args: vLLM's default
    fake.dep["spec"]["template"]["spec"]["containers"][0]["args"] = ["m", "--port", "8000"]
    assert ex.load().mode == "FULL_AND_PIECEWISE"


def test_switch_patches_only_cudagraph_mode_and_is_recorded(kube: tuple[FakeKube, str], tmp_path: Path) -> None:
    fake, url = kube
    ex = executor(url)
    ctl = controller(tmp_path, ex)
    d = asyncio.run(ctl.step())
    assert d.action == "switch" and d.target == "FULL"
    assert len(fake.patches) == 1 and fake.content_types == ["application/strategic-merge-patch+json"]
    patch = fake.patches[0]
    assert patch["spec"] == {"template": {"spec": {"containers": [{"name": "vllm", "args": patch["spec"][
        "template"]["spec"]["containers"][0]["args"]}]}}}
    assert patch["metadata"] == {"resourceVersion": "100"}  # optimistic concurrency on what was read
    new = fake.vllm_args()
    assert compilation_config_of(new) == {**CC, "cudagraph_mode": "FULL"}
    # every other flag kept, in order; the one compilation config carries the new mode
    assert new[:-2] == ARGS[:5] + ARGS[7:] and new[-2] == "--compilation-config"
    assert fake.dep["spec"]["template"]["spec"]["containers"][1] == SIDECAR  # the other container untouched
    # bookkeeping through the state/policy machinery
    assert ex.mode == "FULL" and ex.command() == new
    st = load_state(tmp_path, "k8s-vllm")
    assert st.switches == 1 and st.failed_switches == 0 and st.current_mode == "FULL"
    assert st.last_good_mode == "FULL" and st.last_good_command == new and st.startup_s is not None
    assert st.policy.attempts[-1].ok and st.policy.attempts[-1].from_mode == "PIECEWISE"
    assert st.decisions[-1]["action"] == "switched" and st.decisions[-1]["downtime_s"] == 0.0
    # every request carried the service-account token
    assert fake.requests and all(auth == f"Bearer {TOKEN}" for _, _, auth in fake.requests)


def test_failed_rollout_is_rolled_back_to_the_exact_previous_args(kube: tuple[FakeKube, str],
                                                                    tmp_path: Path) -> None:
    fake, url = kube
    fake.bad_modes = {"FULL"}
    ex = executor(url)
    ctl = controller(tmp_path, ex)
    asyncio.run(ctl.step())
    assert len(fake.patches) == 2
    assert fake.patches[1]["spec"]["template"]["spec"]["containers"] == [{"name": "vllm", "args": ARGS}]
    assert fake.vllm_args() == ARGS and fake.dep["metadata"]["generation"] == 3
    done, failure = rollout_status(fake.dep)
    assert done and failure is None  # the rollback rolled out
    assert ex.mode == "PIECEWISE" and ex.command() == ARGS
    st = load_state(tmp_path, "k8s-vllm")
    assert st.switches == 0 and st.failed_switches == 1 and st.current_mode == "PIECEWISE"
    assert st.last_good_mode == "PIECEWISE"
    err = st.last_error or ""
    assert "ProgressDeadlineExceeded" in err and "rolled back to PIECEWISE" in err
    a = st.policy.attempts[-1]
    assert not a.ok and a.to_mode == "FULL" and "ProgressDeadlineExceeded" in a.reason
    assert st.decisions[-1]["action"] == "switch-failed"


def test_rollout_missing_our_deadline_is_rolled_back(kube: tuple[FakeKube, str]) -> None:
    fake, url = kube
    fake.stall = True
    ex = executor(url, timeout_s=0.3)

    async def go() -> Any:
        ex.load()
        res = await ex.switch(CudaGraphMode.NONE)
        return res

    res = asyncio.run(go())
    assert not res.ok and "did not complete within" in res.reason
    assert fake.vllm_args() == ARGS and len(fake.patches) == 2
    assert ex.mode == "PIECEWISE"


def test_rollback_does_not_clobber_a_concurrent_edit(kube: tuple[FakeKube, str]) -> None:
    fake, url = kube
    fake.stall = True
    ex = executor(url, timeout_s=0.3)
    theirs = ["other-model", "--compilation-config", '{"cudagraph_mode":"NONE"}']

    async def go() -> Any:
        task = asyncio.create_task(ex.switch(CudaGraphMode.FULL))
        await asyncio.sleep(0.1)
        with fake.lock:
            fake.dep["spec"]["template"]["spec"]["containers"][0]["args"] = list(theirs)
        return await task

    res = asyncio.run(go())
    assert not res.ok and "someone else" in res.reason
    assert fake.vllm_args() == theirs and len(fake.patches) == 1 and ex.mode == "NONE"


def test_forbidden_is_a_clear_error(kube: tuple[FakeKube, str], tmp_path: Path) -> None:
    fake, url = kube
    fake.forbid = {"GET"}
    ex = executor(url)
    with pytest.raises(KubernetesError) as info:
        ex.load()
    assert info.value.status == 403
    msg = str(info.value)
    assert "HTTP 403 forbidden" in msg and "lacks 'get'" in msg and "cannot get resource" in msg
    # patch forbidden: the switch fails, nothing changed, the reason is recorded
    fake.forbid = {"PATCH"}
    ctl = controller(tmp_path, ex)
    asyncio.run(ctl.step())
    assert fake.vllm_args() == ARGS
    st = load_state(tmp_path, "k8s-vllm")
    assert st.failed_switches == 1 and "lacks 'patch'" in (st.last_error or "")
    assert "nothing changed" in (st.last_error or "") and ex.mode == "PIECEWISE"


def test_token_is_re_read_on_every_request(kube: tuple[FakeKube, str], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    fake, url = kube
    tok = tmp_path / "token"
    tok.write_text(TOKEN + "\n")
    monkeypatch.setattr(k8s_mod, "TOKEN_PATH", tok)
    client = KubeClient(url, verify=False)  # token: the service-account file
    client.get_deployment(NS, NAME)
    tok.write_text("sa-token-2")  # kubelet rotated it
    fake.token = "sa-token-2"
    client.get_deployment(NS, NAME)
    assert [a for _, _, a in fake.requests] == [f"Bearer {TOKEN}", "Bearer sa-token-2"]
    fake.token = "sa-token-3"
    with pytest.raises(KubernetesError, match="401 unauthorized"):
        client.get_deployment(NS, NAME)


def test_in_cluster_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(Exception, match="KUBERNETES_SERVICE_HOST"):
        KubeClient()
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    c = KubeClient(verify=False)
    assert c.base_url == "https://10.96.0.1:6443"
    c.close()


def test_rollout_status() -> None:
    dep: dict[str, Any] = {"metadata": {"generation": 2}, "spec": {"replicas": 2},
                           "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2,
                                      "availableReplicas": 2}}
    assert rollout_status(dep) == (False, None)  # not observed yet
    dep["status"]["observedGeneration"] = 2
    assert rollout_status(dep) == (True, None)
    dep["status"]["unavailableReplicas"] = 1
    assert rollout_status(dep) == (False, None)
    dep["status"]["conditions"] = [{"type": "Progressing", "reason": "ProgressDeadlineExceeded"}]
    assert rollout_status(dep)[1] is not None


# ---------------------------------------------------------------------------- CLI
runner = CliRunner()
MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "controller.yaml"


def test_watch_help_lists_the_k8s_options() -> None:
    r = runner.invoke(app, ["watch", "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
    assert r.exit_code == 0
    for opt in ("--k8s-deployment", "--k8s-container", "--k8s-rollout-timeout"):
        assert opt in r.stdout


def test_controller_manifest_command_line_runs(kube: tuple[FakeKube, str], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The exact command of deploy/k8s/controller.yaml parses, builds a K8sExecutor (not dry-run) for
    graphmode/vllm container vllm, and reads the mode from the Deployment; only the state dir (a PVC
    there) is redirected to tmp_path, and the API servers / loop are not run."""
    import uvicorn

    fake, url = kube
    dep = next(d for d in yaml.safe_load_all(MANIFEST.read_text())
               if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "graphmode-controller")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    argv = [*c["command"][1:], *c["args"]]
    assert argv[0] == "watch"
    argv[argv.index("--state-dir") + 1] = str(tmp_path)

    made: list[KubeClient] = []

    class InClusterClient(KubeClient):  # what KubeClient() builds in the pod, pointed at the fake
        def __init__(self, **kw: Any) -> None:
            super().__init__(url, token=TOKEN, verify=False, **kw)
            made.append(self)

    seen: list[Controller] = []

    async def run(self: Controller, *, interval_s: float, evaluate_every_s: float, stop: asyncio.Event) -> None:
        seen.append(self)

    async def serve(self: uvicorn.Server, sockets: Any = None) -> None:
        return None

    monkeypatch.setattr(k8s_mod, "KubeClient", InClusterClient)
    monkeypatch.setattr(Controller, "run", run)
    monkeypatch.setattr(uvicorn.Server, "serve", serve)
    r = runner.invoke(app, argv)
    assert r.exit_code == 0, r.output
    assert len(made) == 1 and len(seen) == 1
    ctl = seen[0]
    ex = ctl.executor
    assert isinstance(ex, K8sExecutor) and not ctl.dry_run
    assert (ex.namespace, ex.name, ex.container) == ("graphmode", "vllm", "vllm")
    assert ex.metrics_url() == "http://vllm.graphmode.svc:8000/metrics"
    assert ctl.deployment_id == "k8s-vllm" and ex.mode == "PIECEWISE"
    assert load_state(tmp_path, "k8s-vllm").current_mode == "PIECEWISE"
    assert fake.requests[0][:2] == ("GET", PATH)


def test_k8s_deployment_needs_attach(tmp_path: Path) -> None:
    r = runner.invoke(app, ["watch", "--k8s-deployment", "graphmode/vllm", "--state-dir", str(tmp_path),
                            "--selector-url", "http://127.0.0.1:9"])
    assert r.exit_code == 2 and "--attach" in r.output
