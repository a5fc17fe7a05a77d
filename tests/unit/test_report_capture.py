"""The report's capture-size section: summed step sizes per shape, the chosen sizes marked, old data noted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from graphmode.core.dataset import ProfileStore
from graphmode.core.records import Fingerprint, RaceInfo, StartupInfo, StepSizes
from graphmode.report.capture import CaptureSection, section, shape_steps
from graphmode.selector.capture_costs import default_capture_sizes
from tests.support.bench import load_bench
from tests.unit.test_dataset import record

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EDGES = [1.0, 8.0, 16.0, 32.0, 64.0]


def _dataset(path: Path) -> Path:
    fp = Fingerprint(gpu_name="NVIDIA H200", vllm_version="0.24.0", model_architecture="LlamaForCausalLM",
                     num_params_b=8.03, model_config_hash="abc")
    start = StartupInfo(capture_s=6.0, graph_gib=0.98, effective_mode="FULL_AND_PIECEWISE",
                        capture_sizes=default_capture_sizes())
    with ProfileStore(path) as store:
        for i, (steps, running) in enumerate((([0, 100, 20, 0, 0, 0], {6: 3}), ([0, 50, 0, 10, 0, 0], {5: 2}))):
            rec = record(mode="FULL_AND_PIECEWISE", workload=f"w{i}", fingerprint=fp, startup=start,
                         step_sizes=StepSizes(le=EDGES, steps=[float(x) for x in steps], running=running))
            store.append(rec, f"h{i}")
    return path


def test_section_sums_cells_and_marks_the_chosen_sizes(tmp_path: Path) -> None:
    ds = _dataset(tmp_path / "p.sqlite")
    shapes, missing = shape_steps([ds])
    assert missing == 0 and len(shapes) == 1
    sh = shapes[0]
    assert sh.cells == 2 and sh.steps.steps == [0.0, 150.0, 20.0, 10.0, 0.0, 0.0]
    assert sh.steps.running == {6: 3, 5: 2}
    assert sh.answer.max_capture_size == 32 and sh.answer.chosen.graphed_share == 1.0
    assert sh.answer.chosen.capture_s is not None  # priced by the dataset's engine starts
    assert sh.answer.sizes[0] == 1 and sh.answer.default_sizes[-1] == 512
    sec = section([ds])
    text = _text(sec)
    assert "LlamaForCausalLM 8.0B" in text
    assert ", ".join(map(str, sh.answer.sizes)) in text
    assert sh.answer.chosen.padding_cost is not None and "step time padding adds" in text
    assert "KV cache tokens gained (predicted)" in text
    padding = f"{sh.answer.chosen.padding_cost:.1%} / {sh.answer.default.padding_cost:.1%}"
    assert padding in [c.text for c in sec.table.rows[0]]


def test_datasets_without_step_sizes_get_a_note(tmp_path: Path) -> None:
    old = tmp_path / "old.sqlite"
    shutil.copy(FIXTURES / "profile-cpu.sqlite", old)
    sec = section([old])
    assert not sec.shapes and not sec.table and sec.missing > 0


def _capture_sizes_script() -> ModuleType:
    return load_bench("capture_sizes")


def test_bench_script_prints_sizes_per_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mod = _capture_sizes_script()
    ds = _dataset(tmp_path / "p.sqlite")
    assert mod.main([str(ds), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [o["workload"] for o in out] == ["w0", "w1"]
    assert out[0]["compilation_config"]["max_cudagraph_capture_size"] == 16  # w0's steps end in (8, 16]
    assert out[1]["compilation_config"]["max_cudagraph_capture_size"] == 32
    assert mod.main([str(ds)]) == 0 and "| LlamaForCausalLM 8.0B | w0 |" in capsys.readouterr().out
    assert mod.main([str(tmp_path / "missing.sqlite")]) == 2


def test_bench_script_reads_no_race_cells_unless_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A race's arms run other lists in short cells: fed to the chooser, a resumed chain's lists would change."""
    mod = _capture_sizes_script()
    ds = _dataset(tmp_path / "p.sqlite")
    with ProfileStore(ds) as store:  # a race cell of w0 that saw steps up to 64
        store.append(record(mode="FULL_AND_PIECEWISE", workload="w0", repeat=1, race=RaceInfo(id="race-x", round=0,
                                                                                           arm="low"),
                            step_sizes=StepSizes(le=EDGES, steps=[0.0, 10.0, 0.0, 0.0, 50.0, 0.0], running={40: 2})),
                     "h9")
    assert mod.main([str(ds), "--json", "--workload", "w0"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["compilation_config"]["max_cudagraph_capture_size"] == 16
    assert mod.main([str(ds), "--json", "--workload", "w0", "--include-race"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["compilation_config"]["max_cudagraph_capture_size"] == 64


def test_a_raced_list_like_the_chosen_one_is_noted_with_its_verdicts(tmp_path: Path) -> None:
    ds = _dataset(tmp_path / "p.sqlite")
    (before,), _ = shape_steps([ds])
    assert before.answer.evidence is None
    chosen = before.answer.sizes
    fp = Fingerprint(gpu_name="NVIDIA H200", vllm_version="0.24.0", model_architecture="LlamaForCausalLM",
                     num_params_b=8.03, model_config_hash="abc")
    with ProfileStore(ds) as store:  # the chosen list raced against the default: 12 rounds, three starts a side
        for rnd in range(12):
            arm_itl = 0.0042 * (1.001, 0.999)[rnd % 2]
            for arm, sizes, itl in (("FULL_AND_PIECEWISE", None, 0.0042), ("low", chosen, arm_itl)):
                race = RaceInfo(id="race-x", round=rnd, arm=arm, requested_mode="FULL_AND_PIECEWISE",
                                start_id=f"{arm}:{1 + rnd // 4}", capture_sizes=sizes)
                rec = record(mode="FULL_AND_PIECEWISE", workload="w0", repeat=rnd, fingerprint=fp, race=race)
                store.append(rec.model_copy(update={"latency": rec.latency.model_copy(update={"itl_p50": itl})}),
                             f"r{rnd}{arm}")
    (after,), missing = shape_steps([ds])
    assert missing == 24 and after.answer.sizes == chosen  # race rows hold no step sizes: the list is the same
    ev = after.answer.evidence
    assert ev is not None and ev.similarity == 1.0 and ev.sizes == sorted(chosen)
    itl = next(v for v in ev.verdicts if v.metric == "itl_p50")
    assert itl.verdict == "equivalent" and 8 <= itl.n <= 12
    assert "latency, raced on this GPU for a list like this one" in _text(section([ds]))


def _text(sec: CaptureSection) -> str:
    """Everything the section says: table head and cells, and notes."""
    cells = [c.text for c in sec.table.head] + [c.text for r in sec.table.rows for c in r]
    return " | ".join([*cells, *sec.notes])
