"""The vLLM launcher against a fake server process, its log helpers, and the mode enum.

The fake (written to tmp_path) parses ``--host``/``--port``, prints vLLM-like start-up lines, serves
``/health``, ``/version`` and ``/v1/models`` with tests.support.net, and can spawn a child that ignores SIGTERM,
so ``stop()`` must take the whole process group down. ``FAKE_BEHAVIOUR`` picks how it misbehaves.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from graphmode.core.errors import EngineDiedError, EngineError, EngineStartError
from graphmode.core.modes import ALL_MODES, DEFAULT_MODE, CudaGraphMode, compilation_config, parse_mode
from graphmode.profiling.engine import VllmServer, describe_exit, tail_lines
from tests.support.net import free_port

pytestmark = pytest.mark.timeout(60)

FAKE = textwrap.dedent(
    """
    import argparse, json, os, signal, subprocess, sys, threading

    p = argparse.ArgumentParser()
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    args, _ = p.parse_known_args()
    behaviour = os.environ.get("FAKE_BEHAVIOUR", "ok")
    print("(APIServer pid=1) INFO 01-01 00:00:00 [api_server.py:1] vLLM API server version 9.9.9-fake")
    print("ARGV " + json.dumps(sys.argv[1:]))
    sys.stdout.flush()
    if behaviour == "exit2":
        print("(EngineCore pid=2) ERROR [core.py:1] ValueError: fake refuses this cudagraph_mode")
        print("Traceback (most recent call last):")
        print("  ... noise ...")
        sys.exit(2)
    if behaviour == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pidfile = os.environ.get("FAKE_CHILD_PIDFILE")
    if pidfile:
        child = subprocess.Popen([sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        with open(pidfile, "w") as f:
            f.write(str(child.pid))
    print("(EngineCore pid=2) INFO 01-01 00:00:01 [gpu_model_runner.py:3] "
          "Model loading took 0.5 GiB and 1.2 seconds")
    print("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%")
    print("(EngineCore pid=2) INFO 01-01 00:00:02 [gpu_model_runner.py:4] "
          "Graph capturing finished in 3 secs, took 0.45 GiB")
    sys.stdout.flush()

    paths = {"/health": (503 if behaviour == "never_healthy" else 200, {}),
             "/version": (200, {"version": "9.9.9-fake"}), "/v1/models": (200, {"data": [{"id": "served-by-fake"}]})}
    sys.path.insert(0, @REPO@)
    from tests.support.net import serve_http

    with serve_http(lambda req: paths.get(req.path, (404, {})), host=args.host, port=args.port):
        threading.Event().wait()
    """
).replace("@REPO@", repr(str(Path(__file__).resolve().parents[2])))


def gone(pid: int) -> bool:
    """True once *pid* no longer runs (a zombie waiting for a reaper counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.05)
    return gone(pid)


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    path = tmp_path / "fake_vllm.py"
    path.write_text(FAKE, encoding="utf-8")
    return path


@pytest.fixture
def servers() -> Iterator[list[VllmServer]]:
    """Every server a test makes is stopped afterwards, whatever happened."""
    made: list[VllmServer] = []
    yield made
    for s in made:
        s.stop()


def make(servers: list[VllmServer], fake: Path, tmp_path: Path, *, args: list[str] | None = None,
         mode: CudaGraphMode | None = CudaGraphMode.PIECEWISE, env: dict[str, str] | None = None,
         **kw: float) -> VllmServer:
    server = VllmServer([sys.executable, str(fake)], args if args is not None else ["--model", "m"], mode=mode,
                        port=free_port(), log_path=tmp_path / "logs" / "vllm.log", env=env,
                        startup_timeout_s=kw.pop("startup_timeout_s", 20.0), **kw)
    servers.append(server)
    return server


def logged_argv(server: VllmServer) -> list[str]:
    text = server.log_path.read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("ARGV "))
    return list(json.loads(line[5:]))


# ---------------------------------------------------------------- describe_exit / tail_lines


@pytest.mark.parametrize(
    ("rc", "text"),
    [
        (0, "exited with status 0"),
        (1, "exited with status 1"),
        (2, "exited with status 2"),
        (-9, "killed by SIGKILL"),
        (-15, "killed by SIGTERM"),
        (137, "exited 137 (likely SIGKILL)"),
        (143, "exited 143 (likely SIGTERM)"),
        (255, "exited with status 255"),
        (-999, "killed by signal 999"),
        (None, "still running"),
    ],
)
def test_describe_exit(rc: int | None, text: str) -> None:
    assert describe_exit(rc) == text


def test_tail_lines_brings_root_cause_forward(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    lines = ["INFO starting"] * 5
    lines += ["(EngineCore pid=2) ERROR ValueError: No available memory for the cache blocks."]
    lines += ["RuntimeError: Engine core initialization failed. See root cause above."]
    lines += ["ValueError: No available memory for the cache blocks."] * 2  # shown once
    lines += [f"  File 'x.py', line {i}, in f" for i in range(60)]
    log.write_text("\n".join(lines) + "\n")
    tail = tail_lines(log, n=10)
    out = tail.splitlines()
    assert out[0] == "... root cause lines from earlier in the log:"
    assert "(EngineCore pid=2) ERROR ValueError: No available memory for the cache blocks." in out
    assert "RuntimeError: Engine core initialization failed. See root cause above." in out
    assert out.count("ValueError: No available memory for the cache blocks.") == 1
    assert out[-11] == "... last lines:"
    assert out[-10:] == lines[-10:]


def test_tail_lines_without_causes_and_short_logs(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("a\nb\nc\n")
    assert tail_lines(log, n=10) == "a\nb\nc"
    assert tail_lines(log, n=2) == "b\nc"
    # a cause within the last n lines is not repeated in a header
    log.write_text("x\nKeyError: 'boom'\ny\n")
    assert tail_lines(log, n=5) == "x\nKeyError: 'boom'\ny"
    assert tail_lines(tmp_path / "missing.log") == ""


def test_tail_lines_other_root_causes_and_progress_bars(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        "api_server.py: error: unrecognized arguments: --bogus\n"
        + "filler\n" * 20
        + "Capturing 10%\rCapturing 50%\rCapturing 100%\n"
    )
    out = tail_lines(log, n=3).splitlines()
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" in out
    assert "api_server.py: error: unrecognized arguments: --bogus" in out
    assert out[-1] == "Capturing 100%"  # only the final redraw of a progress bar


def test_tail_lines_from_offset(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    old = "ValueError: from an earlier run\n" + "old\n" * 10
    log.write_text(old + "new 1\nnew 2\n")
    tail = tail_lines(log, n=5, offset=len(old.encode()))
    assert tail == "new 1\nnew 2"


def test_tail_lines_reads_at_most_max_bytes(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("ValueError: far back\n" + "x" * 5000 + "\nlast\n")
    assert "far back" not in tail_lines(log, n=2, max_bytes=1000)
    assert "far back" in tail_lines(log, n=2)


# ---------------------------------------------------------------- modes.py


def test_modes() -> None:
    assert [m.value for m in ALL_MODES] == ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]
    assert DEFAULT_MODE is CudaGraphMode.FULL_AND_PIECEWISE
    assert parse_mode("full") is CudaGraphMode.FULL
    assert parse_mode(" Piecewise ") is CudaGraphMode.PIECEWISE
    assert parse_mode("CUDAGraphMode.FULL_DECODE_ONLY") is CudaGraphMode.FULL_DECODE_ONLY
    with pytest.raises(ValueError, match=r"unknown cudagraph_mode 'HALF'.*FULL_AND_PIECEWISE"):
        parse_mode("HALF")
    base = {"level": 3, "cudagraph_mode": "NONE"}
    assert json.loads(compilation_config(CudaGraphMode.FULL, base)) == {"level": 3, "cudagraph_mode": "FULL"}
    assert base["cudagraph_mode"] == "NONE"  # not mutated
    assert compilation_config(CudaGraphMode.NONE) == '{"cudagraph_mode":"NONE"}'


# ---------------------------------------------------------------- VllmServer against the fake


def test_final_args_own_the_address_and_the_mode(tmp_path: Path) -> None:
    user = ["--model", "m", "--port", "1234", "--host=0.0.0.0", "-cc", '{"level": 3}', "--max-num-seqs", "8"]
    server = VllmServer(["vllm", "serve"], user, mode=CudaGraphMode.FULL, port=8123, log_path=tmp_path / "l")
    assert server.args[:4] == ["--model", "m", "--max-num-seqs", "8"]
    assert server.args[4:] == ["--compilation-config", '{"level":3,"cudagraph_mode":"FULL"}',
                               "--host", "127.0.0.1", "--port", "8123"]
    assert server.argv[:2] == ["vllm", "serve"]
    assert server.base_url == "http://127.0.0.1:8123"
    assert server.model == "m" and server.served_model_name() == "m"
    named = VllmServer(["vllm", "serve"], ["org/model", "--served-model-name", "alias"], mode=None,
                       log_path=tmp_path / "l")
    assert named.model == "org/model" and named.served_model_name() == "alias"
    assert "--compilation-config" not in named.args  # no mode: the user's config is left alone


def test_start_parses_the_startup_log(fake: Path, tmp_path: Path, servers: list[VllmServer]) -> None:
    server = make(servers, fake, tmp_path, args=["--model", "m", "--port", "1", "-cc", '{"level": 3}'])
    info = server.start()
    assert server.alive()
    assert info.startup_s is not None and 0 < info.startup_s < 20
    assert server.startup_s == info.startup_s
    assert info.capture_s == 3.0 and info.graph_gib == 0.45
    assert info.model_load_gib == 0.5 and info.model_load_s == 1.2
    assert info.vllm_version == "9.9.9-fake"
    assert info.requested_mode == "PIECEWISE" and info.effective_mode == "PIECEWISE"
    assert info.capture_labels == ["mixed prefill-decode, PIECEWISE"]
    assert info.model_runner == "gpu_model_runner"
    assert server.version() == "9.9.9-fake"
    # what the process really got: the mode merged into the user's config, the launcher's address
    argv = logged_argv(server)
    assert argv == server.args
    cc = json.loads(argv[argv.index("--compilation-config") + 1])
    assert cc == {"level": 3, "cudagraph_mode": "PIECEWISE"}
    assert argv[-4:] == ["--host", "127.0.0.1", "--port", str(server.port)]
    assert "1" not in argv[: argv.index("--compilation-config")]
    assert "===== graphmode: " in server.log_path.read_text()
    assert server.stop() is not None
    assert not server.alive()
    assert server.stop() == server.proc.returncode  # type: ignore[union-attr]  # safe twice


def test_second_start_reads_only_its_own_log(fake: Path, tmp_path: Path, servers: list[VllmServer]) -> None:
    first = make(servers, fake, tmp_path, env={"FAKE_BEHAVIOUR": "exit2"})
    with pytest.raises(EngineStartError):
        first.start()
    second = make(servers, fake, tmp_path, mode=CudaGraphMode.FULL)  # same log file, appended
    second.start()
    assert "ValueError" not in second.log_tail()
    assert second.startup_info().requested_mode == "FULL"


def test_exit_before_healthy(fake: Path, tmp_path: Path, servers: list[VllmServer]) -> None:
    server = make(servers, fake, tmp_path, env={"FAKE_BEHAVIOUR": "exit2"})
    t0 = time.monotonic()
    with pytest.raises(EngineStartError) as info:
        server.start()
    assert time.monotonic() - t0 < 10
    err = info.value
    assert "exited with status 2" in str(err) and "before it became healthy" in str(err)
    assert err.returncode == 2
    assert "ValueError: fake refuses this cudagraph_mode" in err.log_tail
    assert "ValueError: fake refuses" in err.reason() and "--- last log lines ---" in err.reason()
    assert not server.alive()


def test_never_healthy_times_out(fake: Path, tmp_path: Path, servers: list[VllmServer]) -> None:
    server = make(servers, fake, tmp_path, env={"FAKE_BEHAVIOUR": "never_healthy"}, startup_timeout_s=3.0,
                  stop_timeout_s=5.0)
    t0 = time.monotonic()
    with pytest.raises(EngineStartError, match="not healthy after 3 s") as info:
        server.start()
    elapsed = time.monotonic() - t0
    assert 3.0 <= elapsed < 10
    assert "Graph capturing finished" in info.value.log_tail
    assert server.proc is not None and server.proc.poll() is not None  # it was stopped


def test_missing_command(tmp_path: Path) -> None:
    server = VllmServer([str(tmp_path / "no-such-vllm"), "serve"], ["m"], mode=CudaGraphMode.FULL,
                        port=free_port(), log_path=tmp_path / "l.log")
    with pytest.raises(EngineStartError, match="cannot run") as info:
        server.start()
    assert isinstance(info.value, EngineError)
    assert server.stop() is None  # nothing was started; still safe


def test_check_alive_reports_sigkill(fake: Path, tmp_path: Path, servers: list[VllmServer]) -> None:
    server = make(servers, fake, tmp_path)
    with pytest.raises(EngineDiedError, match="never started"):
        server.check_alive()
    server.start()
    server.check_alive()  # fine while it runs
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=10)
    with pytest.raises(EngineDiedError) as info:
        server.check_alive()
    assert "SIGKILL" in str(info.value) and "while serving" in str(info.value)
    assert info.value.returncode == -signal.SIGKILL
    assert "Graph capturing finished" in info.value.log_tail
    assert not server.alive()
    assert server.stop() == -signal.SIGKILL


def test_stop_kills_children_that_outlive_the_parent(fake: Path, tmp_path: Path,
                                                      servers: list[VllmServer]) -> None:
    pidfile = tmp_path / "child.pid"
    server = make(servers, fake, tmp_path, env={"FAKE_CHILD_PIDFILE": str(pidfile)}, stop_timeout_s=5.0)
    server.start()
    child = int(pidfile.read_text())
    assert not gone(child)
    t0 = time.monotonic()
    rc = server.stop()
    assert rc == -signal.SIGTERM  # the parent went on SIGTERM ...
    assert wait_gone(child), "the engine-core stand-in survived stop()"  # ... the child needed the sweep
    assert time.monotonic() - t0 < 5


def test_stop_escalates_to_sigkill(fake: Path, tmp_path: Path, servers: list[VllmServer]) -> None:
    pidfile = tmp_path / "child.pid"
    server = make(servers, fake, tmp_path, env={"FAKE_BEHAVIOUR": "ignore_term",
                                                "FAKE_CHILD_PIDFILE": str(pidfile)}, stop_timeout_s=1.0)
    server.start()
    child = int(pidfile.read_text())
    assert server.proc is not None
    parent = server.proc.pid
    t0 = time.monotonic()
    rc = server.stop()
    elapsed = time.monotonic() - t0
    assert rc == -signal.SIGKILL
    assert 1.0 <= elapsed < 8
    assert wait_gone(parent) and wait_gone(child)


def test_context_manager_stops(fake: Path, tmp_path: Path) -> None:
    server = VllmServer([sys.executable, str(fake)], ["--model", "m"], mode=None, port=free_port(),
                        log_path=tmp_path / "l.log", startup_timeout_s=20)
    with server:
        server.start()
        assert server.alive()
    assert not server.alive()
