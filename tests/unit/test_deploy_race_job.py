"""deploy/k8s/race-job.yaml: a race on a node of one GPU product, trained into the selector's registry, then
a reload of the selector service. Schema validation is in test_deploy.py (every file under deploy/k8s);
this checks that the Job's three steps fit together and with selector.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from typer.main import get_command
from typer.testing import CliRunner

from graphmode.cli.main import app
from graphmode.service.routers.models import router as models_router

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
runner = CliRunner()


def _doc(file: str, kind: str, name: str) -> dict[str, Any]:
    for d in yaml.safe_load_all((K8S / file).read_text()):
        if d and d["kind"] == kind and d["metadata"]["name"] == name:
            return d
    raise AssertionError(f"no {kind}/{name} in {file}")


def _job() -> dict[str, Any]:
    return _doc("race-job.yaml", "Job", "graphmode-race")["spec"]["template"]["spec"]


def _container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == name)


def _arg(c: dict[str, Any], flag: str) -> str:
    args = c["args"]
    return str(args[args.index(flag) + 1])


def _claim_mount(spec: dict[str, Any], c: dict[str, Any], claim: str) -> str:
    """Where container ``c`` mounts the PersistentVolumeClaim ``claim``."""
    vol = next(v["name"] for v in spec["volumes"] if v.get("persistentVolumeClaim", {}).get("claimName") == claim)
    return str(next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == vol and "subPath" not in m))


def test_job_runs_on_the_named_gpu_product_with_one_gpu() -> None:
    spec = _job()
    assert spec["nodeSelector"]["nvidia.com/gpu.product"]
    race = _container(spec, "race")
    assert race["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert race["command"] == ["graphmode", "profile"] and "--race" in race["args"]
    assert [c["name"] for c in spec["initContainers"]] == ["race", "train"]  # in this order, then reload


def test_race_writes_where_train_reads_inside_the_selectors_registry() -> None:
    spec = _job()
    race, train = _container(spec, "race"), _container(spec, "train")
    dataset = _arg(race, "--dataset")
    assert _arg(train, "--dataset") == dataset
    sel = _doc("selector.yaml", "Deployment", "graphmode-selector")["spec"]["template"]["spec"]
    selector = _container(sel, "selector")
    models_dir = next(e["value"] for e in selector["env"] if e["name"] == "GRAPHMODE_SELECTOR__MODELS_DIR")
    assert _arg(train, "--models-dir") == models_dir
    # one volume, mounted at the registry path by the selector and by both Job steps
    for pod, c in ((spec, race), (spec, train), (sel, selector), (sel, _container(sel, "seed-models"))):
        assert _claim_mount(pod, c, "graphmode-models") == models_dir
    assert Path(dataset).parent == Path(models_dir) / "_profiles"  # where the selector's retrain keeps its own
    pvc = _doc("selector.yaml", "PersistentVolumeClaim", "graphmode-models")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]  # selector replicas and the Job mount it at once


def test_every_flag_the_job_passes_exists() -> None:
    cli: Any = get_command(app)  # typer's group (typer may vendor click: no isinstance on click.Group)
    ctx = type(cli).context_class(cli)
    for name, cmd in (("race", "profile"), ("train", "train")):
        c = _container(_job(), name)
        command = cli.get_command(ctx, cmd)
        assert command is not None
        opts = {o for p in command.params for o in p.opts}
        ours = [a for a in c["args"][: c["args"].index("--") if "--" in c["args"] else None] if a.startswith("--")]
        assert ours and set(ours) <= opts, set(ours) - opts


def test_race_step_plans_with_the_images_vllm_command(tmp_path: Path) -> None:
    race = _container(_job(), "race")
    args = [str(a) for a in race["args"]]
    args[args.index("--dataset") + 1] = str(tmp_path / "_profiles" / "race.sqlite")
    args[args.index("--log-dir") + 1] = str(tmp_path / "logs")
    r = runner.invoke(app, ["profile", "--dry-run", *args], env={"GRAPHMODE_VLLM__COMMAND": "vllm serve"})
    assert r.exit_code == 0, r.output
    assert "vllm serve --model meta-llama/Llama-3.2-1B-Instruct" in r.output
    assert "CONTROL" in r.output  # the A/A arm: the race says what a restart alone moves


def test_reload_step_posts_to_the_selector_service_with_the_token() -> None:
    reload = _container(_job(), "reload")
    script = reload["args"][0]
    svc = _doc("selector.yaml", "Service", "graphmode-selector")
    port = svc["spec"]["ports"][0]["port"]
    assert f"http://graphmode-selector.graphmode.svc.cluster.local:{port}/v1/reload" in script
    assert 'method="POST"' in script and "Bearer" in script
    assert any(getattr(r, "path", "") == "/v1/reload" and "POST" in getattr(r, "methods", set())
               for r in models_router.routes)
    token = next(e for e in reload["env"] if e["name"] == "GRAPHMODE_SERVICE__TOKEN")["valueFrom"]["secretKeyRef"]
    sel = _container(_doc("selector.yaml", "Deployment", "graphmode-selector")["spec"]["template"]["spec"],
                     "selector")
    theirs = next(e for e in sel["env"] if e["name"] == "GRAPHMODE_SERVICE__TOKEN")["valueFrom"]["secretKeyRef"]
    assert (token["name"], token["key"]) == (theirs["name"], theirs["key"])
    compile(script, "reload", "exec")  # the step's Python parses


def test_health_checks_probe_the_services_health_route() -> None:
    from graphmode.service.routers import health

    routes = {getattr(r, "path", "") for r in health.router.routes}
    sel = _container(_doc("selector.yaml", "Deployment", "graphmode-selector")["spec"]["template"]["spec"],
                     "selector")
    assert sel["readinessProbe"]["httpGet"]["path"] in routes
    compose = yaml.safe_load((K8S.parent / "compose" / "compose.yaml").read_text())
    probe = " ".join(compose["services"]["selector"]["healthcheck"]["test"])
    assert any(f"127.0.0.1:8080{p}'" in probe for p in routes if p)
