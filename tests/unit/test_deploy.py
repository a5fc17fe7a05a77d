"""deploy/: Kubernetes manifests and the compose file validate against their schemas, and the
``graphmode launch`` command lines they contain work (run here with ``--dry-run``).

Schema validators come from the ``test`` extra: ``kubernetes-validate`` (bundled Kubernetes schemas,
offline) and ``check-jsonschema`` (its vendored compose-spec schema).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from graphmode.cli.main import app
from graphmode.vllm_args import compilation_config_of

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S = sorted((DEPLOY / "k8s").glob("*.yaml"))
COMPOSE = DEPLOY / "compose" / "compose.yaml"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
UNIT = DEPLOY / "systemd" / "graphmode-vllm.service"
runner = CliRunner()


def k8s_docs() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for f in K8S:
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


def find(kind: str, name: str) -> dict[str, Any]:
    for d in k8s_docs():
        if d["kind"] == kind and d["metadata"]["name"] == name:
            return d
    raise AssertionError(f"no {kind}/{name} in deploy/k8s")


def dockerfile_env_and_entrypoint() -> tuple[dict[str, str], list[str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    entry: list[str] = []
    for line in text.splitlines():
        if line.startswith("ENV "):
            for tok in shlex.split(line[4:]):
                k, _, v = tok.partition("=")
                env[k] = v
        if line.startswith("ENTRYPOINT "):
            entry = json.loads(line[len("ENTRYPOINT "):])
    return env, entry


@pytest.mark.parametrize("path", K8S, ids=[p.name for p in K8S])
def test_k8s_manifests_validate(path: Path) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed (test extra)")
    from kubernetes_validate.utils import latest_version, validate

    version = latest_version()
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            try:
                validate(doc, version, strict=True)
            except kv.ValidationError as exc:  # pragma: no cover - the message is the point
                pytest.fail(f"{path.name}: {doc['kind']}/{doc['metadata']['name']}: {exc.message}")


def test_controller_rbac_is_least_privilege() -> None:
    role = find("Role", "graphmode-controller")
    assert role["rules"] == [{"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": ["vllm"],
                              "verbs": ["get", "patch"]}]
    assert not any(d["kind"] in {"ClusterRole", "ClusterRoleBinding"} for d in k8s_docs())
    ctl = find("Deployment", "graphmode-controller")["spec"]["template"]["spec"]
    assert ctl["serviceAccountName"] == "graphmode-controller"
    for name in ("vllm", "graphmode-selector"):
        assert find("Deployment", name)["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_compose_validates_against_compose_spec() -> None:
    pytest.importorskip("check_jsonschema", reason="check-jsonschema not installed (test extra)")
    exe = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or shutil.which(
        "check-jsonschema")
    if exe is None:
        pytest.skip("check-jsonschema CLI not found")
    r = subprocess.run([exe, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {"vllm:8000", "selector:8080"}  # Prometheus scrapes both


def _dry_run(argv: list[str], env: dict[str, str], tmp_path: Path) -> list[str]:
    """Run a deploy file's ``graphmode launch ...`` command line with --dry-run; the vLLM argv it prints."""
    assert argv[:2] == ["graphmode", "launch"], argv
    env = {**env, "GRAPHMODE_SELECTOR_URL": "http://127.0.0.1:9",  # unreachable: exercise the fallback
           "GRAPHMODE_SELECTOR__MODELS_DIR": str(tmp_path / "no-models"),
           "GRAPHMODE_CONTROL__STATE_DIR": str(tmp_path / "state")}
    r = runner.invoke(app, ["launch", "--dry-run", *argv[2:]], env=env)
    assert r.exit_code == 0, r.output
    assert "falling back to the local model" in r.stderr or "static choice comes from" in r.stderr
    return shlex.split(r.stdout.strip().splitlines()[-1])


def test_compose_launch_command_line(tmp_path: Path) -> None:
    env, entry = dockerfile_env_and_entrypoint()
    assert entry == ["graphmode", "launch", "--"]
    assert re.search(r"^FROM \$\{VLLM_IMAGE\}", DOCKERFILE.read_text(), re.M)
    assert "vllm/vllm-openai:" in DOCKERFILE.read_text()
    svc = yaml.safe_load(COMPOSE.read_text())["services"]["vllm"]
    out = _dry_run([*entry, *svc["command"]], {**env, **svc["environment"]}, tmp_path)
    assert out[:2] == ["vllm", "serve"] and out[2] == "meta-llama/Llama-3.2-1B-Instruct"
    assert compilation_config_of(out) == {"cudagraph_mode": "FULL_AND_PIECEWISE"}


def test_k8s_launch_command_line(tmp_path: Path) -> None:
    env, entry = dockerfile_env_and_entrypoint()
    c = find("Deployment", "vllm")["spec"]["template"]["spec"]["containers"][0]
    kenv = {e["name"]: e["value"] for e in c["env"]}
    assert kenv["GRAPHMODE_SELECTOR_URL"].startswith("http://graphmode-selector.")
    out = _dry_run([*entry, *c["args"]], {**env, **kenv}, tmp_path)
    assert out[:3] == ["vllm", "serve", "meta-llama/Llama-3.2-1B-Instruct"] and "--compilation-config" in out
    # what the controller patches in (an explicit mode) is what launch then uses
    patched = [*c["args"], "--compilation-config", '{"cudagraph_mode":"PIECEWISE"}']
    r = runner.invoke(app, ["launch", "--dry-run", "--", *patched], env={**env, **kenv})
    assert r.exit_code == 0 and compilation_config_of(shlex.split(r.stdout.strip().splitlines()[-1])) == {
        "cudagraph_mode": "PIECEWISE"}


def test_systemd_unit_launch_command_line(tmp_path: Path) -> None:
    text = UNIT.read_text()
    exec_start = re.search(r"^ExecStart=(.+)$", text, re.M)
    assert exec_start and "[Install]" in text
    argv = shlex.split(exec_start.group(1))
    assert Path(argv[0]).name == "graphmode"
    env = dict(re.findall(r"^Environment=([A-Z_]+)=(.+)$", text, re.M))
    out = _dry_run(["graphmode", *argv[1:]], env, tmp_path)
    assert out[:2] == ["/opt/vllm/bin/vllm", "serve"] and "--compilation-config" in out
