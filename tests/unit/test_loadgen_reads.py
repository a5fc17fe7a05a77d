"""The load client times tokens per network read: events that arrive together share their gap."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from graphmode.profiling.arrivals import PlannedRequest
from graphmode.profiling.loadgen import read_events, run_load

GAP_S = 0.08


def _event(ids: list[int]) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "text": "", "token_ids": ids}]}).encode() + b"\n\n"


_USAGE = b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}}\n\n'


async def _bursty(request: web.Request) -> web.StreamResponse:
    """One token; three events in one write; one event split across two writes; usage; [DONE]."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_event([1]))
    await asyncio.sleep(GAP_S)
    await resp.write(_event([2]) + _event([3]) + _event([4]))
    await asyncio.sleep(GAP_S)
    last = _event([5])
    await resp.write(last[:9])
    await asyncio.sleep(0.01)
    await resp.write(last[9:] + _USAGE + b"data: [DONE]\n\n")
    return resp


async def _serve() -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/v1/completions", _bursty)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


def test_events_read_together_share_the_gap() -> None:
    async def go() -> None:
        runner, url = await _serve()
        try:
            [r] = await run_load(url, "m", [PlannedRequest(0.0, [1, 2, 3], 5)], deadline_s=10)
        finally:
            await runner.cleanup()
        assert r.ok, r.error
        assert r.output_tokens == 5 and r.chunk_n == [1, 3, 1]
        # the three tokens of one read each carry a third of the gap; none reads ~0. The gap itself is at
        # least the server's sleep, and how much more depends on the machine's load: only the lower bound is
        # the rule
        assert max(r.itls[:3]) - min(r.itls[:3]) < 1e-9 and sum(r.itls[:3]) >= GAP_S * 0.95, r.itls
        assert r.itls[3] >= GAP_S * 0.95, r.itls  # the split event counts once its line completes
        assert len(r.itls) == 4

    asyncio.run(go())


def test_read_events_counts_tokens_usage_and_done() -> None:
    lines = (_event([7, 8]) + _event([9]) + _USAGE + b"data: [DONE]\n\n" + _event([1])).split(b"\n")
    assert read_events(lines) == (3, 5, True)  # nothing after [DONE] counts
    assert read_events([b": keep-alive", b"", b"event: x"]) == (0, None, False)
