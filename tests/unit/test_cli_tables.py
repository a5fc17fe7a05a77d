"""Tables at 80 columns (issue 44, item 9): mode names and the model ids a user copies are never cut."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from graphmode.cli import recommend_cmd
from graphmode.cli.main import app
from graphmode.core.modes import CudaGraphMode

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recommend_cmd, "out_console", Console(width=80))


def test_recommend_at_80_columns_shows_every_mode_whole(narrow: None) -> None:
    result = CliRunner().invoke(app, ["recommend", "--rate", "4", "--input-tokens", "512", "--output-tokens", "128",
                                      "--models-dir", str(MODELS)])
    assert result.exit_code == 0, result.output
    table = result.output.split("mode:")[0]
    assert "…" not in table, table
    names = set(CudaGraphMode.__members__)
    rows = [line.split()[0] for line in table.splitlines() if line.split() and line.split()[0] in names]
    assert sorted(rows) == sorted(m.value for m in CudaGraphMode), table
    assert all(len(line) <= 80 for line in result.output.splitlines())


def test_models_at_80_columns_shows_every_id_whole(narrow: None) -> None:
    ids = sorted(p.name for p in MODELS.iterdir() if (p / "card.json").exists())
    assert ids
    result = CliRunner().invoke(app, ["models", "--models-dir", str(MODELS)])
    assert result.exit_code == 0, result.output
    for model_id in ids:
        assert model_id in result.output.split(), result.output
    assert "…" not in result.output


def test_models_on_a_wide_terminal_is_a_table_with_whole_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recommend_cmd, "out_console", Console(width=recommend_cmd.MODELS_TABLE_MIN_WIDTH))
    result = CliRunner().invoke(app, ["models", "--models-dir", str(MODELS)])
    assert result.exit_code == 0, result.output
    assert "┃ model id" in result.output
    for p in MODELS.iterdir():
        if (p / "card.json").exists():
            assert f"│ {p.name} " in result.output, result.output
