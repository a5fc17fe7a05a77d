"""A one-start "better" is acted on when the model's other races (their own engine starts) agree: the t
interval over the races' log ratios, without the race itself (graphmode.selector.verdicts.across_races)."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from graphmode.core.modes import DEFAULT_MODE
from graphmode.selector.verdicts import MIN_OTHER_RACES, RaceVerdict, across_aa_arms, across_races, race_decision

D = DEFAULT_MODE.value
ORDER = ["FULL", D, "FULL_DECODE_ONLY", "PIECEWISE"]
# FULL's pooled TTFT ratio per race, H200 / vLLM 0.33 (2026-12-02): seven races, each its own engine starts
H200_FULL_TTFT = {"0.5b": 0.66, "1b": 0.75, "8b": 0.83, "1b-triton": 0.76, "8b-triton": 0.67, "8b-fp8": 0.74,
                  "olmoe": 0.75}


def _v(shape: str, ratio: float, verdict: str = "better", mode: str = "FULL", starts: int = 1,
       runs_as: str | None = None, metric: str = "ttft_p50") -> RaceVerdict:
    return RaceVerdict(shape=shape, mode=mode, metric=metric, verdict=verdict,  # type: ignore[arg-type]
                       rounds=8, ratio=ratio, lo=ratio * 0.8, hi=ratio * 1.2 if verdict != "better" else ratio * 0.95,
                       delta=0.03, confidence=0.95, starts=starts, runs_as=runs_as)


def test_the_interval_is_a_t_interval_over_the_races_log_ratios() -> None:
    vs = [_v(s, r) for s, r in H200_FULL_TTFT.items()]
    got = across_races(vs, "FULL", "ttft_p50")
    assert got is not None and got.races == 7 and got.verdict == "better"
    logs = [math.log(r) for r in H200_FULL_TTFT.values()]
    mean = sum(logs) / 7
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 6)
    half = stats.t.ppf(0.975, 6) * sd / math.sqrt(7)
    assert got.ratio == pytest.approx(math.exp(mean))
    assert (got.lo, got.hi) == (pytest.approx(math.exp(mean - half)), pytest.approx(math.exp(mean + half)))
    assert got.hi < 0.97 and "over 7 other races" in got.describe()


def test_the_race_itself_and_what_is_not_the_mode_are_left_out() -> None:
    vs = [_v(s, r) for s, r in H200_FULL_TTFT.items()]
    vs += [_v("fi", 1.23, "undecided", runs_as=D),  # FULL that vLLM ran as the default: an A/A arm
           _v("aa", 1.3, "undecided", mode="CONTROL"), _v("1b", 0.9, metric="itl_p50")]
    got = across_races(vs, "FULL", "ttft_p50", exclude_shape="8b")
    assert got is not None and got.races == 6 and "8b" not in got.shapes and "fi" not in got.shapes
    # a region verdict (one workload) is not a race of its own
    region = _v("x", 0.5).model_copy(update={"workload": "c1-short"})
    assert across_races([*vs, region], "FULL", "ttft_p50", exclude_shape="8b").races == 6  # type: ignore[union-attr]


def test_too_few_races_or_races_that_disagree_decide_nothing() -> None:
    few = [_v(s, r) for s, r in list(H200_FULL_TTFT.items())[:MIN_OTHER_RACES - 1]]
    assert across_races(few, "FULL", "ttft_p50") is None
    # starts that scatter either way (A/A-like: ±20%) never read better
    scattered = [_v(f"s{i}", r, "undecided") for i, r in enumerate([0.8, 1.2, 0.85, 1.18, 0.9, 1.1])]
    got = across_races(scattered, "FULL", "ttft_p50")
    assert got is not None and got.verdict == "undecided"
    flat = [_v(f"s{i}", r, "equivalent") for i, r in enumerate([0.995, 1.0, 1.005, 0.998, 1.002])]
    assert across_races(flat, "FULL", "ttft_p50").verdict == "equivalent"  # type: ignore[union-attr]
    slow = [_v(f"s{i}", r, "worse") for i, r in enumerate([1.3, 1.4, 1.35, 1.5])]
    assert across_races(slow, "FULL", "ttft_p50").verdict == "worse"  # type: ignore[union-attr]


def test_a_one_start_better_is_acted_on_when_the_other_races_agree() -> None:
    vs = [_v(s, r) for s, r in H200_FULL_TTFT.items()]
    got = race_decision(vs, "8b-triton", "ttft_p50", {}, ORDER, {}, weighted=False)
    assert got is not None and got.mode == "FULL" and got.basis == "better"
    assert any("the other races agree" in n and "over 6 other races" in n for n in got.notes)
    # alone, or beside races that scatter, the same verdict keeps the default
    alone = race_decision([vs[4]], "8b-triton", "ttft_p50", {}, ORDER, {}, weighted=False)
    assert alone is not None and alone.mode == D and any("no other paired comparison" in n for n in alone.notes)
    scattered = [vs[4]] + [_v(f"s{i}", r, "undecided") for i, r in enumerate([0.8, 1.2, 0.85, 1.18])]
    assert race_decision(scattered, "8b-triton", "ttft_p50", {}, ORDER, {}, weighted=False).mode == D  # type: ignore[union-attr]


def test_an_undecided_race_is_not_decided_by_the_others_but_says_what_would_settle_it() -> None:
    vs = [_v(s, r) for s, r in H200_FULL_TTFT.items() if s != "8b-fp8"] + [_v("8b-fp8", 0.741, "undecided")]
    got = race_decision(vs, "8b-fp8", "ttft_p50", {}, ORDER, {}, weighted=False)
    assert got is not None and got.mode == D and got.undecided == ["FULL"]
    assert any("undecided" in n and "over 6 other races" in n and "--budget-min" in n for n in got.notes)
    # a mode the objective's constraints exclude gets no such note
    kept_out = race_decision(vs, "8b-fp8", "ttft_p50", {}, ORDER, {}, weighted=False, allowed=[D])
    assert kept_out is not None and not any("other races" in n for n in kept_out.notes)


def test_an_undecided_race_held_back_only_by_its_starts_is_acted_on_like_one_start() -> None:
    """The H200's 1b-ngram5 race (2026-12-03): a resume on a new host gave it a second start of each side,
    FULL's TTFT read 0.765x [0.67-0.88] over both, and with no A/A arm the start effect between them was
    unmeasured, so the race left it undecided: the same evidence as a one-start "better", and more."""
    held = _v("1b-ngram5", 0.765, "undecided", starts=2).model_copy(update={"reads": "better", "hi": 0.878})
    vs = [_v(s, r) for s, r in H200_FULL_TTFT.items()] + [held]
    got = race_decision(vs, "1b-ngram5", "ttft_p50", {}, ORDER, {}, weighted=False)
    assert got is not None and got.mode == "FULL" and got.basis == "better" and got.undecided == []
    assert any("2 engine starts each read better together" in n and "the other races agree" in n
               for n in got.notes)
    assert not any("--budget-min" in n for n in got.notes)  # more rounds are not what it lacks
    assert held.cell() == "undecided 0.765× [0.61–0.88] n=8 s=2 (reads better; start effect unmeasured)"
    alone = race_decision([held], "1b-ngram5", "ttft_p50", {}, ORDER, {}, weighted=False)
    assert alone is not None and alone.mode == D and alone.undecided == ["FULL"]
    assert any("an A/A arm (--control) would decide it" in n for n in alone.notes)
    # an undecided race whose rounds themselves are open is not lifted by the others
    open_ = held.model_copy(update={"reads": None})
    assert race_decision([*vs[:-1], open_], "1b-ngram5", "ttft_p50", {}, ORDER, {}, weighted=False).mode == D  # type: ignore[union-attr]


def test_the_a_a_arms_are_the_control_and_read_no_effect() -> None:
    # the H200 / vLLM 0.33 A/A arms' TTFT (2026-12-02): two CONTROL arms, two FULL arms vLLM ran as the default
    vs = [_v("1b", 0.842, "undecided", mode="CONTROL"), _v("0.5b", 0.943, "undecided", mode="CONTROL"),
          _v("1b-fi", 1.228, "undecided", runs_as=D), _v("8b-fi", 1.071, "undecided", runs_as=D),
          _v("8b", 0.83), _v("8b-pw", 1.2, "undecided", mode="PIECEWISE", runs_as="PIECEWISE_OTHER")]
    got = across_aa_arms(vs, "ttft_p50")
    assert got is not None and got.races == 4 and got.verdict == "undecided"
    assert got.lo < 1.0 < got.hi and got.ratio == pytest.approx(1.011, abs=0.001)
    assert across_aa_arms(vs[:2], "ttft_p50") is None


def test_the_bundled_033_model_answers_full_for_ttft_where_vllm_runs_it() -> None:
    """The H200 races (2026-12-02): FULL's one-start TTFT wins, corroborated by the other races, now answer a
    TTFT objective; ITL keeps the default, FlashInfer never gets FULL, FP8's own race is undecided, ngram
    gets FULL for TTFT."""
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from graphmode.cli.main import app

    root = Path(__file__).resolve().parents[2]
    base = ["recommend", "--models-dir", str(root / "models"), "--gpu", "NVIDIA H200", "--vllm-version", "0.33.0",
            "--rate", "4", "--input-tokens", "512", "--output-tokens", "128", "--json",
            "--model-path", str(root / "models" / "shapes" / "llama-3.1-8b.json")]

    def answer(objective: str, vllm_args: str) -> dict[str, object]:
        r = CliRunner().invoke(app, [*base, "--objective", objective,
                                     "--vllm-args", f"{vllm_args} --max-model-len 4096"])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)  # type: ignore[no-any-return]

    triton = answer("ttft_p50", "--attention-backend TRITON_ATTN")
    assert triton["mode"] == "FULL" and triton["race"]["basis"] == "better"  # type: ignore[index]
    assert any("the other races agree" in n for n in triton["notes"])  # type: ignore[attr-defined]
    assert answer("itl_p50", "--attention-backend TRITON_ATTN")["mode"] == D
    assert answer("ttft_p50", "--attention-backend FLASHINFER")["mode"] == D
    fp8 = answer("ttft_p50", "--quantization fp8")
    assert fp8["mode"] == D and any("would likely settle it" in n for n in fp8["notes"])  # type: ignore[attr-defined]
    # ngram k=3 (lease 3): vLLM runs every mode as asked, so FULL for TTFT and never PIECEWISE (1.6x ITL),
    # which a wrong downgrade rule used to answer for every ngram deployment
    ngram = "--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'"
    spec_ttft = answer("ttft_p50", ngram)
    assert spec_ttft["mode"] == "FULL" and spec_ttft["race"]["basis"] == "better"  # type: ignore[index]
    assert answer("itl_p50", ngram)["mode"] == D
    k5 = answer("ttft_p50", ngram.replace('"num_speculative_tokens": 3', '"num_speculative_tokens": 5'))
    # k=5 on the 8B (2026-12-03, lease 4c): FULL's TTFT 0.814x [0.68-0.97] from one start, the other races agree
    assert k5["mode"] == "FULL" and k5["race"]["basis"] == "better"  # type: ignore[index]
    assert not any("profiled on" in w for w in k5["warnings"])  # type: ignore[attr-defined]
    # k=5 on the 1B (2026-12-03, two starts of each side, no A/A arm): FULL's TTFT 0.765x, acted on with the others
    base[-1] = str(root / "models" / "shapes" / "llama-3.2-1b.json")
    k5_1b = answer("ttft_p50", ngram.replace('"num_speculative_tokens": 3', '"num_speculative_tokens": 5'))
    assert k5_1b["mode"] == "FULL" and k5_1b["race"]["basis"] == "better"  # type: ignore[index]
    # lease 5 (2026-12-03): the 30B MoE and EAGLE with a never-accepted dummy draft answer the default
    base[-1] = str(root / "models" / "shapes" / "llama-3.1-8b.json")
    eagle_args = "--speculative-config '{\"method\": \"eagle\", \"model\": \"d\", \"num_speculative_tokens\": 3}'"
    eagle = answer("ttft_p50", eagle_args)
    assert eagle["mode"] == D
    assert any("drafts 0% accepted" in n and "with caution" in n for n in eagle["notes"])  # type: ignore[attr-defined]
    base[-1] = str(root / "models" / "shapes" / "qwen3-30b-a3b.json")
    moe = answer("itl_p50", "")
    assert moe["mode"] == D
    # its PIECEWISE race (2.17x ITL over 3 rounds) is open once α is spent over the looks: still never chosen
    assert moe["race"] is None or moe["race"]["mode"] == D  # type: ignore[index]


def test_each_race_counts_with_its_ratio_over_every_round() -> None:
    """A sequential verdict's ratio stops at its first crossing, reached sooner on extreme rounds; a race's
    sample across races is its ratio over all its rounds (``ratio_all``) where recorded."""
    from graphmode.selector.verdicts import race_verdicts
    from tests.unit.test_race_verdicts import race_rows

    # FULL crosses "better" at round 3 on 0.80s, then runs 0.95 for three more rounds
    rows = race_rows({"FULL": {"low": [0.8, 0.81, 0.79, 0.95, 0.95, 0.95]}})
    (v,) = [v for v in race_verdicts(rows) if v.mode == "FULL" and v.metric == "itl_p50" and v.workload is None]
    assert v.verdict == "better" and v.rounds == 3 and v.ratio == pytest.approx(0.8, abs=0.01)
    assert v.rounds_all == 6 and v.ratio_all == pytest.approx(math.exp(sum(
        math.log(x) for x in [0.8, 0.81, 0.79, 0.95, 0.95, 0.95]) / 6))
    vs = [_v(f"s{i}", 0.6).model_copy(update={"ratio_all": 0.9}) for i in range(4)]
    got = across_races(vs, "FULL", "ttft_p50")
    assert got is not None and got.ratio == pytest.approx(0.9)


def test_the_bundled_033_model_picks_the_1b_pool_by_prompt_length() -> None:
    """Lease 6 (2026-12-03): the 1B at 1-4K prompts (max_model_len 8192) reads FULL's TTFT 0.992x
    [0.91-1.08] over 18 rounds, so FULL's short-prompt win (0.66-0.84x) is not carried to mid-length prompts;
    a request without --max-model-len takes the pool whose raced workloads sit nearest it."""
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from graphmode.cli.main import app

    root = Path(__file__).resolve().parents[2]

    def answer(prompt: int) -> dict[str, object]:
        r = CliRunner().invoke(app, [
            "recommend", "--models-dir", str(root / "models"), "--gpu", "NVIDIA H200", "--vllm-version", "0.33.0",
            "--rate", "4", "--input-tokens", str(prompt), "--output-tokens", "128", "--json", "--objective",
            "ttft_p50", "--model-path", str(root / "models" / "shapes" / "llama-3.2-1b.json")])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)  # type: ignore[no-any-return]

    short, mid, long = answer(512), answer(2048), answer(12000)
    assert short["mode"] == "FULL"
    assert mid["mode"] == D and long["mode"] == D
    assert any("max_model_len=8192 answer" in n for n in mid["notes"])  # type: ignore[attr-defined]
    assert any("max_model_len=17408 answer" in n for n in long["notes"])  # type: ignore[attr-defined]
