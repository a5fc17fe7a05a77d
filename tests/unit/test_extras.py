"""Each extra carries its own stack: the profiler runs without the selector's, the CLI entry without any."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from graphmode.cli.common import run_app

SELECTOR_SIDE = ("sklearn", "skops", "pandas", "fastapi", "uvicorn", "plotly", "jinja2")
OPTIONAL = (*SELECTOR_SIDE, "aiohttp", "pynvml", "psutil", "scipy", "prometheus_client")


def _imported_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_the_profiler_imports_nothing_of_the_selector_service_or_report() -> None:
    mods = _imported_after("import graphmode.profiling.runner, graphmode.profiling.__main__, graphmode.cli.profile_cmd")
    assert "aiohttp" in mods  # the probe does see third-party imports
    assert not mods & set(SELECTOR_SIDE)


def test_the_cli_entry_imports_no_optional_dependency() -> None:
    mods = _imported_after("import graphmode.cli.main")
    assert "typer" in mods and not mods & set(OPTIONAL)


@pytest.mark.parametrize(("argv", "missing", "extra"), [
    (["serve"], "fastapi", "service"),
    (["report", "--out", "x"], "plotly", "report"),
    (["--verbose", "profile"], "aiohttp", "profile"),
    (["other"], "sklearn", "selector"),  # no known command: the module's extra
])
def test_a_command_without_its_extra_names_the_extra(
    argv: list[str], missing: str, extra: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def fake_app(args: list[str], prog_name: str) -> None:
        raise ModuleNotFoundError(f"No module named '{missing}'", name=missing)

    with pytest.raises(SystemExit) as exc:
        run_app(fake_app, argv)  # type: ignore[arg-type]
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert f"pip install 'graphmode[{extra}]'" in err and missing in err and "Traceback" not in err


def test_a_missing_module_of_no_extra_is_a_real_error() -> None:
    def fake_app(args: list[str], prog_name: str) -> None:
        raise ModuleNotFoundError("No module named 'graphmode.nothing'", name="graphmode.nothing")

    with pytest.raises(ModuleNotFoundError):
        run_app(fake_app, ["serve"])  # type: ignore[arg-type]


def test_the_version_comes_from_the_package_metadata() -> None:
    from importlib.metadata import version

    import graphmode

    assert graphmode.__version__ == version("graphmode")
