"""``graphmode report``: aggregation, headline numbers, ties, figures, the page and bad input.

The dataset is small and written here through :class:`ProfileStore` with hand-picked values, so every
number the report shows can be computed by hand below. The model is the bundled one under ``models/``
(the synthetic rows use its model shape, so the decision map has measured winners to overlay).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from graphmode.cli.main import app
from graphmode.core.dataset import ProfileStore
from graphmode.core.errors import DatasetError, ModelError
from graphmode.core.records import CellRecord, Fingerprint, LatencyStats, ObservedFeatures, StartupInfo
from graphmode.report import build_report, default_datasets
from graphmode.report.analysis import headline, pareto
from graphmode.report.decision import decision_maps, load_model
from graphmode.report.figures import decision_figure, pareto_figure
from graphmode.report.html import environment
from graphmode.report.load import load_report_data
from graphmode.report.table import Table
from graphmode.report.tables import Finding, paired_verdict_table
from graphmode.report.tables import findings as finding_items
from graphmode.report.views import HeadlineRow, ReportData
from graphmode.selector.card import CVReport
from graphmode.selector.paired import PairedRound, paired_verdicts
from graphmode.selector.registry import list_models

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
MODES = ("NONE", "FULL", "FULL_AND_PIECEWISE")
START = {"NONE": (50.0, None, None), "FULL": (60.0, 1.5, 0.27), "FULL_AND_PIECEWISE": (65.0, 2.0, 0.45)}
# workload -> (rate, burstiness, input, output, {mode: [ITL p50 ms per repeat]}, {mode: TTFT p50 ms})
WORKLOADS: dict[str, tuple[float, float, int, int, dict[str, list[float]], dict[str, float]]] = {
    "chat-r8-b1": (8, 1.0, 512, 128, {"NONE": [6.0, 6.02], "FULL": [2.0, 2.02], "FULL_AND_PIECEWISE": [3.0, 3.02]},
                   {"NONE": 30.0, "FULL": 20.0, "FULL_AND_PIECEWISE": 25.0}),
    "decode-heavy-r2-b0.25": (2, 0.25, 64, 512,
                              {"NONE": [7.0, 7.05], "FULL": [2.5, 2.52], "FULL_AND_PIECEWISE": [1.9, 1.92]},
                              {"NONE": 22.0, "FULL": 14.0, "FULL_AND_PIECEWISE": 15.0}),
    # planted noise: FULL's two repeats are far apart, so FULL and FULL_AND_PIECEWISE are a tie
    "prefill-heavy-r32-b1": (32, 1.0, 1536, 32,
                             {"NONE": [8.0, 8.1], "FULL": [1.8, 3.0], "FULL_AND_PIECEWISE": [2.5, 2.52]},
                             {"NONE": 40.0, "FULL": 30.0, "FULL_AND_PIECEWISE": 28.0}),
    # FULL read coalesced chunks here: its ITL (0.04 ms vs TPOT 3 ms) must be dropped, as the selector does
    "decode-heavy-r32-b0.25": (32, 0.25, 64, 512,
                               {"NONE": [7.5, 7.6], "FULL": [0.04, 0.05], "FULL_AND_PIECEWISE": [2.7, 2.72]},
                               {"NONE": 130.0, "FULL": 80.0, "FULL_AND_PIECEWISE": 60.0}),
}
FAILED_REASON = "vLLM exited with status 1: CUDA out of memory\nTraceback (most recent call last): ..."


def bundled_model() -> Path:
    # the H200 0.24 model: its card names the grid campaign and the first races, which the tests below read
    entries = [e for e in list_models(MODELS) if e.card is not None and e.model_id.startswith("nvidia-h200-vllm0.24")]
    if not entries:
        pytest.skip("no bundled model under models/")
    return entries[0].folder


def _shape_fp() -> Fingerprint:
    from graphmode.selector.card import ModelCard

    shape = ModelCard.load(bundled_model()).shapes[0]
    return Fingerprint(gpu_name="NVIDIA H200", gpu_count=1, gpu_memory_gib=140.4, driver_version="580.159.04",
                       cuda_version="13.0", vllm_version="0.24.0", torch_version="2.11.0",
                       **{k: v for k, v in shape.items() if k in Fingerprint.model_fields})


def _record(mode: str, workload: str, repeat: int, fp: Fingerprint, *, status: str = "ok",
            ci: float | None = None) -> CellRecord:
    rate, burst, inp, out, itl, ttft = WORKLOADS[workload]
    startup_s, capture_s, graph_gib = START[mode]
    itl_s = itl[mode][repeat] / 1e3
    tpot_s = 0.003 if itl_s < 0.001 else itl_s * 1.02
    batch = rate * (ttft[mode] / 1e3 + out * tpot_s)
    return CellRecord(
        run_id=f"run-{mode}",
        profile_key="pk",
        mode=mode,
        workload=workload,
        workload_spec={"name": workload, "rate": rate, "burstiness": burst, "input": {"mean": inp, "spread": 0.2},
                       "output": {"mean": out, "spread": 0.2}},
        repeat=repeat,
        status=status,  # type: ignore[arg-type]
        reason=FAILED_REASON if status == "failed" else None,
        started_at=1_795_995_000.0 + 100 * repeat,
        finished_at=1_795_995_015.0 + 100 * repeat,
        features=ObservedFeatures(arrival_rate=rate * 1.02, prefill_decode_ratio=inp / out, mean_input_tokens=inp,
                                  mean_output_tokens=out, batch_mean=batch, batch_cv=0.4 / burst ** 0.5,
                                  concurrency_mean=batch,
                                  # planted saturation: NONE keeps requests waiting on the 32-req/s prefill load
                                  queue_mean=5.0 if (mode, workload) == ("NONE", "prefill-heavy-r32-b1") else 0.0),
        latency=LatencyStats(n_sent=100, n_ok=100, ttft_p50=ttft[mode] / 1e3 * (1 + 0.01 * repeat), itl_p50=itl_s,
                             tpot_p50=tpot_s, output_tok_s=rate * out * (1 - 0.001 * repeat),
                             sent_rate=rate, sent_output_tokens_mean=out,
                             **({"itl_p50_ci": ci} if ci is not None else {})),
        startup=StartupInfo(startup_s=startup_s, capture_s=capture_s, graph_gib=graph_gib,
                            attention_backend="FLASH_ATTN", model_runner="gpu_model_runner"),
        fingerprint=fp,
    )


def write_dataset(path: Path, *, repeats: int = 2, failed: bool = True, ci: float | None = None) -> Path:
    fp = _shape_fp()
    with ProfileStore(path) as store:
        for mode in MODES:
            for workload in WORKLOADS:
                for rep in range(repeats):
                    store.append(_record(mode, workload, rep, fp, ci=ci), f"h-{workload}")
        if failed:
            store.append(_record("FULL", "chat-r8-b1", 1, fp, status="failed"), "h-chat-r8-b1")
    return path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("report") / "campaign.sqlite")


@pytest.fixture(scope="module")
def data(dataset: Path) -> ReportData:
    return load_report_data([dataset])


@pytest.fixture(scope="module")
def built(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, str]:
    out = tmp_path_factory.mktemp("out") / "report.html"
    res = build_report([dataset], out, model_dir=bundled_model(), models_dir=MODELS, grid_points=5)
    return res, out.read_text(encoding="utf-8")


def _mean(v: list[float]) -> float:
    return sum(v) / len(v)


# ---------------------------------------------------------------- numbers
def test_headline_matches_a_hand_computation(data: ReportData) -> None:
    (shape,) = data.shapes
    assert [w.name for w in shape.workloads] == [  # prefill-heavy first, then by rate and burstiness
        "prefill-heavy-r32-b1", "chat-r8-b1", "decode-heavy-r2-b0.25", "decode-heavy-r32-b0.25"]
    rows = {r.metric: r for r in headline(data)}
    itl = rows["itl_p50"]
    # best mean per workload: chat FULL, decode-r2 F&P, prefill FULL (tied with F&P), decode-r32 F&P
    # (FULL's coalesced ITL is dropped, so it cannot win there)
    assert itl.n == 4 and itl.wins == {"NONE": 0, "FULL": 2, "FULL_AND_PIECEWISE": 2}
    assert itl.ties == 1
    losses = []
    for w, (_, _, _, _, vals, _) in WORKLOADS.items():
        means = {m: _mean(v) for m, v in vals.items() if not (w == "decode-heavy-r32-b0.25" and m == "FULL")}
        best = min(means.values())
        losses.append((means["FULL_AND_PIECEWISE"] - best) / best * 100)
    assert itl.default_median_loss_pct == pytest.approx(median(losses))
    assert itl.default_max_loss_pct == pytest.approx(max(losses))
    assert itl.default_max_loss_pct == pytest.approx((3.01 - 2.01) / 2.01 * 100)
    assert itl.default_max_loss_workload == "chat-r8-b1" and itl.worst_best_mode == "FULL"
    assert itl.default_ok == 3  # best on two workloads, tied on prefill-heavy
    ttft = rows["ttft_p50"]
    assert ttft.wins == {"NONE": 0, "FULL": 2, "FULL_AND_PIECEWISE": 2}
    # TTFT of repeat 1 is 1% above repeat 0 for every cell, so the means are 1.005 x the table values
    ttft_losses = [(t["FULL_AND_PIECEWISE"] - min(t.values())) / min(t.values()) * 100
                   for *_, t in WORKLOADS.values()]
    assert ttft.default_max_loss_pct == pytest.approx(max(ttft_losses))
    assert ttft.default_median_loss_pct == pytest.approx(median(ttft_losses))
    assert rows["output_tok_s"].n == 4


def test_repeats_failed_rows_and_facts(data: ReportData) -> None:
    (shape,) = data.shapes
    assert shape.ok_rows == {m: 8 for m in MODES} and shape.repeats == {m: (2, 2) for m in MODES}
    assert shape.failed_rows == {"FULL": 1}
    assert shape.attention["FULL"] == ["FLASH_ATTN"] and shape.runner["NONE"] == ["gpu_model_runner"]
    assert shape.constants["NONE"]["graph_gib"] == 0.0  # NONE captures no graphs
    assert shape.constants["FULL"]["graph_gib"] == pytest.approx(0.27)
    assert data.n_ok == 24 and data.max_repeats == 2
    (f,) = data.failed
    assert (f.mode, f.workload, f.repeat) == ("FULL", "chat-r8-b1", 1) and f.reason.startswith("vLLM exited")
    chat = shape.workload("chat-r8-b1")
    assert chat is not None and chat.cells["FULL"].n_rows == 2  # the failed row is not a measurement
    assert chat.cells["FULL"].vals("itl_p50") == pytest.approx([0.002, 0.00202])
    r32 = shape.workload("decode-heavy-r32-b0.25")
    assert r32 is not None and r32.cells["FULL"].itl_dropped == 2 and r32.cells["FULL"].vals("itl_p50") == []
    assert r32.cells["FULL"].vals("tpot_p50")  # only itl_* is dropped
    assert [(w, m) for _, w, m, _, _ in data.itl_dropped()] == [("decode-heavy-r32-b0.25", "FULL")]


def test_planted_noisy_cell_is_a_tie_and_clear_winners_are_not(data: ReportData) -> None:
    (shape,) = data.shapes
    prefill = shape.workload("prefill-heavy-r32-b1")
    chat = shape.workload("chat-r8-b1")
    assert prefill is not None and chat is not None
    v = prefill.verdicts["itl_p50"]
    assert v.best == "FULL" and v.tied and "FULL_AND_PIECEWISE" in v.ties
    assert v.chosen == "FULL_AND_PIECEWISE"  # the selector's rule: a tie goes to the default
    assert not chat.verdicts["itl_p50"].tied and chat.verdicts["itl_p50"].best == "FULL"
    a, b = WORKLOADS["prefill-heavy-r32-b1"][4]["FULL"]
    assert prefill.cells["FULL"].cv("itl_p50") == pytest.approx(float(np.std([a, b], ddof=1) / np.mean([a, b])))
    assert chat.cells["NONE"].cv("itl_p50") == pytest.approx(float(np.std([6.0, 6.02], ddof=1) / 6.01))


def test_pareto_points(data: ReportData) -> None:
    pts = {p.mode: p for p in pareto(data)}
    # ITL relative to the per-workload best, median over the workloads where the mode has a value
    rel_full = [2.01 / 2.01, 2.51 / 1.91, 2.4 / 2.4]
    assert pts["FULL"].rel["itl_p50"] == pytest.approx(median(rel_full))
    assert pts["FULL"].n["itl_p50"] == 3
    assert pts["NONE"].pareto["itl_p50"]  # no graph memory at all
    best = min(pts.values(), key=lambda p: p.rel["itl_p50"] or 9)
    assert best.pareto["itl_p50"]
    assert pts["FULL_AND_PIECEWISE"].startup_s == 65.0 and pts["FULL"].graph_gib == pytest.approx(0.27)


# ---------------------------------------------------------------- figures
def test_decision_map_over_the_models_features(data: ReportData) -> None:
    model = load_model(bundled_model())
    maps = decision_maps(model, data, points=4)
    assert len(maps) == len(model.card.shapes)
    dm = maps[0]
    assert dm.burstiness == [1.0, 0.25] and len(dm.rates) == 4 and len(dm.ratios) == 4
    for (metric, b), grid in dm.choice.items():
        assert metric in ("itl_p50", "ttft_p50") and b in dm.burstiness
        assert all(x in model.card.modes for row in grid for x in row)
    assert {p.workload for p in dm.measured} == set(WORKLOADS)
    prefill = next(p for p in dm.measured if p.workload == "prefill-heavy-r32-b1")
    assert prefill.winner["itl_p50"] == "FULL" and len(prefill.ties["itl_p50"]) == 2
    for inp, out in dm.tokens:
        assert inp > 0 and out > 0
    fig = decision_figure(maps)
    heat = [t for t in fig.data if t.type == "heatmap"]
    assert len(heat) == 2 * len(dm.burstiness) * len(maps)
    assert any(t.name == "measured winner, tied within noise" for t in fig.data)


def test_pareto_figure_marks_the_front(data: ReportData) -> None:
    fig = pareto_figure(pareto(data))
    pts = [t for t in fig.data if t.mode == "markers+text" and t.visible]
    assert len(pts) == 1 and any("★" in x for x in pts[0].text)
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["ITL p50", "TTFT p50", "TPOT p50"]


# ---------------------------------------------------------------- the page
def test_page_leads_with_the_decision_and_loads_plotly_once_from_a_file(built: tuple[Any, str]) -> None:
    res, text = built
    assert "Plotly.newPlot" in text and 'src="http' not in text
    assert text.count("<script src=") == 1 and res.script is not None and res.script.is_file()
    assert f'<script src="{res.script.name}">' in text and "plotly.js v" not in text  # not inlined
    headings = [re.sub(r"<[^>]+>", "", h) for h in re.findall(r"<h2[^>]*>(.*?)</h2>", text, re.S)]
    assert [h.split(":")[0] for h in headings] == ["1 · Decision", "2 · Model", "3 · Measurements", "4 · Noise",
                                                   "5 · Capture sizes", "6 · Failed cells (1)"]
    h3 = re.findall(r"<h3[^>]*>(.*?)</h3>", text, re.S)
    assert len(h3) == len(set(h3))  # no two identical headings
    for anchor in ("decision", "model", "measured", "noise", "capture", "failed"):
        assert f"href='#{anchor}'" in text and f"id='{anchor}'" in text
    assert text.index("id='decision'") < text.index("id='measured'") < text.index("id='failed'")
    for div in ("fig-map", "fig-pareto"):
        assert f'id="{div}"' in text
    assert '"name":"FULL_AND_PIECEWISE (default)"' in text.replace(": ", ":")
    assert "CUDA out of memory" in text and "Traceback" not in text.split("6 · Failed cells")[2].split("</table>")[0]
    assert "ITL dropped in 1 cells" in text and "ITL p50 &lt; 0.5 × TPOT p50" in text
    assert "NVIDIA H200" in text and "vLLM 0.24.0" in text and "FLASH_ATTN" in text
    assert res.bytes < 10 * 1024 * 1024


def test_saturated_cells_are_named_and_the_rest_deliver_the_offered_load(
        built: tuple[Any, str], data: ReportData) -> None:
    delivered, saturated = data.saturation()
    assert delivered == pytest.approx(0.9995, abs=1e-4)  # output_tok_s = offered × (1 − 0.001 × repeat)
    assert [(w, ms) for _, w, ms in saturated] == [("prefill-heavy-r32-b1", ["NONE"])]
    _, text = built
    assert "median 1.00× the offered output tokens" in text
    assert "Saturated (vLLM queue ≥ 1 request on average)" in text and "prefill-heavy-r32-b1 (NONE)" in text


def test_between_start_effects_pair_each_later_start_with_the_first(built: tuple[Any, str],
                                                                     data: ReportData) -> None:
    full = next(e for e in data.start_effects("itl_p50") if e.mode == "FULL")
    # decode-heavy-r32-b0.25's FULL ITL was dropped (coalesced chunks): three workloads remain
    assert full.workloads == 3 and full.share_slower == 1.0
    assert full.median_ratio == pytest.approx(2.02 / 2.0) and full.max_ratio == pytest.approx(3.0 / 1.8)
    _, text = built
    assert "Between engine starts" in text and "1.01–1.67" in text


def test_paired_rounds_compare_modes_only_inside_one_round_on_one_gpu(tmp_path: Path) -> None:
    fp = _shape_fp()
    # round 0: FULL and the default on one GPU; round 1: FULL on GPU B, the default on GPU C (a lease
    # ended between them), so round 1 pairs nothing; rows without a UUID fall back to their profile run
    where = {("FULL", 0): "GPU-aaaaaaaa-1", ("FULL_AND_PIECEWISE", 0): "GPU-aaaaaaaa-1",
             ("FULL", 1): "GPU-bbbbbbbb-2", ("FULL_AND_PIECEWISE", 1): "GPU-cccccccc-3"}
    path = tmp_path / "paired.sqlite"
    with ProfileStore(path) as store:
        for (mode, rep), uuid in where.items():
            for workload in WORKLOADS:
                rec = _record(mode, workload, rep, fp)
                store.append(rec.model_copy(update={"startup": rec.startup.model_copy(update={"gpu_uuid": uuid})}),
                             f"h-{workload}")
        for workload in WORKLOADS:  # NONE: no UUID, its own profile run: never paired with the default
            store.append(_record("NONE", workload, 0, fp), f"h-{workload}")
    data = load_report_data([path])
    (full,) = data.paired_rounds()
    assert (full.mode, full.repeat, full.block) == ("FULL", 0, "aaaaaaaa")
    # ITL: decode-heavy-r32-b0.25's FULL row read coalesced chunks and is dropped, three workloads remain
    itl = [WORKLOADS[w][4]["FULL"][0] / WORKLOADS[w][4]["FULL_AND_PIECEWISE"][0]
           for w in WORKLOADS if w != "decode-heavy-r32-b0.25"]
    ttft = [WORKLOADS[w][5]["FULL"] / WORKLOADS[w][5]["FULL_AND_PIECEWISE"] for w in WORKLOADS]
    assert full.ratios["itl_p50"] == (3, pytest.approx(median(itl)))
    assert full.ratios["ttft_p50"] == (4, pytest.approx(median(ttft)))
    out = tmp_path / "report.html"
    build_report([path], out, model_dir=bundled_model(), models_dir=MODELS, grid_points=5)
    section = out.read_text(encoding="utf-8").split("Inside a round, on one GPU")[1].split("</table>")[0]
    assert "aaaaaaaa" in section and f"{median(ttft):.2f} (4)" in section and "bbbbbbbb" not in section
    verdicts = out.read_text(encoding="utf-8").split("Across rounds")[1].split("</table>")[0]
    assert "one round" in verdicts and "r0 (4)" in verdicts  # one paired round: no verdict yet


def _round(mode: str, rep: int, itl: tuple[int, float], ttft: tuple[int, float] | None = None) -> PairedRound:
    ratios = {"itl_p50": itl} | ({"ttft_p50": ttft} if ttft else {})
    return PairedRound(shape="s", mode=mode, repeat=rep, block=f"gpu{rep}", ratios=ratios)


def test_paired_wins_reach_the_summary_and_the_verdict_table() -> None:
    verdicts = paired_verdicts([_round("FULL", 0, (24, 0.75)), _round("FULL", 2, (3, 0.66)),
                                _round("NONE", 0, (24, 4.3)), _round("NONE", 2, (24, 3.1))], ("itl_p50",))
    row = HeadlineRow(shape="s", metric="itl_p50", n=24, wins={}, ties=24, default_median_loss_pct=0.0,
                      default_max_loss_pct=9.3, default_max_loss_workload="w", default_ok=24,
                      worst_best_mode="FULL", worst_best_value=0.0017, worst_default_value=0.00185)
    text = findings([row], (), verdicts)
    assert Finding("s", text.removeprefix("s — ")) == finding_items([row], (), verdicts)[0]
    want = "Paired inside rounds: FULL ITL p50 0.75×/0.66× the default's, lower in 2 of 2 rounds (24, 3 workloads)"
    assert want in text
    assert "NONE" not in text.split("Paired inside rounds")[1]  # only wins are headline news
    assert "Paired" not in findings([row])
    tab = render_table(paired_verdict_table(verdicts))
    full = next(r for r in tab.split("<tr>") if "<td>FULL</td>" in r)
    assert "r0 (24), r2 (3)" in full and "0.75 · 0.66" in full and 'class="verdict">lower' in full
    assert not paired_verdict_table([])


def test_no_paired_table_when_nothing_pairs(built: tuple[Any, str]) -> None:
    _, text = built
    # the shared fixture gives each mode its own profile run and no GPU UUID: nothing pairs, no table
    assert "Inside a round, on one GPU" not in text


def test_throughput_worst_case_is_named_only_where_the_engine_saturated() -> None:
    row = HeadlineRow(shape="s", metric="output_tok_s", n=24, wins={}, ties=20, default_median_loss_pct=3.0,
                      default_max_loss_pct=41.5, default_max_loss_workload="balanced-r2-b0.25", default_ok=21,
                      worst_best_mode="NONE", worst_best_value=797.0, worst_default_value=466.0)
    assert "41.5%" not in findings([row]) and "21/24" in findings([row])  # unsaturated: window noise
    assert "41.5% worse on balanced-r2-b0.25" in findings([row], {("s", "balanced-r2-b0.25")})


def test_headline_and_noise_tables_in_the_page(built: tuple[Any, str], data: ReportData) -> None:
    _, text = built
    itl = next(r for r in headline(data) if r.metric == "itl_p50")
    assert f"{itl.default_max_loss_pct:.1f}%" in text and f"{itl.default_median_loss_pct:.1f}%" in text
    noise = text.split("4 · Noise")[2]
    row = next(r for r in noise.split("<tr>") if "prefill-heavy-r32-b1" in r and "ITL p50" in r)
    assert "TIE: FULL_AND_PIECEWISE" in row
    cv = _mean([abs(1.8 - 3.0) / 2 ** 0.5]) / 2.4
    assert f"{cv:.1%}" in row and "noisy" in row
    chat = next(r for r in noise.split("<tr>") if "chat-r8-b1" in r and "ITL p50" in r)
    assert "TIE" not in chat


def test_cv_table_matches_cv_json(built: tuple[Any, str]) -> None:
    res, text = built
    cv = CVReport.model_validate_json((res.model.folder / "cv.json").read_text())
    section = text.split("<h3>Cross-validation</h3>")[1].split("3 · Measurements")[0]
    rows = section.split("<tr>")
    for s in cv.summaries:
        row = next(r for r in rows if f"<td>{s.objective}</td>" in r)
        for v in (s.mean_regret_pct, s.max_regret_pct, s.default_regret_pct):
            assert v is None or f"{v:.1f}%" in row
        if s.mean_gain_vs_default_pct is not None:
            assert f"{s.mean_gain_vs_default_pct:+.1f}%" in row
    assert f"{cv.folds} folds" in section and cv.chosen_regressor in section


# ---------------------------------------------------------------- missing pieces
def test_one_repeat_and_no_model(tmp_path: Path) -> None:
    ci = 0.034 if "itl_p50_ci" in LatencyStats.model_fields else None  # adaptive windows record a CI
    ds = write_dataset(tmp_path / "once.sqlite", repeats=1, failed=False, ci=ci)
    out = tmp_path / "r.html"
    res = build_report([ds], out, models_dir=tmp_path / "empty-registry")
    text = out.read_text()
    assert res.model is None and "Decision map skipped" in text and "No model: no cross-validation" in text
    assert "Every cell was measured once" in text and "6 · Failed cells (0)" in text
    if ci is not None:
        assert "±3.4% CI" in text.split("4 · Noise")[2]
    assert any("no trained model" in n for n in res.notes)
    res = build_report([ds], out, model_dir=bundled_model(), use_model=False)
    assert res.model is None and "Decision map skipped" in out.read_text()


def test_default_datasets(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no profile datasets"):
        default_datasets(tmp_path)
    (tmp_path / "profiles" / "pilot").mkdir(parents=True)
    (tmp_path / "profiles" / "pilot" / "a.sqlite").touch()
    paths, note = default_datasets(tmp_path)
    assert [p.name for p in paths] == ["a.sqlite"] and note and "pilot/a.sqlite" in note
    (tmp_path / "profiles" / "b.sqlite").touch()
    assert default_datasets(tmp_path) == ([tmp_path / "profiles" / "b.sqlite"], None)


def test_duplicate_rows_across_datasets_count_once(dataset: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.sqlite"
    shutil.copy(dataset, copy)
    d = load_report_data([dataset, copy])
    assert d.n_ok == 24 and d.duplicates == 25 and len(d.failed) == 1
    assert any("counted once" in n for n in d.notes)


# ---------------------------------------------------------------- bad input
def test_bad_datasets_are_dataset_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no profile dataset at"):
        load_report_data([tmp_path / "missing.sqlite"])
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(DatasetError, match="not a readable profile dataset"):
        load_report_data([junk])
    empty = tmp_path / "empty.sqlite"
    ProfileStore(empty).close()
    with pytest.raises(DatasetError, match="no ok rows"):
        load_report_data([empty])


def test_bad_model_dirs_are_model_errors(dataset: Path, tmp_path: Path) -> None:
    nocard = tmp_path / "nocard"
    nocard.mkdir()
    with pytest.raises(ModelError, match="card"):
        build_report([dataset], tmp_path / "r.html", model_dir=nocard)
    with pytest.raises(ModelError, match="no model folder"):
        load_model(tmp_path / "nowhere")
    broken = tmp_path / "badcv"
    shutil.copytree(bundled_model(), broken)
    (broken / "cv.json").write_text("{not json")
    with pytest.raises(ModelError, match="cross-validation report"):
        load_model(broken)
    (broken / "cv.json").unlink()
    assert "no cv.json" in load_model(broken).cv_source  # falls back to the card's copy
    assert not (tmp_path / "r.html").exists()


def test_cli(dataset: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "cli.html"
    r = runner.invoke(app, ["report", "--dataset", str(dataset), "--no-model", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.is_file() and "1 shapes, 24 ok cells, 1 failed" in " ".join(r.output.split())
    junk = tmp_path / "junk.sqlite"
    junk.write_text("garbage" * 200)
    r = runner.invoke(app, ["report", "--dataset", str(junk), "--out", str(tmp_path / "x.html")])
    assert r.exit_code == 1 and "not a readable profile dataset" in " ".join(r.output.split())
    r = runner.invoke(app, ["report", "--dataset", str(dataset), "--model-dir", str(tmp_path), "--out",
                            str(tmp_path / "x.html")])
    assert r.exit_code == 1 and "model card" in " ".join(r.output.split())
    r = runner.invoke(app, ["report", "--dataset", str(dataset), "--model-dir", str(tmp_path), "--no-model"])
    assert r.exit_code == 2
    assert not (tmp_path / "x.html").exists()


def test_the_report_builds_on_the_bundled_datasets_and_the_committed_summary_is_current(tmp_path: Path) -> None:
    """The HTML report is not committed; CI builds it from models/profiles/ with the bundled model, and the
    committed docs/report-summary.md must be what that build writes."""
    out, summary = tmp_path / "report.html", tmp_path / "summary.md"
    # no --dataset: the report reads the files the model's card names (by path and sha256)
    r = CliRunner().invoke(app, ["report", "--model-dir", str(bundled_model()), "--out", str(out),
                                 "--grid-points", "4", "--summary", str(summary)])
    assert r.exit_code == 0, r.output
    assert "3 shapes, 1259 ok cells, 0 failed" in " ".join(r.output.split())  # campaign 1080 + races 179
    text = out.read_text(encoding="utf-8")
    assert "nvidia-h200-vllm0.24.0" in text and out.stat().st_size < 3_000_000
    # the decision leads: the race verdict table of the model's GPU × release, with an all-rounds ratio
    decision = text.split("id='decision'")[1].split("id='model'")[0]
    assert "H200 · vLLM 0.24.0" in decision and "over" in decision and "rounds ·" in decision
    committed = REPO / "docs" / "report-summary.md"
    assert summary.read_text(encoding="utf-8") == committed.read_text(encoding="utf-8"), (
        "docs/report-summary.md is stale: bench/report_screenshot.sh (or graphmode report --summary) rewrites it")


def test_the_cli_does_not_import_plotly() -> None:
    code = "import sys, graphmode.cli.main; sys.exit('plotly' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_cv_json_is_what_the_card_holds() -> None:
    folder = bundled_model()
    card = json.loads((folder / "card.json").read_text())
    cv = json.loads((folder / "cv.json").read_text())
    assert cv["folds"] == card["cv"]["folds"]


def findings(*args: Any) -> str:
    """The findings as the page shows them (shape, then its text)."""
    return " ".join(f"{f.shape} — {f.text}" for f in finding_items(*args))


def render_table(t: Table) -> str:
    return str(environment().from_string('{% from "_macros.html.j2" import table %}{{ table(t) }}').render(t=t))

