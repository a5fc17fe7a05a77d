"""The switching policy and persisted state, with a fake clock: no flapping on noisy traffic."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from graphmode.control.policy import Advice, Policy, PolicyConfig, PolicyState, advice_from_recommendation
from graphmode.control.state import DeploymentState, load_state, save_state
from graphmode.core.errors import ConfigError

FAP, FULL, PW = "FULL_AND_PIECEWISE", "FULL", "PIECEWISE"


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def cfg(**kw: float) -> PolicyConfig:
    base = dict(min_dwell_s=600.0, cooldown_s=300.0, min_gain=0.05, horizon_s=1800.0, max_attempts=3,
                attempts_window_s=3600.0, retry_in_s=120.0, confirmations=3, lost_capacity=1.0)
    base.update(kw)
    return PolicyConfig(**base)  # type: ignore[arg-type]


def advice(best: str = FULL, gain: float = 0.2, ties: tuple[str, ...] = ()) -> Advice:
    # itl in seconds: FAP is 10 ms, best is (1-gain)×10 ms
    scores = {FAP: 0.010, FULL: 0.010, PW: 0.011, best: 0.010 * (1 - gain)}
    return Advice(best=best, scores=scores, direction="min", ties=ties)


def fresh(clock: FakeClock, **kw: float) -> tuple[Policy, PolicyState]:
    p = Policy(cfg(**kw), clock=clock)
    st = PolicyState(mode_since=clock() - 10_000)  # long past the dwell
    return p, st


def test_switches_only_after_k_confirmations() -> None:
    clock = FakeClock()
    p, st = fresh(clock)
    actions = []
    for _ in range(3):
        d = p.evaluate(st, FAP, advice(), startup_s=60, rate=5.0)
        actions.append(d.action)
        clock.advance(30)
    assert actions == ["hold", "hold", "switch"]
    assert d.target == FULL and d.numbers["gain"] == pytest.approx(0.2)
    assert d.numbers["benefit"] == pytest.approx(0.2 * 1800 * 5) and d.numbers["cost"] == pytest.approx(300)
    assert "1/3" not in d.reason and "better" in d.reason


def test_alternating_winners_never_switch() -> None:
    """Noisy traffic: the winner changes every evaluation → the streak never reaches K."""
    clock = FakeClock()
    p, st = fresh(clock, confirmations=2)
    for i in range(200):
        d = p.evaluate(st, FAP, advice(FULL if i % 2 else PW), startup_s=60, rate=5.0)
        assert d.action != "switch"
        clock.advance(30)


def test_random_noise_around_tie_never_switches_and_cost_blocks() -> None:
    rng = random.Random(0)
    clock = FakeClock()
    p, st = fresh(clock, confirmations=1)
    for _ in range(500):
        g = rng.uniform(-0.04, 0.049)  # below min_gain
        d = p.evaluate(st, FAP, advice(FULL, g), startup_s=60, rate=5.0)
        assert d.action == "stay"
        clock.advance(10)
    # a big gain but a horizon too short to repay the restart
    p2, st2 = fresh(clock, confirmations=1, horizon_s=100.0)
    d = p2.evaluate(st2, FAP, advice(FULL, 0.2), startup_s=60, rate=5.0)  # 0.2×100 = 20 < 60
    assert d.action == "stay" and "restart cost" in d.reason


def test_tied_current_mode_and_no_traffic_stay() -> None:
    clock = FakeClock()
    p, st = fresh(clock, confirmations=1)
    assert p.evaluate(st, FAP, advice(FULL, 0.3, ties=(FULL, FAP)), startup_s=60, rate=5).action == "stay"
    d = p.evaluate(st, FAP, advice(FULL, 0.3), startup_s=60, rate=0.0)
    assert d.action == "stay" and "no traffic" in d.reason
    assert p.evaluate(st, FAP, None, startup_s=60, rate=5).action == "stay"
    assert p.evaluate(st, FULL, advice(FULL, 0.3), startup_s=60, rate=5).action == "stay"


def test_min_dwell_and_cooldown() -> None:
    clock = FakeClock()
    p = Policy(cfg(confirmations=1, min_dwell_s=600, cooldown_s=900), clock=clock)
    st = PolicyState()
    d = p.evaluate(st, FAP, advice(), startup_s=60, rate=5)  # first sight: mode_since = now
    assert d.action == "hold" and "dwell" in d.reason
    clock.advance(601)
    assert p.evaluate(st, FAP, advice(), startup_s=60, rate=5).action == "switch"
    p.record_attempt(st, FAP, FULL, ok=True)
    # now on FULL; a new winner PW is held by the dwell, then by the cooldown (900 > 600)
    clock.advance(601)
    d = p.evaluate(st, FULL, advice(PW, 0.3), startup_s=60, rate=5)
    assert d.action == "hold" and "cooldown" in d.reason
    clock.advance(300)
    assert p.evaluate(st, FULL, advice(PW, 0.3), startup_s=60, rate=5).action == "switch"


def test_failed_switches_flap_guard_attempts_window_retry_in() -> None:
    clock = FakeClock()
    p = Policy(cfg(confirmations=1, cooldown_s=10, max_attempts=2, attempts_window_s=3600, retry_in_s=1000),
               clock=clock)
    st = PolicyState(mode_since=clock() - 10_000)
    for _ in range(2):
        assert p.evaluate(st, FAP, advice(), startup_s=60, rate=5).action == "switch"
        p.record_attempt(st, FAP, FULL, ok=False, reason="bad flag")
        clock.advance(11)
    d = p.evaluate(st, FAP, advice(), startup_s=60, rate=5)
    assert d.action == "hold" and "2 failed switches" in d.reason and d.numbers["recent_failures"] == 2
    clock.advance(500)
    assert p.evaluate(st, FAP, advice(), startup_s=60, rate=5).action == "hold"
    clock.advance(500)  # last failure + retry_in passed: one more try allowed, the counter restarts
    assert p.evaluate(st, FAP, advice(), startup_s=60, rate=5).action == "switch"
    assert st.flap_reset_at > 0
    p.record_attempt(st, FAP, FULL, ok=False)
    clock.advance(11)
    assert p.evaluate(st, FAP, advice(), startup_s=60, rate=5).action == "switch"  # 1 failure since reset


def test_state_round_trip_keeps_timers(tmp_path: Path) -> None:
    clock = FakeClock()
    p = Policy(cfg(confirmations=2), clock=clock)
    s = DeploymentState(deployment_id="prod-1", current_mode=FAP, current_command=["vllm", "serve", "m"])
    s.policy.mode_since = clock()
    p.evaluate(s.policy, FAP, advice(), startup_s=60, rate=5)
    p.record_attempt(s.policy, FAP, FULL, ok=False, reason="boom")
    for i in range(300):
        s.add_decision({"i": i})
    save_state(tmp_path, s)
    back = load_state(tmp_path, "prod-1")
    assert back.policy.mode_since == s.policy.mode_since and back.policy.last_attempt_at == clock()
    assert back.policy.attempts[0].reason == "boom" and len(back.decisions) == 200
    assert back.current_command == ["vllm", "serve", "m"]
    # a restarted controller sees the cooldown that was running
    d = p.evaluate(back.policy, FAP, advice(), startup_s=60, rate=5)
    assert d.action == "hold"
    assert not list(tmp_path.glob("*.tmp"))
    assert load_state(tmp_path, "other").current_mode is None
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError):
        load_state(tmp_path, "bad")
    with pytest.raises(ConfigError):
        load_state(tmp_path, "../escape")


def test_advice_from_recommendation_dict() -> None:
    rec = {"mode": FULL, "ties": [FULL], "objective": {"metric": "output_tok_s"},
           "predictions": [{"mode": FULL, "score": 120.0, "noise": 1.0, "metrics": {"startup_s": 30.0}},
                           {"mode": FAP, "score": 100.0, "noise": 1.0, "metrics": {}}]}
    a = advice_from_recommendation(rec)
    assert a.direction == "max" and a.gain(FAP) == pytest.approx(0.2) and a.startup_s[FULL] == 30.0
    assert json.dumps(Policy(cfg()).evaluate(PolicyState(), FAP, a, startup_s=None, rate=1).as_dict())
