"""The README is a front door: install and a first answer on its first screen, links that resolve, and no
lab history (the lab notebook is docs/lab/)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
INSTALL = ("python3 -m venv .venv && .venv/bin/pip install -e '.[all]' && .venv/bin/graphmode recommend --rate 8 "
           "--burstiness 1 --input-tokens 64 --output-tokens 512")


def test_install_and_first_answer_within_the_first_40_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert INSTALL in lines[:40], "the README's install command must stay a line of its own in its first 40 lines"


def test_every_relative_link_resolves() -> None:
    text = README.read_text(encoding="utf-8")
    targets = [t.split("#", 1)[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)
               if not re.match(r"^[a-z]+:", t) and not t.startswith("#")]
    assert targets
    missing = [t for t in targets if not (REPO / t).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_no_lab_history() -> None:
    text = README.read_text(encoding="utf-8")
    found = re.findall(r"\b(?:[Ll]ease \d+|[Ss]ession \d+|since 20\d\d-\d\d-\d\d)\b", text)
    assert not found, f"lab history belongs in docs/lab/, not the README: {found}"


def test_the_five_modes_are_named() -> None:
    text = README.read_text(encoding="utf-8")
    for mode in ("`FULL_AND_PIECEWISE`", "`FULL`", "`FULL_DECODE_ONLY`", "`PIECEWISE`", "`NONE`"):
        assert f"| {mode} |" in text, f"the modes table lacks {mode}"
