"""The CLI's inputs and what it prints from a remote server (issue 44, items 3 and 5): a missing ``@file`` is a
clear error naming the option, and a server's ``/version`` reaches the terminal without escape sequences."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from graphmode.cli.common import read_at_file, terminal_safe
from graphmode.cli.main import app
from graphmode.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
EVIL_VERSION = "0.24.0\x1b[31mRED\x1b]0;title\x07\x00NUL\u202eevil"


@pytest.mark.parametrize(
    "argv",
    [
        ["recommend", "--features", "@/nonexistent/features.json"],
        ["recommend", "--features", '{"arrival_rate": 2}', "--step-sizes", "@/nonexistent/steps.json"],
        ["launch", "--dry-run", "--workload", "@/nonexistent/workload.json", "--", "--model", "m"],
    ],
)
def test_a_missing_at_file_is_a_clear_error(argv: list[str]) -> None:
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    option = next(a for a in argv if a.startswith("--") and argv[argv.index(a) + 1].startswith("@"))
    assert f"{option}: cannot read /nonexistent/" in result.output and "Traceback" not in result.output


def test_read_at_file(tmp_path: Path) -> None:
    (tmp_path / "f.json").write_text('{"a": 1}')
    assert read_at_file(f"@{tmp_path / 'f.json'}", "--x") == '{"a": 1}'
    assert read_at_file('{"b": 2}', "--x") == '{"b": 2}'
    with pytest.raises(ConfigError, match="--x: cannot read"):
        read_at_file(f"@{tmp_path}", "--x")  # a directory
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        read_at_file(f"@{tmp_path / 'bin'}", "--x")


def test_terminal_safe() -> None:
    out = terminal_safe(EVIL_VERSION)
    assert not any(ord(c) < 32 or 0x7F <= ord(c) <= 0x9F for c in out) and "\u202e" not in out
    assert out.startswith("0.24.0?[31mRED")
    assert terminal_safe("a\tb") == "a\tb" and terminal_safe("x" * 50, 10) == "x" * 9 + "…"


class _EvilVllm(BaseHTTPRequestHandler):
    scrapes = 0

    def do_GET(self) -> None:
        if self.path == "/version":
            body = json.dumps({"version": EVIL_VERSION}).encode()
        elif self.path == "/metrics":
            type(self).scrapes += 1
            n = type(self).scrapes
            body = (f"vllm:num_requests_running 4\nvllm:num_requests_waiting 1\nvllm:request_success_total {n * 10}\n"
                    f"vllm:prompt_tokens_total {n * 1000}\nvllm:generation_tokens_total {n * 300}\n").encode()
        else:
            body = b"{}"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def evil_server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _EvilVllm)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_servers_version_is_printed_without_escapes(evil_server: str) -> None:
    result = CliRunner().invoke(app, ["recommend", "--server", evil_server, "--window", "0.2", "--interval", "0.1",
                                      "--models-dir", str(REPO / "models")])
    assert result.exit_code == 0, result.output
    # a /version that is no version is not taken (nor printed): the answer says which release it assumed ...
    assert "RED" not in result.output and "no vLLM release given" in result.output
    assert "\x1b" not in result.output and "\x00" not in result.output and "\x07" not in result.output  # ... inert
    assert "\u202e" not in result.output


@pytest.mark.parametrize("value", ["nan", "inf"])
@pytest.mark.parametrize("command", [["recommend"], ["launch", "--dry-run"]])
def test_a_non_finite_rate_is_said_to_be_one(command: list[str], value: str) -> None:
    argv = [*command, "--rate", value, "--input-tokens", "100", "--output-tokens", "10"]
    result = CliRunner().invoke(app, argv + (["--", "--model", "m"] if command[0] == "launch" else []))
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.split())
    assert "rate: must be a finite number" in out, out
    assert "errors.pydantic.dev" not in out and "less than or equal" not in out and "type=" not in out
