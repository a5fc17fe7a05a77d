"""The settings reference in docs/reference/settings.md is generated from the settings model and kept current."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr

from graphmode.core.settings import Settings
from graphmode.core.settings_doc import BEGIN, END, main, render_table, settings_docs, splice

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "reference" / "settings.md"


def test_committed_reference_is_current() -> None:
    text = OPERATIONS.read_text(encoding="utf-8")
    assert BEGIN in text and END in text
    committed = text.split(BEGIN, 1)[1].split(END, 1)[0].lstrip("\n")
    assert committed == render_table(), (
        "docs/reference/settings.md's settings reference is stale: "
        "python -m graphmode.core.settings_doc --write docs/reference/settings.md"
    )
    assert main(["--check", str(OPERATIONS)]) == 0


def _leaves(cls: type[BaseModel], prefix: str = "GRAPHMODE_") -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for name, info in cls.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.update({env: (name, *path) for env, path in _leaves(ann, f"{prefix}{name.upper()}__").items()})
        else:
            out[f"{prefix}{name.upper()}"] = (name,)
    return out


def _value_for(type_text: str) -> tuple[str, Any]:
    """An env value of that type that differs from every default, and what the setting should then hold."""
    if type_text.startswith("JSON list of int"):
        return "[8001]", [8001]
    if type_text.startswith("JSON list"):
        return '["10.0.0.0/8"]', ["10.0.0.0/8"]
    if type_text.startswith("secret"):
        return "s3cret", "s3cret"
    if type_text.startswith("int"):
        floor = max([0, *(int(float(x)) for x in re.findall(r"[≥>] ?(-?[\d.]+)", type_text))])
        return str(floor + 7), floor + 7  # above any lower bound (e.g. a header limit of ≥ 1024)
    if type_text.startswith("float"):
        bounded = "< 1" in type_text or "≤ 1" in type_text or "≤ 1)" in type_text  # a fraction (delta, levels)
        return ("0.75", 0.75) if bounded else ("7.25", 7.25)
    if type_text.startswith("path"):
        return "/srv/gm-doc-test", Path("/srv/gm-doc-test")
    if type_text.startswith("bool"):
        return "false", False  # every bool setting defaults to true
    return "doc-test-value", "doc-test-value"


def test_every_setting_is_listed_described_and_named_as_the_environment_reads_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    docs = settings_docs()
    assert [d.env for d in docs] == list(_leaves(Settings))
    for doc in docs:
        assert doc.description, f"{doc.env} has no Field description"
        raw, expected = _value_for(doc.type)
        monkeypatch.setenv(doc.env, raw)
        value: Any = Settings()
        for part in _leaves(Settings)[doc.env]:
            value = getattr(value, part)
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        assert value == expected, doc.env
        monkeypatch.delenv(doc.env)


def test_table_shows_bounds_defaults_and_optional_values() -> None:
    table = render_table()
    assert "| `GRAPHMODE_VLLM__PORT` | int (≥ 1, ≤ 65535) | `8000` |" in table
    assert "| `GRAPHMODE_SERVICE__TOKEN` | secret string, optional | unset |" in table
    assert '`["127.0.0.1", "::1", "localhost"]`' in table
    # No path of this machine leaks into the committed table.
    assert "`graphmode/data/default_grid.yaml`" in table and str(Path.home()) not in table


def test_splice_replaces_only_the_text_between_the_markers() -> None:
    doc = f"# Ops\n\nbefore\n{BEGIN}\nold table\n{END}\nafter\n"
    out = splice(doc, "| new |\n")
    assert out == f"# Ops\n\nbefore\n{BEGIN}\n| new |\n{END}\nafter\n"
    assert splice(out, "| new |\n") == out
    with pytest.raises(ValueError, match="markers"):
        splice("# no markers\n", "| t |\n")


def test_write_then_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "ops.md"
    doc.write_text(f"intro\n{BEGIN}\nstale\n{END}\n", encoding="utf-8")
    assert main(["--check", str(doc)]) == 1
    assert "stale" in capsys.readouterr().err
    assert main(["--write", str(doc)]) == 0
    assert main(["--check", str(doc)]) == 0
    assert render_table() in doc.read_text(encoding="utf-8")
    missing = tmp_path / "none.md"
    assert main(["--check", str(missing)]) == 2
    no_markers = tmp_path / "plain.md"
    no_markers.write_text("# plain\n", encoding="utf-8")
    assert main(["--write", str(no_markers)]) == 2
    assert no_markers.read_text(encoding="utf-8") == "# plain\n"
