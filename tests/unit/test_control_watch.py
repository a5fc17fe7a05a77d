"""The watch controller with a fake executor: dry-run only reports, state survives a restart, the API."""

from __future__ import annotations

import asyncio
from pathlib import Path

from starlette.testclient import TestClient

from graphmode.control.controller import Controller, SwitchResult
from graphmode.control.policy import Advice, Policy, PolicyConfig
from graphmode.core.modes import CudaGraphMode
from graphmode.core.records import ObservedFeatures


class FakeExecutor:
    def __init__(self, fail: bool = False) -> None:
        self.mode: str | None = "NONE"
        self.fail = fail
        self.calls: list[str] = []

    def metrics_url(self) -> str | None:
        return None

    def command(self) -> list[str] | None:
        return ["vllm", "serve", "m"]

    async def switch(self, mode: CudaGraphMode, vllm_args: list[str] | None = None) -> SwitchResult:
        self.calls.append(mode.value)
        if self.fail:
            return SwitchResult(False, mode.value, "new server failed: bad flag")
        self.mode = mode.value
        return SwitchResult(True, mode.value, "ok", startup_s=42.0, downtime_s=0.0, command=["x"])


def advisor(_: ObservedFeatures) -> Advice:
    return Advice(best="FULL", scores={"NONE": 0.010, "FULL": 0.005})


def make(tmp_path: Path, ex: FakeExecutor, dry_run: bool = False) -> Controller:
    policy = Policy(PolicyConfig(min_dwell_s=0, cooldown_s=0, confirmations=1, max_attempts=2,
                                 retry_in_s=3600))
    ctl = Controller("d", ex, advisor, policy, state_dir=tmp_path, dry_run=dry_run)
    ctl.injected = ObservedFeatures(arrival_rate=5.0)
    return ctl


def test_dry_run_reports_but_does_not_switch(tmp_path: Path) -> None:
    ex = FakeExecutor()
    ctl = make(tmp_path, ex, dry_run=True)
    d = asyncio.run(ctl.step())
    assert d.action == "switch" and ex.calls == [] and ctl.state.decisions[-1]["dry_run"] is True
    assert ctl.state.last_features and ctl.state.last_features["arrival_rate"] == 5.0


def test_switch_persists_and_failures_stop_flapping(tmp_path: Path) -> None:
    ex = FakeExecutor()
    ctl = make(tmp_path, ex)
    asyncio.run(ctl.step())
    assert ex.mode == "FULL" and ctl.state.last_good_mode == "FULL" and ctl.state.startup_s == 42.0
    ex2 = FakeExecutor(fail=True)
    ctl2 = make(tmp_path, ex2)  # a restarted watch: reads the state file
    assert ctl2.state.switches == 1 and ctl2.state.policy.attempts[-1].ok
    for _ in range(4):
        asyncio.run(ctl2.step())
    assert ex2.calls == ["FULL", "FULL"]  # max_attempts=2, then held for retry_in
    assert ctl2.state.failed_switches == 2 and "bad flag" in (ctl2.state.last_error or "")
    assert "failed switches" in ctl2.state.decisions[-1]["reason"]
    with TestClient(ctl2.api()) as tc:
        body = tc.get("/v1/deployments/d").json()
        assert body["failed_switches"] == 2 and body["last_decision"]["action"] == "hold"
        assert tc.get("/v1/deployments/other").status_code == 404
        text = tc.get("/metrics").text
        assert 'graphmode_watch_switches_total{deployment="d",result="failed"} 2.0' in text
        assert "graphmode_watch_predicted_gain" in text
