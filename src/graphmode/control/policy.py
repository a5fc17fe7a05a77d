"""When to switch CUDA Graph mode: pure logic, an injectable clock, every decision with its numbers.

A switch restarts vLLM, which costs capacity; it pays only if the predicted gain, held for the time it is
expected to last, beats that cost. With ``r`` the observed request rate (req/s)::

    benefit = gain × horizon_s × r            request-seconds of work saved (relative gain × requests)
    cost    = startup_s × lost_capacity × r   request-seconds of capacity lost while the new server starts

``lost_capacity`` is 1 for stop-then-start (the whole server is down for ``startup_s``) and a fraction
for blue/green (the new server shares the accelerator while it starts). A switch happens only when

1. the recommended mode is not the current one and the current one is not tied with it (within noise);
2. the relative gain is at least ``min_gain`` and ``benefit > cost`` (there is traffic);
3. the same winner held for ``confirmations`` consecutive evaluations (hysteresis);
4. the current mode has run for ``min_dwell_s``; ``cooldown_s`` has passed since the last attempt;
5. failed switches are not flapping: after ``max_attempts`` failures inside ``attempts_window_s``,
   no attempt before the last failure + ``retry_in_s`` (as circus's ``attempts``/``window``/``retry_in``).

Timestamps are wall-clock seconds (``time.time``) so they survive a restart of the controller.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from graphmode.core.settings import ControlSettings

Clock = Callable[[], float]
Action = Literal["stay", "hold", "switch"]
MAX_ATTEMPTS_KEPT = 50


@dataclass(frozen=True)
class PolicyConfig:
    min_dwell_s: float = 600.0
    cooldown_s: float = 300.0
    min_gain: float = 0.05
    horizon_s: float = 1800.0
    max_attempts: int = 3
    attempts_window_s: float = 3600.0
    retry_in_s: float = 120.0
    confirmations: int = 3
    lost_capacity: float = 1.0

    @classmethod
    def from_settings(cls, c: ControlSettings, *, confirmations: int = 3,
                      lost_capacity: float = 1.0) -> PolicyConfig:
        return cls(min_dwell_s=c.min_dwell_s, cooldown_s=c.cooldown_s, min_gain=c.min_gain,
                   horizon_s=c.horizon_s, max_attempts=c.max_attempts,
                   attempts_window_s=c.attempts_window_s, retry_in_s=c.retry_in_s,
                   confirmations=confirmations, lost_capacity=lost_capacity)


@dataclass(frozen=True)
class Advice:
    """What the selector said, reduced to what the policy needs."""

    best: str
    scores: Mapping[str, float | None]  # objective score per mode (as ranked by the selector)
    direction: Literal["min", "max"] = "min"
    ties: tuple[str, ...] = ()  # modes within the noise of ``best``
    noise: Mapping[str, float | None] = field(default_factory=dict)
    startup_s: Mapping[str, float | None] = field(default_factory=dict)  # predicted, per mode

    def gain(self, current: str) -> float | None:
        """Relative improvement of ``best`` over ``current`` (0.1 = 10 % better), None if unknown."""
        b, c = self.scores.get(self.best), self.scores.get(current)
        if b is None or c is None or c <= 0 or b <= 0:
            return None
        return (c - b) / c if self.direction == "min" else (b - c) / c


class Attempt(BaseModel):
    t: float
    from_mode: str | None
    to_mode: str
    ok: bool
    reason: str = ""
    downtime_s: float | None = None


class PolicyState(BaseModel):
    """What the policy remembers between evaluations (persisted by the controller)."""

    mode_since: float | None = Field(None, description="when the current mode started serving")
    last_attempt_at: float | None = None
    streak_mode: str | None = None
    streak_count: int = 0
    flap_reset_at: float = 0.0
    attempts: list[Attempt] = Field(default_factory=list)


@dataclass(frozen=True)
class Decision:
    action: Action
    current: str
    target: str | None
    reason: str
    t: float
    numbers: dict[str, Any]

    @property
    def switch(self) -> bool:
        return self.action == "switch"

    def as_dict(self) -> dict[str, Any]:
        return {"t": self.t, "action": self.action, "current": self.current, "target": self.target,
                "reason": self.reason, "numbers": self.numbers}

    def line(self) -> str:
        nums = ", ".join(f"{k}={_fmt(v)}" for k, v in self.numbers.items() if v is not None)
        tgt = f" → {self.target}" if self.target and self.target != self.current else ""
        return f"{self.action.upper()} {self.current}{tgt}: {self.reason} ({nums})"


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


class Policy:
    """Decide stay / hold / switch. ``evaluate`` updates the hysteresis streak in ``state``."""

    def __init__(self, config: PolicyConfig, clock: Clock = time.time) -> None:
        if config.confirmations < 1:
            raise ValueError("confirmations must be >= 1")
        self.config = config
        self.clock = clock

    def evaluate(self, state: PolicyState, current: str, advice: Advice | None, *,
                 startup_s: float | None, rate: float | None) -> Decision:
        now = self.clock()
        c = self.config
        if state.mode_since is None:
            state.mode_since = now
        nums: dict[str, Any] = {"rate": rate, "startup_s": startup_s}

        def out(action: Action, reason: str, target: str | None = None) -> Decision:
            if action == "stay":
                state.streak_mode, state.streak_count = None, 0
            nums["streak"] = state.streak_count
            return Decision(action, current, target, reason, now, dict(nums))

        if advice is None:
            return out("stay", "no recommendation (no features yet or the selector failed)")
        best = advice.best
        nums["best"] = best
        if best == current:
            return out("stay", "the current mode is the recommended one")
        if current in advice.ties:
            return out("stay", f"{best} is within the noise of the current mode", best)
        gain = advice.gain(current)
        nums["gain"] = gain
        nums["min_gain"] = c.min_gain
        if gain is None:
            return out("stay", f"no prediction to compare {best} with {current}", best)
        if gain < c.min_gain:
            return out("stay", f"predicted gain {gain:.1%} < min_gain {c.min_gain:.1%}", best)
        if not rate or rate <= 0:
            return out("stay", "no traffic: nothing to gain from a restart", best)
        start = startup_s if startup_s is not None else advice.startup_s.get(best)
        if start is None:
            start = 60.0
            nums["startup_s_assumed"] = start
        benefit = gain * c.horizon_s * rate
        cost = start * c.lost_capacity * rate
        nums.update(benefit=benefit, cost=cost, horizon_s=c.horizon_s, lost_capacity=c.lost_capacity)
        if benefit <= cost:
            return out("stay", f"gain over the horizon ({benefit:.4g}) does not beat the restart cost "
                               f"({cost:.4g})", best)
        # Hysteresis: the same winner K evaluations in a row.
        if state.streak_mode == best:
            state.streak_count += 1
        else:
            state.streak_mode, state.streak_count = best, 1
        if state.streak_count < c.confirmations:
            return out("hold", f"{best} wins {state.streak_count}/{c.confirmations} evaluations in a row",
                       best)
        dwell = now - state.mode_since
        nums["dwell_s"] = dwell
        if dwell < c.min_dwell_s:
            return out("hold", f"minimum dwell: {current} has run {dwell:.0f} s of {c.min_dwell_s:.0f} s",
                       best)
        if state.last_attempt_at is not None and now - state.last_attempt_at < c.cooldown_s:
            left = c.cooldown_s - (now - state.last_attempt_at)
            return out("hold", f"cooldown after the last switch attempt: {left:.0f} s left", best)
        failures = [a for a in state.attempts if not a.ok and a.t > now - c.attempts_window_s
                    and a.t > state.flap_reset_at]
        nums["recent_failures"] = len(failures)
        if len(failures) >= c.max_attempts:
            until = max(a.t for a in failures) + c.retry_in_s
            if now < until:
                return out("hold", f"{len(failures)} failed switches within {c.attempts_window_s:.0f} s: "
                                   f"retrying in {until - now:.0f} s", best)
            state.flap_reset_at = until
        return out("switch", f"{best} predicted {gain:.1%} better than {current}; benefit {benefit:.4g} > "
                             f"cost {cost:.4g}", best)

    def record_attempt(self, state: PolicyState, from_mode: str | None, to_mode: str, ok: bool,
                       reason: str = "", downtime_s: float | None = None) -> Attempt:
        now = self.clock()
        a = Attempt(t=now, from_mode=from_mode, to_mode=to_mode, ok=ok, reason=reason, downtime_s=downtime_s)
        state.attempts = [*state.attempts, a][-MAX_ATTEMPTS_KEPT:]
        state.last_attempt_at = now
        state.streak_mode, state.streak_count = None, 0
        if ok:
            state.mode_since = now
        return a


def advice_from_recommendation(rec: Any) -> Advice:
    """An :class:`Advice` from a :class:`graphmode.selector.recommend.Recommendation` (or its JSON dict)."""
    data: dict[str, Any] = rec if isinstance(rec, dict) else rec.model_dump(mode="json")
    preds = data.get("predictions") or []
    objective = data.get("objective") or {}
    metric = objective.get("metric") if isinstance(objective, dict) else None
    from graphmode.selector.objective import METRICS

    direction: Literal["min", "max"] = METRICS[metric].direction if metric in METRICS else "min"
    return Advice(
        best=str(data["mode"]),
        scores={p["mode"]: p.get("score") for p in preds},
        direction=direction,
        ties=tuple(data.get("ties") or ()),
        noise={p["mode"]: p.get("noise") for p in preds},
        startup_s={p["mode"]: (p.get("metrics") or {}).get("startup_s") for p in preds},
    )


def capture_gain(graphed_now: float | None, graphed_new: float | None, advice: Advice | None,
                 mode: str, padding_now: float | None = None,
                 padding_new: float | None = None) -> tuple[float | None, str]:
    """Relative gain of a capture-size change, in the units :meth:`Policy.evaluate` weighs, and how.

    A step that stops running un-graphed costs what the selector predicts for the same traffic without
    graphs (NONE) against ``mode``; that term is the relative penalty times the share of steps that change
    side. Padding adds its predicted step time (``ListStats.padding_cost`` of each list, weighted by its
    graphed share): a list that padded 48 running to 256 read ITL 1.47x on the H200 8B, with every step
    graphed either way. Memory changes have no latency prediction and count as zero (the answer reports
    them), so a list that only saves memory never pays for a restart.
    """
    if graphed_now is None or graphed_new is None:
        return None, "no step distribution"
    parts: list[str] = []
    gain = 0.0
    moved = graphed_new - graphed_now
    if abs(moved) > 1e-9:
        if advice is None:
            return None, "no recommendation to price an un-graphed step"
        eager, graphed = advice.scores.get("NONE"), advice.scores.get(mode)
        if eager is None or graphed is None or eager <= 0 or graphed <= 0:
            return None, f"no prediction for NONE and {mode} to price an un-graphed step"
        penalty = (eager - graphed) / graphed if advice.direction == "min" else (graphed - eager) / eager
        gain += moved * max(penalty, 0.0)
        parts.append(f"{moved:+.1%} of steps replay a graph × un-graphed penalty {penalty:.2f}")
    if padding_now is not None and padding_new is not None:
        saved = graphed_now * padding_now - graphed_new * padding_new
        gain += saved
        parts.append(f"padding {padding_now:.1%} → {padding_new:.1%} of a graphed step's time")
    return gain, "; ".join(parts) or "the same share of steps replays a graph; padding not priced"


def evaluate_capture(policy: Policy, state: PolicyState, current: list[int], proposed: list[int],
                     gain: float | None, *, startup_s: float | None, rate: float | None,
                     how: str = "") -> Decision:
    """Stay or restart for a capture-size change: the same benefit-vs-restart-cost rule, dwell and cooldown
    as a mode switch (a capture-size change is a restart like a mode change)."""
    now = policy.clock()
    c = policy.config
    cur, new = _sizes_label(current), _sizes_label(proposed)
    nums: dict[str, Any] = {"rate": rate, "startup_s": startup_s, "gain": gain, "min_gain": c.min_gain}

    def out(action: Action, reason: str) -> Decision:
        return Decision(action, f"capture {cur}", f"capture {new}", reason, now, dict(nums))

    if sorted(set(current)) == sorted(set(proposed)):
        return out("stay", "the capture sizes already match the recommendation")
    if gain is None:
        return out("stay", f"no predicted gain for the new capture sizes ({how})")
    if gain < c.min_gain:
        return out("stay", f"predicted gain {gain:.1%} < min_gain {c.min_gain:.1%} ({how})")
    if not rate or rate <= 0:
        return out("stay", "no traffic: nothing to gain from a restart")
    start = startup_s if startup_s is not None else 60.0
    benefit, cost = gain * c.horizon_s * rate, start * c.lost_capacity * rate
    nums.update(benefit=benefit, cost=cost)
    if benefit <= cost:
        return out("stay", f"gain over the horizon ({benefit:.4g}) does not beat the restart cost ({cost:.4g})")
    if state.mode_since is not None and now - state.mode_since < c.min_dwell_s:
        return out("hold", f"minimum dwell: the server has run {now - state.mode_since:.0f} s of "
                           f"{c.min_dwell_s:.0f} s")
    if state.last_attempt_at is not None and now - state.last_attempt_at < c.cooldown_s:
        return out("hold", "cooldown after the last restart")
    return out("switch", f"new capture sizes predicted {gain:.1%} better ({how}); benefit {benefit:.4g} > "
                         f"cost {cost:.4g}")


def _sizes_label(sizes: list[int]) -> str:
    s = sorted(set(sizes))
    return f"[{', '.join(map(str, s))}]" if len(s) <= 6 else f"[{s[0]}..{s[-1]}, {len(s)} sizes]"


def capture_decision(policy: Policy, state: PolicyState, mode: str, vllm_args: list[str], steps: Any,
                     advice: Advice | None, *, rate: float | None,
                     startup_s: float | None) -> tuple[Decision, list[str] | None]:
    """Whether to restart ``mode``'s server with the capture sizes chosen for ``steps`` (a StepSizes), and
    the vLLM args to restart with (``None`` unless the decision is a switch)."""
    from graphmode.selector.capture import choose_capture_sizes
    from graphmode.selector.capture_costs import default_capture_sizes
    from graphmode.selector.capture_steps import list_stats, step_distribution
    from graphmode.selector.graphconfig import int_flag
    from graphmode.vllm_args import user_capture_sizes, with_compilation_config

    seqs = int_flag(vllm_args, "--max-num-seqs") or 256
    tokens = int_flag(vllm_args, "--max-num-batched-tokens")
    # a live window does not know how many API servers pooled its histogram; the deployment's args do, and
    # both lists must be read on the same per-engine steps (four servers: a step of 768 shows as 4 x 192)
    servers = int_flag(vllm_args, "--api-server-count", "-asc", "--api_server_count")
    if steps is not None:
        steps = steps.per_engine_step(servers)
    current = user_capture_sizes(vllm_args) or default_capture_sizes(seqs, tokens)
    answer = choose_capture_sizes(steps, mode=mode, max_num_seqs=seqs, max_num_batched_tokens=tokens)
    # The current list's graphed share on the same distribution (it may be the user's, not the default).
    dist = step_distribution(steps, tokens or 8192) if steps is not None else None
    now = list_stats(current, dist, None, mode) if dist is not None else None
    gain, how = capture_gain(now.graphed_share if now is not None else None, answer.chosen.graphed_share, advice,
                             mode, now.padding_cost if now is not None else None, answer.chosen.padding_cost)
    d = evaluate_capture(policy, state, current, answer.sizes, gain, startup_s=startup_s, rate=rate, how=how)
    return d, (with_compilation_config(vllm_args, answer.compilation_config()) if d.switch else None)
