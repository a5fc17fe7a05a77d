"""Step sizes predicted from a workload description, and the capture sizes recommend and launch give for one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from graphmode.cli.main import app
from graphmode.core.records import StepSizes
from graphmode.selector.capture import choose_capture_sizes
from graphmode.selector.describe import WorkloadDescription
from graphmode.selector.step_predict import predict_steps

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
LE = [1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0]


def _row(rate: float, inp: int, out: int, running: dict[int, int], steps: list[float], e2e: float,
         name: str) -> dict[str, Any]:
    spec = {"rate": rate, "input": {"mean": inp}, "output": {"mean": out}, "burstiness": 1.0}
    return {"step_sizes": StepSizes(le=LE, steps=steps, running=running).model_dump_json(),
            "workload_spec": json.dumps(spec), "e2e_p50": e2e, "workload": name, "_dataset": "/d/x.sqlite"}


def _busy_cell() -> dict[str, Any]:
    # 400 decode steps of 64 running (bucket 33-64), 10 mixed steps of 64 + a 256-token chunk (257-512)
    steps = [0, 0, 0, 0, 400, 0, 0, 10, 0, 0, 0, 0, 0]
    return _row(32, 256, 256, {64: 20}, [float(s) for s in steps], 2.0, "busy")


def test_a_cell_at_the_same_load_is_reproduced() -> None:
    desc = WorkloadDescription(rate=32, input_tokens=256, output_tokens=256)
    got = predict_steps(desc, [_busy_cell()], max_num_seqs=1024)
    assert got is not None
    steps, pred = got
    assert pred.predicted and pred.cells[0].workload == "busy"
    assert pred.load == 64 and pred.largest_batch_range == (64, 64)
    assert steps.running == {64: 20} and sum(steps.steps) == 410
    assert steps.steps[4] == 400  # the decode steps stay in the 33-64 bucket


def test_a_heavier_load_moves_decode_steps_up_and_max_num_seqs_caps_them() -> None:
    desc = WorkloadDescription(rate=64, input_tokens=256, output_tokens=256)  # twice the rate, same latency
    steps, pred = predict_steps(desc, [_busy_cell()], max_num_seqs=1024) or (None, None)
    assert pred is not None and steps is not None
    assert pred.cells[0].scale == 2.0 and pred.largest_batch_range == (128, 128)
    assert steps.running == {128: 20} and steps.steps[5] == 400  # 65-128 now
    ans = choose_capture_sizes(steps, max_num_seqs=1024)
    assert ans.sizes[-1] >= 128
    capped, cp = predict_steps(WorkloadDescription(rate=6400, input_tokens=256, output_tokens=256),
                               [_busy_cell()], max_num_seqs=96) or (None, None)
    assert cp is not None and capped is not None
    assert cp.load == 96 and max(capped.running) == 96  # vLLM never runs more than max_num_seqs


def test_the_recommender_load_and_a_concurrency_cap_take_precedence() -> None:
    desc = WorkloadDescription(rate=1, input_tokens=256, output_tokens=256, concurrency=16)
    _, pred = predict_steps(desc, [_busy_cell()], max_num_seqs=256, batch_mean=40.0) or (None, None)
    assert pred is not None and pred.load == 16 and "recommender" in pred.load_source


def test_no_usable_cell_gives_none() -> None:
    row = _busy_cell()
    row["workload_spec"] = "{}"
    assert predict_steps(WorkloadDescription(rate=1, input_tokens=1, output_tokens=1), [row], max_num_seqs=8) is None


def test_recommend_from_a_description_carries_predicted_capture_sizes() -> None:
    r = CliRunner().invoke(app, ["recommend", "--json", "--models-dir", str(MODELS), "--vllm-version", "0.33.0",
                                 "--rate", "2", "--input-tokens", "256", "--output-tokens", "256"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    cap = data["capture"]
    assert cap is not None and cap["sizes"] and cap["steps_predicted"]["predicted"] is True
    assert cap["steps_predicted"]["cells"] and "predicted from the description" in cap["notes"][0]
    assert json.loads(data["compilation_config"])["cudagraph_capture_sizes"] == cap["sizes"]


def test_launch_from_a_description_applies_a_list_reaching_max_num_seqs(tmp_path: Path) -> None:
    model = tmp_path / "m8b"
    model.mkdir()
    shutil.copy(MODELS / "shapes" / "llama-3.1-8b.json", model / "config.json")
    base = ["launch", "--dry-run", "--models-dir", str(MODELS), "--state-dir", str(tmp_path),
            "--vllm-version", "0.33.0", "--rate", "300", "--input-tokens", "128", "--output-tokens", "512"]
    r = CliRunner().invoke(app, [*base, "--", "--model", str(model), "--max-num-seqs", "1024"])
    assert r.exit_code == 0, r.output
    cc = json.loads(r.stdout.split("--compilation-config ")[1].strip().strip("'"))
    assert max(cc["cudagraph_capture_sizes"]) == 1024 == cc["max_cudagraph_capture_size"]
    mine = '{"cudagraph_capture_sizes":[1,2,4]}'
    r = CliRunner().invoke(app, [*base, "--", "--model", str(model), "--max-num-seqs", "1024",
                                 "--compilation-config", mine])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.split("--compilation-config ")[1].strip().strip("'"))["cudagraph_capture_sizes"] \
        == [1, 2, 4]  # the user's own list wins without --force
