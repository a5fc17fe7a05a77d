"""What races of capture lists measured, attached to a capture answer (selector/capture_evidence.py)."""

from __future__ import annotations

import json
from pathlib import Path

from graphmode.core.dataset import ProfileStore
from graphmode.selector.capture_evidence import MIN_SIMILARITY, capture_evidence, evidence_for, jaccard
from tests.unit.test_capture_table import LOW, write_dataset

ROOT = Path(__file__).resolve().parents[2]
MODEL_033 = ROOT / "models" / "nvidia-h200-vllm0.33.0-3375a87d3889"


def test_the_raced_list_like_the_chosen_one_brings_its_verdicts(tmp_path: Path) -> None:
    ds = tmp_path / "cap.sqlite"
    write_dataset(ds)  # the short list: equivalent at low load, 1.5x ITL at high load, two starts a side
    ev = capture_evidence([ds], LOW)
    assert ev is not None and ev.sizes == sorted(LOW) and ev.similarity == 1.0
    assert ev.mode == "FULL_AND_PIECEWISE" and ev.race.endswith(":race-synth")
    itl = {v.workload: v for v in ev.verdicts if v.metric == "itl_p50"}
    assert itl["cap-low-r2"].verdict == "equivalent" and itl["cap-high-r32"].verdict == "worse"
    assert itl["cap-high-r32"].ratio is not None and 1.45 < itl["cap-high-r32"].ratio < 1.55
    note = ev.note()
    assert "itl_p50 1.5" in note and "worse" in note and "equivalent" in note and "No latency effect" not in note
    # a list sharing under half its union with every raced one: nothing to say
    assert capture_evidence([ds], [3, 5, 7, 9, 11, 13, 15, 512]) is None
    near = sorted({*LOW, 1000})
    assert jaccard(near, LOW) >= MIN_SIMILARITY
    got = capture_evidence([ds], near)
    assert got is not None and got.similarity == round(jaccard(near, LOW), 3) < 1.0


def test_no_race_of_a_list_is_no_evidence(tmp_path: Path) -> None:
    ds = tmp_path / "cap.sqlite"
    write_dataset(ds)
    with ProfileStore(ds) as store:
        store._db.execute("DELETE FROM cells WHERE race_id IS NOT NULL")
    assert capture_evidence([ds], LOW) is None


def test_the_bundled_033_model_says_the_1b_short_lists_latency_is_not_shown() -> None:
    """Lease 8's race (four engines a list, 13 rounds) and the same list's closed-loop race: every verdict
    open, and the answer says so rather than letting the start-up savings read as 'latency unchanged'."""
    config = json.loads((ROOT / "models" / "shapes" / "llama-3.2-1b.json").read_text())
    ev = evidence_for(MODEL_033, [1, 2, 4, 8, 256, 512], config)
    assert ev is not None and ev.similarity == 1.0 and ev.race.endswith("race-254d1a2f0467")
    assert [r.rsplit(":", 1)[-1] for r in ev.races] == ["race-254d1a2f0467", "race-d6fd90d697b3"]
    assert {v.workload for v in ev.verdicts} == {"cap-low-r2", "cap-high-r32", "cap-low-c1", "cap-high-c48"}
    assert all(v.verdict == "undecided" for v in ev.verdicts)
    assert next(v.n for v in ev.verdicts if v.workload == "cap-low-r2") == 7
    note = ev.note()
    # closed loop first, then the slowest open load; each race's pooled verdict named by its race
    assert note.index("at 1 in flight") < note.index("at 48 in flight") < note.index("at 2.29 req/s") \
        < note.index("at 31.9 req/s")
    assert "over race-254d1a2f0467's 2 workloads" in note and "over race-d6fd90d697b3's 2 workloads" in note
    assert "prompt" not in note  # every workload 256 + 256 tokens: lengths would tell nothing apart
    assert "No latency effect shown either way" in note


def test_the_bundled_033_model_says_the_8b_bounded_list_raced_equivalent_closed_loop() -> None:
    """Lease 10: the 22-size list for 2 req/s against the default list at 1 and 48 in flight, two starts a
    side: ITL equivalent over both (the race's own verdict), which the answer puts first."""
    config = json.loads((ROOT / "models" / "shapes" / "llama-3.1-8b.json").read_text())
    low = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 120, 144, 176, 216, 256, 320, 384, 448, 512]
    ev = evidence_for(MODEL_033, low, config)
    assert ev is not None and ev.similarity == 1.0 and ev.race.endswith("race-3b8b01ffd118")
    assert {(v.workload, v.in_flight) for v in ev.verdicts} == {("cap-low-c1", 1), ("cap-high-c48", 48)}
    itl = next(v for v in ev.pooled if v.metric == "itl_p50")
    assert itl.verdict == "equivalent" and itl.lo is not None and itl.hi is not None and 0.97 < itl.lo < itl.hi < 1.03
    note = ev.note()
    assert note.index("over its 2 workloads: itl_p50 1.00") < note.index("at 1 in flight") < note.index("at 48 in")
    assert "No latency effect" not in note


def test_every_race_of_the_8b_long_list_counts_and_says_how_it_ran() -> None:
    """Leases 11-13 raced one list to 1024 (four API servers, 768 in flight) three times: mixed steps
    (48 output tokens, undecided), steady decode with the list arm preempting (768 tokens) and steady
    decode with room (384 tokens, better 0.73x TPOT). Naming only the race with the most rounds would have
    said no effect was shown."""
    config = json.loads((ROOT / "models" / "shapes" / "llama-3.1-8b.json").read_text())
    chosen = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 120, 144, 176, 216, 264, 323, 385, 456, 571, 692, 699,
              707, 714, 721, 727, 737, 748, 761, 768, 824, 1024]
    ev = evidence_for(MODEL_033, chosen, config)
    assert ev is not None and len(ev.races) == 3 and ev.race.endswith("race-13bf34d4626d")  # most rounds (24)
    tpot = {v.output_tokens: v for v in ev.verdicts if v.metric == "tpot_p50"}
    assert set(tpot) == {48.0, 384.0, 768.0}
    assert tpot[48.0].verdict == "undecided" and tpot[384.0].verdict == "better" and tpot[768.0].verdict == "better"
    assert tpot[384.0].ratio is not None and 0.70 < tpot[384.0].ratio < 0.76 and tpot[384.0].n == 12
    assert tpot[384.0].preemptions is None and tpot[768.0].preemptions is not None
    mine, default = tpot[768.0].preemptions
    assert mine > 100 > default
    note = ev.note()
    assert note.index("48 output tokens") < note.index("384 output tokens") < note.index("768 output tokens")
    assert "preempting (" in note and "No latency effect" not in note


def test_a_burst_read_itl_is_no_ratio() -> None:
    """The 0.5B's lease-12 round read ITL p50 0.017 ms (the client read in bursts): not a ratio of 0.000."""
    config = json.loads((ROOT / "models" / "shapes" / "qwen2.5-0.5b.json").read_text())
    chosen = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 197, 216, 264, 328, 408, 507, 617, 684,
              714, 737, 758, 768, 824, 1024]
    ev = evidence_for(MODEL_033, chosen, config)
    assert ev is not None and ev.similarity == 1.0
    d768 = [v for v in ev.verdicts if v.output_tokens == 768.0]
    assert [v.metric for v in d768] == ["tpot_p50"] and "0.000x" not in ev.note() and "1 round:" in ev.note()
