"""``launch`` and ``watch`` against real vLLM CPU servers.

Needs ``GRAPHMODE_TEST_VLLM_PYTHON`` (the interpreter of a venv with vLLM). Each server start takes ~1 min
on 2 cores, so the module starts as few as it can. On CPU vLLM accepts ``cudagraph_mode`` but captures no
graphs: that the flag reached vLLM is checked on its "non-default args" log line.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.net import Request, free_port, serve_http

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "fixtures" / "tiny-llama"
VLLM_PY = os.environ.get("GRAPHMODE_TEST_VLLM_PYTHON")
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not VLLM_PY, reason="GRAPHMODE_TEST_VLLM_PYTHON is not set (path to a python with vLLM)"),
]
SERVE_ARGS = ["--model", str(TINY), "--load-format", "dummy", "--skip-tokenizer-init", "--max-model-len", "1024",
              "--gpu-memory-utilization", "0.2"]
START_TIMEOUT = 400.0


def vllm_cmd() -> list[str]:
    assert VLLM_PY
    return [VLLM_PY, "-m", "vllm.entrypoints.openai.api_server"]


def wait_healthy(url: str, proc: subprocess.Popen[bytes] | None, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited {proc.returncode} before /health")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} not healthy in {timeout} s")


def complete(url: str, max_tokens: int = 8, timeout: float = 120) -> httpx.Response:
    return httpx.post(url + "/v1/completions", timeout=timeout,
                      json={"model": str(TINY), "prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": max_tokens,
                            "ignore_eos": True})


def requested_mode(log: str) -> str | None:
    m = re.findall(r"non-default args: .*'cudagraph_mode': <CUDAGraphMode\.(\w+)", log)
    return m[-1] if m else None


SERVICE_BODIES: list[dict[str, object]] = []


@pytest.fixture
def fake_service() -> Iterator[str]:
    """A selector service that always answers PIECEWISE and keeps what it was asked."""

    def respond(req: Request) -> tuple[int, object]:
        SERVICE_BODIES.append(req.json())
        return 200, {"mode": "PIECEWISE", "compilation_config": {"cudagraph_mode": "PIECEWISE"}}

    with serve_http(respond) as url:
        yield url


def test_launch_execs_vllm_with_the_chosen_mode(tmp_path: Path, fake_service: str) -> None:
    port = free_port()
    log = tmp_path / "launch.log"
    gm = Path(sys.executable).parent / "graphmode"
    argv = [str(gm), "launch", "--selector-url", fake_service, "--rate", "4", "--input-tokens", "64",
            "--output-tokens", "16", "--models-dir", str(tmp_path / "none"), "--state-dir", str(tmp_path),
            "--vllm-cmd", " ".join(vllm_cmd()), "--", *SERVE_ARGS, "--port", str(port),
            "--compilation-config", '{"cudagraph_num_of_warmups": 1}']
    with log.open("wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        r = complete(f"http://127.0.0.1:{port}")
        assert r.status_code == 200, r.text
        text = log.read_text(errors="replace")
        assert "source remote, basis workload" in text
        assert requested_mode(text) == "PIECEWISE"  # the flag reached vLLM
        assert "'cudagraph_num_of_warmups': 1" in text  # the user's other key was kept
        assert SERVICE_BODIES[-1]["workload"] == {"rate": 4.0, "burstiness": 1.0, "input_tokens": 64.0,
                                                       "output_tokens": 16.0}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def test_watch_switches_rolls_back_and_completes_inflight(tmp_path: Path) -> None:
    """Managed switch: injected features shift → switch NONE→PIECEWISE while requests flow through the
    proxy; then a switch whose command has a bad flag rolls back and the old command serves again.

    Uses the stop-then-start strategy: on a 2-core CI box a second CPU vLLM never became healthy while the
    first one served (both pin core 0; measured: not healthy after 400 s), so blue-green is not testable
    here. Requests admitted before the stop complete (drain); requests during the downtime get an
    explicit 503 with Retry-After, never a dropped connection."""
    import asyncio

    import uvicorn

    from graphmode.control.controller import Controller, ManagedExecutor
    from graphmode.control.policy import Advice, Policy, PolicyConfig
    from graphmode.control.proxy import Proxy
    from graphmode.core.modes import CudaGraphMode
    from graphmode.core.records import ObservedFeatures

    def advisor(f: ObservedFeatures) -> Advice:
        best = "PIECEWISE" if (f.arrival_rate or 0) > 10 else "NONE"
        return Advice(best=best, scores={"NONE": 0.010, "PIECEWISE": 0.010 if best == "NONE" else 0.007})

    async def scenario() -> None:
        proxy = Proxy()
        ex = ManagedExecutor(vllm_cmd(), SERVE_ARGS, proxy=proxy, log_dir=tmp_path / "logs",
                             startup_timeout_s=START_TIMEOUT, strategy="restart")
        policy = Policy(PolicyConfig(min_dwell_s=0, cooldown_s=0, min_gain=0.05, confirmations=2,
                                     lost_capacity=0.5))
        ctl = Controller("it", ex, advisor, policy, state_dir=tmp_path / "state")
        res = await ex.start_initial(CudaGraphMode.NONE)
        assert res.ok, res.reason
        ctl.adopt(res)
        port = free_port()
        srv = uvicorn.Server(uvicorn.Config(proxy.app, host="127.0.0.1", port=port, log_level="warning"))
        task = asyncio.create_task(srv.serve())
        public = f"http://127.0.0.1:{port}"
        try:
            while not srv.started:
                await asyncio.sleep(0.05)
            stop = threading.Event()
            results: list[int] = []

            def client() -> None:
                # paced: on a 2-core box a saturated CPU server starves the new one's start-up
                while not stop.is_set():
                    try:
                        results.append(complete(public, max_tokens=16).status_code)
                    except httpx.HTTPError:
                        results.append(-1)
                    stop.wait(1.0)

            threads = [threading.Thread(target=client) for _ in range(2)]
            for t in threads:
                t.start()
            ctl.injected = ObservedFeatures(arrival_rate=2.0)
            assert (await ctl.step()).action == "stay"
            ctl.injected = ObservedFeatures(arrival_rate=20.0)
            assert (await ctl.step()).action == "hold"  # hysteresis: 1/2
            d = await ctl.step()
            assert d.action == "switch" and d.target == "PIECEWISE", d.line()
            assert ex.mode == "PIECEWISE" and ctl.state.switches == 1
            n_before = len(results)
            await asyncio.sleep(3)
            stop.set()
            for t in threads:
                await asyncio.to_thread(t.join, 180)
            assert len(results) > n_before and results.count(200) >= 2, results
            assert set(results) <= {200, 503}, results  # nothing dropped: served, or told to retry
            assert ctl.state.policy.attempts[-1].downtime_s is not None
            logs = sorted((tmp_path / "logs").glob("vllm-2-PIECEWISE.log"))
            assert requested_mode(logs[0].read_text(errors="replace")) == "PIECEWISE"
            assert (await asyncio.to_thread(complete, public)).status_code == 200  # the new server serves

            # a broken command: vLLM rejects the flag, nothing changes, the reason is recorded
            bad = await ctl.switch(CudaGraphMode.FULL, [*SERVE_ARGS, "--no-such-flag-graphmode"])
            assert not bad.ok and "rolled back to PIECEWISE" in bad.reason, bad.reason
            assert ex.mode == "PIECEWISE" and ctl.state.failed_switches == 1 and ctl.state.last_error
            assert (await asyncio.to_thread(complete, public)).status_code == 200

            # blue-green with a broken new command: the old server keeps serving the whole time, so
            # requests sent while the new one fails all succeed (a bad flag fails before any model load,
            # so two CPU servers never compete for the cores here)
            ex.strategy = "blue-green"
            stop.clear()
            results.clear()
            threads = [threading.Thread(target=client) for _ in range(2)]
            for t in threads:
                t.start()
            bg = await ctl.switch(CudaGraphMode.FULL, [*SERVE_ARGS, "--no-such-flag-graphmode"])
            stop.set()
            for t in threads:
                await asyncio.to_thread(t.join, 180)
            assert not bg.ok and "old one kept serving" in bg.reason, bg.reason
            assert ex.mode == "PIECEWISE" and ctl.state.failed_switches == 2
            assert results and set(results) == {200}, results  # every request during the attempt served
            api = ctl.api()
            from starlette.testclient import TestClient

            with TestClient(api) as tc:
                body = tc.get("/v1/deployments/it").json()
                assert body["serving_mode"] == "PIECEWISE" and body["policy"]["attempts"][-1]["ok"] is False
                assert 'graphmode_watch_switches_total{deployment="it",result="ok"} 1.0' in tc.get(
                    "/metrics").text
        finally:
            srv.should_exit = True
            await task
            await ex.stop()
            await proxy.aclose()

    asyncio.run(scenario())
