"""Source docstrings and comments say what and why, not which lab run found it ("lease 10", "session 22")."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "graphmode"
LAB_RUN = re.compile(r"\b(?:leases? \d+|session \d+)", re.IGNORECASE)


def test_no_source_file_cites_a_lab_run() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if LAB_RUN.search(line):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "say what was measured and why, not which lab run:\n" + "\n".join(found)


def test_the_pattern_catches_the_forms_in_use() -> None:
    for text in ("(H200 lease 12: 624 against 764)", "Lease 4c", "lease 8's 1B race", "session 22", "leases 1 to"):
        assert LAB_RUN.search(text), text
    assert not LAB_RUN.search("a release 0.33 measured on the H200")
