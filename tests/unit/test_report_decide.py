"""The report's decision section: verdict cells, the bundled model's answers per GPU × release, escaping."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphmode.core.modes import ALL_MODES
from graphmode.report.configs import configurations
from graphmode.report.decide import RACE_BASIS, REFERENCE_WORKLOADS, releases, verdict_cell
from graphmode.report.html import environment
from graphmode.report.load import load_report_data
from graphmode.report.table import Table
from graphmode.selector.verdicts import RaceVerdict
from tests.unit.test_report_configs import QWEN_024, QWEN_033, REPO, race_rows

MODELS = REPO / "models"


def _render(t: Table) -> str:
    return str(environment().from_string('{% from "_macros.html.j2" import table %}{{ table(t) }}').render(t=t))


def test_a_verdict_cell_reads_every_round_and_the_verdicts_interval() -> None:
    v = RaceVerdict(shape="s", mode="FULL", metric="itl_p50", verdict="better", rounds=8, ratio=0.768, lo=0.62,
                    hi=0.95, delta=0.03, confidence=0.95, starts=2, ratio_all=0.801, rounds_all=12)
    cell = verdict_cell(v)
    assert cell.text == "better" and cell.strong and cell.cls == "v-better"
    assert cell.note.startswith("0.801× over 12 rounds")  # all rounds first, not the ratio at the crossing
    assert "0.768× [0.62–0.95] n=8 s=2" in cell.note
    older = v.model_copy(update={"ratio_all": None, "rounds_all": None})  # rows from before ratio_all
    assert verdict_cell(older).note.startswith("0.768× over 8 rounds")
    assert verdict_cell(None).text == "–"


def test_tables_are_escaped_by_the_template() -> None:
    page = _render(Table.of(["<i>head</i>"], [["<script>alert(1)</script>", "a & b"]]))
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;i&gt;head&lt;/i&gt;" in page and "a &amp; b" in page


def test_each_release_gets_its_own_verdicts_and_the_bundled_model_of_that_release() -> None:
    if not (QWEN_024.is_file() and QWEN_033.is_file()):
        pytest.skip("committed race datasets missing")
    data = load_report_data([QWEN_024, QWEN_033], shapes_dir=MODELS / "shapes")
    got = releases(data.configurations, MODELS)
    assert [r.title for r in got] == ["H200 · vLLM 0.24.0", "H200 · vLLM 0.33.0"]
    for r in got:
        assert r.model_id is not None and f"vllm{r.vllm}" in r.model_id  # that release's model, not the other's
        assert r.answers is not None and r.verdicts
        assert r.answers.rows[0][0].text == REFERENCE_WORKLOADS[0][0]
        modes = {row[2].text for row in r.answers.rows}
        assert modes <= {m.value for m in ALL_MODES}
        assert all(row[4].text in {*RACE_BASIS.values(), "model prediction", "model: within noise of the default"}
                   for row in r.answers.rows)
        page = _render(r.verdicts)
        assert "qwen2.5-0.5b" in page and " over " in page and "FULL" in page


def test_a_release_without_a_bundled_model_says_so(tmp_path: Path) -> None:
    if not QWEN_024.is_file():
        pytest.skip("committed race dataset missing")
    configs = load_report_data([QWEN_024], shapes_dir=MODELS / "shapes").configurations
    (r,) = releases(configs, tmp_path)  # an empty registry
    assert r.model_id is None and r.answers is None and any("no bundled model" in n for n in r.notes)
    (bare,) = releases(configs, tmp_path, use_model=False)
    assert not bare.notes


def test_synthetic_configurations_group_by_gpu_and_release() -> None:
    rows = [*race_rows("r1", [0.8] * 5, vllm="0.24.0+cu129"), *race_rows("r2", [0.8] * 5, backend="FLASHINFER"),
            *race_rows("r3", [1.3] * 5, vllm="0.33.0")]
    got = releases(configurations(rows), None, use_model=False)
    assert [(r.vllm, len(r.configs)) for r in got] == [("0.24.0", 2), ("0.33.0", 1)]
