"""bench/recommend_latency.py tells the generator's wait from the server's: a request that waited for one of the
generator's connections is counted as written late, not as the server keeping it past 1 s; and its in-process
figures come warm (repeated bodies) and cold (first-seen ones) through the one decision path."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.bench import load_bench

REPO = Path(__file__).resolve().parents[2]
MODEL = "nvidia-h200-vllm0.33.0-3375a87d3889"
bench = load_bench("recommend_latency")


async def _slow_server(hold_s: float) -> tuple[asyncio.Server, int]:
    """Answers every request 200 after *hold_s* (sleep: never sooner, whatever the host)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                await asyncio.sleep(hold_s)
                body = b'{"mode":"FULL"}'
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_a_request_waiting_for_a_generator_connection_is_the_generators_lateness() -> None:
    async def run() -> object:
        server, port = await _slow_server(1.2)
        gen = bench.LoadGen("127.0.0.1", port, [b"{}"], max_connections=1, timeout_s=10.0)
        try:
            # two requests 1 ms apart, one connection: the second is written only once the first is answered
            return await gen.run(rate=1000.0, duration_s=0.0025, arrivals="uniform", seed=0)
        finally:
            await gen.close()
            server.close()

    st = asyncio.run(run())
    assert st.sent == 2 and len(st.latencies) == 2
    assert st.over_1s == 2  # both answered more than 1 s after their intended time
    assert st.over_1s_sent == 2  # the server held each 1.2 s from its write
    assert st.gen_late_1s == 1  # the second one also waited 1.2 s for the generator's only connection


@pytest.mark.skipif(not (REPO / "models" / MODEL).is_dir(), reason="bundled model missing")
def test_in_process_figures_are_warm_and_cold_for_each_input() -> None:
    out = bench.in_process(REPO / "models", MODEL, calls=8)
    assert set(out) == {"features warm", "features cold", "workload warm", "workload cold"}
    assert all(v["cpu_ms"] >= 0 and v["p50_ms"] > 0 for v in out.values())
    table = bench.in_process_table(out)
    assert "| workload description | each first-seen |" in table
    assert "| observed features | repeated (memos answer) |" in table
