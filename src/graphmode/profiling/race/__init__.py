"""A race: the candidate modes' vLLM engines resident side by side on one GPU, measured in paired rounds.

Between two starts of one mode latency can move by more than the modes differ, so a grid that starts each
mode once per repeat needs many repeats. Engines that stay up side by side and take turns on the same
workload see the same host state within seconds: the ratio mode / default inside a round cancels most of it.

- :mod:`.schedule`: settings, arms, the summary, and when to restart, which replica to measure, the race key;
- :mod:`.engines`: starting engines side by side (compile start, warm-up), restart waves, stopping them;
- :mod:`.loop`: :class:`Racer`, the rounds and the sequential decisions after each.

With ``kv_cache_memory_bytes`` every engine gets that KV share and ``--gpu-memory-utilization`` is replaced
by a small value, because vLLM's start-up check of free memory counts the neighbours' memory. Capture-size
arms (:mod:`graphmode.profiling.race_sizes`) race the default mode with a given ``cudagraph_capture_sizes``
list like any other arm.
"""

from __future__ import annotations

from graphmode.profiling.race.loop import Racer
from graphmode.profiling.race.schedule import (
    Arm,
    ArmState,
    NullRaceReporter,
    RaceConfig,
    RaceReporter,
    RaceSummary,
    check_replicas,
    race_key,
    race_vllm_args,
    replica_slot,
    wave_due,
)

__all__ = ["Arm", "ArmState", "NullRaceReporter", "RaceConfig", "RaceReporter", "RaceSummary", "Racer",
           "check_replicas", "race_key", "race_vllm_args", "replica_slot", "wave_due"]
