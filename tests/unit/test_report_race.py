"""The report's race section (report/race.py): verdict tables per shape, the A/A row after the modes, and the
default's round-to-round spread (card.race_noise) as the last row."""

from __future__ import annotations

from pathlib import Path

from graphmode.report.race import markdown, tables
from graphmode.selector.card import ModelCard
from graphmode.selector.noise import RaceNoise
from graphmode.selector.verdicts import RaceVerdict

BUNDLED = Path(__file__).resolve().parents[2] / "models" / "nvidia-h200-vllm0.33.0-3375a87d3889"


def _v(mode: str, metric: str, ratio: float, verdict: str = "undecided") -> RaceVerdict:
    return RaceVerdict(shape="s1", mode=mode, metric=metric, verdict=verdict, rounds=7,  # type: ignore[arg-type]
                       ratio=ratio, lo=ratio * 0.9, hi=ratio * 1.1, delta=0.03, confidence=0.95, starts=1)


def _card(noise: list[RaceNoise]) -> ModelCard:
    card = ModelCard.load(BUNDLED)
    verdicts = [_v("FULL", "itl_p50", 0.97), _v("FULL", "ttft_p50", 0.7, "better"), _v("CONTROL", "itl_p50", 0.95),
                _v("NONE", "itl_p50", 3.0, "worse")]
    return card.model_copy(update={"race": verdicts, "race_noise": noise, "shapes": []})


def test_rows_modes_then_aa_then_the_clock() -> None:
    noise = [RaceNoise(shape="s1", metric="itl_p50", wander_cv_pct=12.04, wander_rounds=19, wander_df=13,
                       wander_minutes=6.0)]
    ((name, head, rows),) = tables(_card(noise))
    assert name == "s1" and head == ["mode", "itl_p50", "ttft_p50"]
    assert [r[0] for r in rows] == ["FULL", "NONE", "A/A: 2nd start of the default",
                                    "the default again, same start: round-to-round CV"]
    assert rows[0][2].startswith("better 0.700×") and rows[2][2] == "–"
    assert rows[-1][1:] == ["12.0% (n=19, ≤ 6 min)", "–"]
    md = "\n".join(markdown(_card(noise)))
    assert "| the default again, same start: round-to-round CV | 12.0% (n=19, ≤ 6 min) | – |" in md


def test_without_noise_or_races() -> None:
    (_, _, rows) = tables(_card([]))[0]
    assert rows[-1][0] == "A/A: 2nd start of the default"
    bare = _card([]).model_copy(update={"race": []})
    assert markdown(bare) == [] and tables(bare) == []


def test_the_bundled_cards_carry_the_noise() -> None:
    """The release models were retrained with race_noise (session 9): the report and recommend show it."""
    card = ModelCard.load(BUNDLED)
    assert card.race_noise and all(n.wander_cv_pct is not None or n.restart is not None for n in card.race_noise)
    assert any("round-to-round CV" in r[0] for _, _, rows in tables(card) for r in rows)


def test_the_across_races_table_and_its_control() -> None:
    from graphmode.report.race import across

    assert across(_card([])) is None  # one race: nothing across races
    verdicts = [RaceVerdict(shape=f"s{i}", mode="FULL", metric="ttft_p50", verdict="better", rounds=8,
                            ratio=r, lo=r * 0.8, hi=r * 0.95, delta=0.03, confidence=0.95, starts=1)
                for i, r in enumerate([0.66, 0.75, 0.83, 0.76])]
    verdicts += [RaceVerdict(shape=f"a{i}", mode="CONTROL", metric="ttft_p50", verdict="undecided", rounds=8,
                             ratio=r, lo=r * 0.8, hi=r * 1.2, delta=0.03, confidence=0.95, starts=1)
                 for i, r in enumerate([0.84, 0.94, 1.23])]
    card = _card([]).model_copy(update={"race": verdicts})
    over = across(card)
    assert over is not None
    head, rows = over
    assert head == ["mode", "ttft_p50"] and rows[0][0] == "FULL" and rows[0][1].startswith("better ")
    assert rows[0][1].endswith("races=4") and rows[-1][0].startswith("A/A arms")
    assert rows[-1][1].startswith("undecided ") and rows[-1][1].endswith("races=3")
    assert "**Across races**" in "\n".join(markdown(card))
    # the bundled 0.33 card: FULL's TTFT across its races reads better, its A/A arms do not
    bundled = across(ModelCard.load(BUNDLED))
    assert bundled is not None
    full = next(r for r in bundled[1] if r[0] == "FULL")
    assert full[bundled[0].index("ttft_p50")].startswith("better")
    aa = bundled[1][-1]
    assert not aa[bundled[0].index("ttft_p50")].startswith(("better", "worse"))
