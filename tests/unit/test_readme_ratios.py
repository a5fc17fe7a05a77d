"""Every ratio the README quotes is recomputed from the bundled datasets it comes from.

The README's findings are all-rounds ratios: each race contributes its geometric-mean ratio over every
round it measured (``RaceVerdict.ratio_all``, not the verdict's ratio at its first crossing), and the
interval is the t interval over the races (:func:`graphmode.selector.verdicts.across_races`), exactly as
the selector weighs them. A ratio written into the README that no claim here recomputes fails the test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from graphmode.core.dataset import ProfileStore
from graphmode.selector.verdicts import AcrossRaces, RaceVerdict, across_aa_arms, across_races, race_verdicts

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PROFILES = REPO / "models" / "profiles"
# the H200 races on vLLM 0.33: the three campaign shapes and the configuration campaign
H200_033 = ("race-h200-vllm0.33-*.sqlite", "cfg-h200-vllm0.33-*.sqlite")
# the H100 races on vLLM 0.33 (README: FULL's TTFT there, each shape's all-rounds ratio)
H100_033 = ("race-h100-vllm0.33-*.sqlite",)
RATIO = re.compile(r"\d+\.\d+×")


def _pooled(patterns: tuple[str, ...]) -> list[RaceVerdict]:
    rows = []
    for pattern in patterns:
        paths = sorted(PROFILES.glob(pattern))
        assert paths, f"no dataset matches models/profiles/{pattern}"
        for path in paths:
            with ProfileStore(path, readonly=True) as store:
                rows += store.rows()
    return [v for v in race_verdicts(rows) if v.workload is None]


@pytest.fixture(scope="module")
def h200_033() -> list[RaceVerdict]:
    return _pooled(H200_033)


@pytest.fixture(scope="module")
def h100_033() -> list[RaceVerdict]:
    return _pooled(H100_033)


def _h100_claim(verdicts: list[RaceVerdict]) -> str:
    """FULL's TTFT on the H100, per shape (its race's ratio over every round), and the rounds behind them."""
    full = sorted((v for v in verdicts if v.mode == "FULL" and v.metric == "ttft_p50" and not v.runs_as
                   and v.ratio_all is not None), key=lambda v: v.ratio_all or 0.0)
    assert full, "no FULL ttft_p50 race in the H100 datasets"
    return " and ".join(f"{v.ratio_all:.2f}×" for v in full) + f" over {sum(v.rounds_all or 0 for v in full)} rounds"


def quoted(a: AcrossRaces) -> str:
    """How the README writes an all-rounds ratio over races: ``0.796× [0.75–0.84]``."""
    return f"{a.ratio:.3f}× [{a.lo:.2f}–{a.hi:.2f}]"


def _claims(verdicts: list[RaceVerdict]) -> list[tuple[str, AcrossRaces | None]]:
    """(the sentence fragment the README must hold, the recomputation it comes from)."""
    full_ttft = across_races(verdicts, "FULL", "ttft_p50")
    full_itl = across_races(verdicts, "FULL", "itl_p50")
    piecewise = across_races(verdicts, "PIECEWISE", "itl_p50")
    none = across_races(verdicts, "NONE", "itl_p50")
    fdo = across_races(verdicts, "FULL_DECODE_ONLY", "ttft_p50")
    aa = across_aa_arms(verdicts, "ttft_p50")
    out: list[tuple[str, AcrossRaces | None]] = []
    for a, template in ((full_ttft, "TTFT p50 to **{q}** of the default's over {n} races"),
                        (full_itl, "ITL p50 reads {q}"),
                        (piecewise, "{q} over {n} races"),
                        (none, "{q} over the {n} campaign shapes"),
                        (fdo, "{q} over {n} races"),
                        (aa, "TTFT {q} over {n} races")):
        out.append((template.format(q=quoted(a), n=a.races) if a is not None else template, a))
    return out


def test_every_claim_recomputes_from_its_dataset(h200_033: list[RaceVerdict]) -> None:
    text = README.read_text(encoding="utf-8")
    for fragment, a in _claims(h200_033):
        assert a is not None, f"too few races to recompute {fragment!r}"
        assert fragment in text, f"README should say {fragment!r} (recomputed from the 0.33 datasets)"


def test_the_h100_claim_recomputes_from_its_datasets(h100_033: list[RaceVerdict]) -> None:
    fragment = _h100_claim(h100_033)
    assert fragment in README.read_text(encoding="utf-8"), f"README should say {fragment!r} (the H100 races)"


def test_every_ratio_in_the_readme_is_a_recomputed_one(h200_033: list[RaceVerdict],
                                                       h100_033: list[RaceVerdict]) -> None:
    text = README.read_text(encoding="utf-8")
    covered = {m for fragment, _ in _claims(h200_033) for m in RATIO.findall(fragment)}
    covered |= set(RATIO.findall(_h100_claim(h100_033)))
    stray = [m for m in RATIO.findall(text) if m not in covered]
    assert not stray, f"README quotes ratios no claim recomputes: {stray}"


def test_the_findings_are_the_selectors_all_rounds_samples(h200_033: list[RaceVerdict]) -> None:
    """Each race's sample is its ratio over every round: where a verdict stopped early, the two differ."""
    full = [v for v in h200_033 if v.mode == "FULL" and v.metric == "ttft_p50" and not v.runs_as]
    assert full and all(v.ratio_all is not None for v in full)
    assert any(v.rounds_all is not None and v.rounds_all > v.rounds for v in full)
    a = across_races(h200_033, "FULL", "ttft_p50")
    assert a is not None and a.races == len(full)
