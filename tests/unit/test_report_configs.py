"""The report's configuration axis: rows grouped by deployment and vLLM release, raced apart, never pooled."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from graphmode.core.modes import DEFAULT_MODE
from graphmode.report import build_report
from graphmode.report.configs import Configuration, config_label, configurations, markdown, release
from graphmode.report.decide import releases, verdict_table
from graphmode.report.html import environment
from graphmode.report.load import load_report_data
from graphmode.report.summary import summary_markdown
from graphmode.selector.verdicts import race_verdicts

D = DEFAULT_MODE.value
REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "models" / "profiles"
QWEN_024 = PROFILES / "race-h200-qwen2.5-0.5b.sqlite"
QWEN_033 = PROFILES / "race-h200-vllm0.33-qwen2.5-0.5b.sqlite"


def race_rows(race: str, full_itl: list[float], *, vllm: str = "0.24.0", backend: str = "FLASH_ATTN",
              unknown: str = "[]") -> list[dict[str, Any]]:
    """One race of FULL against the default on one shape: per round, FULL's ITL ratio to the default's 2 ms
    (TTFT equal every round). The deployment columns are the ones the profiler writes."""
    dep = {"dep_attention_backend": backend, "dep_attention_backend_source": "log",
           "dep_attention_backend_requested": 0, "dep_tensor_parallel_size": 1, "dep_max_model_len": 4096,
           "dep_unknown": unknown}
    common = {"status": "ok", "race_id": race, "workload": "chat", "fp_model_config_hash": "abc123",
              "fp_model_architecture": "Qwen2ForCausalLM", "fp_num_params_b": 0.49, "fp_gpu_name": "NVIDIA H200",
              "fp_vllm_version": vllm, "ttft_p50": 0.01, **dep}
    rows: list[dict[str, Any]] = []
    for i, ratio in enumerate(full_itl):
        rows.append({**common, "race_round": i, "race_arm": D, "mode": D, "itl_p50": 0.002})
        rows.append({**common, "race_round": i, "race_arm": "FULL", "mode": "FULL", "itl_p50": 0.002 * ratio})
    return rows


def _full_itl(c: Any) -> Any:
    (skey,) = c.shapes
    return c.pooled(skey)[("FULL", "itl_p50")]


@pytest.mark.parametrize("second", [{"vllm": "0.33.0"}, {"backend": "FLASHINFER"}])
def test_two_configurations_are_raced_apart(second: dict[str, str]) -> None:
    a = race_rows("r1", [0.80, 0.81, 0.79, 0.80, 0.80], vllm="0.24.0+cu129")
    b = race_rows("r2", [1.30, 1.31, 1.29, 1.30, 1.30], **second)
    got = configurations([*a, *b])
    assert len(got) == 2 and len({c.label for c in got}) == 2
    by = {c.label: c for c in got}
    first = next(c for label, c in by.items() if ("0.24.0" in label and "FLASH_ATTN" in label))
    other = next(c for c in got if c is not first)
    fa, fb = _full_itl(first), _full_itl(other)
    assert fa.verdict == "better" and fa.ratio == pytest.approx(0.80, abs=0.01)
    assert fb.verdict == "worse" and fb.ratio == pytest.approx(1.30, abs=0.01)
    # pooled over both, the shape would get a single verdict for both releases/backends: the axis keeps two
    pooled = [v for v in race_verdicts([*a, *b]) if v.workload is None and v.mode == "FULL" and v.metric == "itl_p50"]
    assert len(pooled) == 1 and (fa.verdict, fa.ratio) != (fb.verdict, fb.ratio)
    assert first.ok_rows == len(a) and other.ok_rows == len(b)

    for mine, theirs in ((first, fb), (other, fa)):
        page = _render(verdict_table([mine]))
        v = _full_itl(mine)
        assert f"<b>{v.verdict}</b>" in page and f"{v.ratio:.3f}×" in page and f"{theirs.ratio:.3f}×" not in page

    lines = markdown(got)
    rows = [ln for ln in lines if ln.startswith("| H200")]
    assert len(rows) == 2
    assert any(fa.cell() in r and "| yes |" in r for r in rows) and any(fb.cell() in r for r in rows)


def test_a_local_build_tag_is_the_same_release_and_labels_say_what_is_set() -> None:
    assert release("0.24.0+cu129") == release("0.24.0") == "0.24.0" and release(None) is None
    got = configurations([*race_rows("r1", [0.8] * 4, vllm="0.24.0+cu129"), *race_rows("r2", [0.8] * 4)])
    assert len(got) == 1 and got[0].label == "H200 · vLLM 0.24.0 · FLASH_ATTN · unquantized · max_model_len 4096"
    key = ("NVIDIA H200", "0.24.0", "FLASHINFER", ("ngram", 3), "fp8", 1024, None, 2, (60, 4, 2.7))
    assert config_label(key) == ("H200 · vLLM 0.24.0 · FLASHINFER · TP=2 · fp8 · ngram k=3 · max_num_seqs 1024 · "
                                 "MoE 60×4, 2.7B active")
    assert config_label((*key[:5], 1024, 4096, 1, (None, None, 1.2), 4)) == (
        "H200 · vLLM 0.24.0 · FLASHINFER · fp8 · ngram k=3 · max_num_seqs 1024 · 4 API servers · "
        "max_model_len 4096")
    # an element the row could not establish stays unknown and splits from a known value
    unsure = configurations([*race_rows("r1", [0.8] * 4), *race_rows("r2", [0.8] * 4, unknown='["quantization"]')])
    assert sorted(c.label for c in unsure) == [
        "H200 · vLLM 0.24.0 · FLASH_ATTN · quantization ? · max_model_len 4096",
        "H200 · vLLM 0.24.0 · FLASH_ATTN · unquantized · max_model_len 4096",
    ]


def test_an_unraced_configuration_says_so() -> None:
    rows = [{**r, "race_round": None, "race_arm": None} for r in race_rows("r1", [0.8] * 3)]
    (c,) = configurations(rows)
    assert not c.raced() and c.tables() == []
    assert not verdict_table([c]) and not releases([c], None, use_model=False)[0].verdicts
    assert "| no |" in markdown([c])[-1]


def test_the_committed_qwen_races_of_two_vllm_releases_are_two_configurations(tmp_path: Path) -> None:
    if not (QWEN_024.is_file() and QWEN_033.is_file()):
        pytest.skip("committed race datasets missing")
    data = load_report_data([QWEN_024, QWEN_033], shapes_dir=REPO / "models" / "shapes")
    qwen = [c for c in data.configurations if "qwen2.5-0.5b" in c.shapes.values()]
    assert [c.key[1] for c in qwen] == ["0.24.0", "0.33.0"]
    assert all(c.raced() and c.tables() for c in qwen)
    # each release's verdicts are its own rows' (the 0.24.0 ones match the bundled 0.24.0 card's races)
    old, new = (_full_itl(c) for c in qwen)
    assert (old.rounds, old.ratio) != (new.rounds, new.ratio)
    assert qwen[0].ok_rows == 55 and qwen[1].ok_rows == 90

    summary = summary_markdown(data, None, "graphmode report --summary FILE")
    table = summary.split("## Configurations")[1]
    assert "vLLM 0.24.0" in table and "vLLM 0.33.0" in table and old.cell() in table and new.cell() in table

    out = tmp_path / "r.html"
    build_report([QWEN_024, QWEN_033], out, use_model=False)
    page = out.read_text(encoding="utf-8").split("<section id='decision'>")[1].split("<section id='model'>")[0]
    titles = re.findall(r"<section class='release' id='rel\d'><h3>([^<]*)</h3>", page)
    assert titles == ["H200 · vLLM 0.24.0", "H200 · vLLM 0.33.0"]
    old_block, new_block = page.split("id='rel1'")
    assert f"{old.ratio:.3f}×" in old_block and f"{new.ratio:.3f}×" in new_block


def test_each_configuration_shows_its_arms_engine_memory_start_up_and_acceptance() -> None:
    rows = race_rows("r1", [0.8] * 3)
    for r in rows:
        full = r["race_arm"] == "FULL"
        r.update({"race_start_id": f"r1:{r['race_arm']}:1", "engine_gpu_gib": 21.58 if full else 21.78,
                  "startup_s": 74.0 if full else 78.0, "start_wave_engines": 2,
                  "obs_spec_acceptance_rate": 0.9 if full else 0.8, "obs_spec_accept_length": 3.5})
    (c,) = configurations(rows)
    ((_, costs),) = c.costs.items()
    assert costs[D].engine_gpu_gib == pytest.approx(21.78) and costs[D].starts == 1 and costs[D].cells == 3
    assert costs["FULL"].spec_acceptance == pytest.approx(0.9) and costs["FULL"].waves == (2,)
    page = _page([c])
    assert ("<td>FULL</td><td>21.58</td><td>-0.20</td><td>74 (waves of 2)</td><td>1</td><td>0.90</td>"
            "<td>3.50</td>") in page
    # rows without any of it (before 2026-12-02): no such table
    (bare,) = configurations(race_rows("r1", [0.8] * 3))
    assert "engine GPU GiB" not in _page([bare])


def _render(t: Any) -> str:
    return str(environment().from_string('{% from "_macros.html.j2" import table %}{{ table(t) }}').render(t=t))


def _page(configs: list[Configuration]) -> str:
    """The decision section's release blocks for ``configs`` (no model), as the page renders them."""
    out = []
    for r in releases(configs, None, use_model=False):
        out += [_render(r.verdicts), *(_render(t) for _, t in r.costs)]
    return "\n".join(out)
