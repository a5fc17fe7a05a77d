"""A bounded, thread-safe memo of pure per-model computations (least recently used out first).

A loaded :class:`~graphmode.selector.recommend.Recommender` keeps a few: the regressors' outputs per input
row, a workload description's expected features per shape, the race verdicts' answer per request. Each is a
deterministic function of its key and of the model the memo belongs to, so an answer from the memo is the
answer computed afresh; a reload builds new recommenders, so new (empty) memos. The bound keeps a service
that sees endless distinct requests at a fixed memory cost: it only loses the hits.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")

MEMO_SIZE = 4096  # entries per memo: a few MB for the largest (a regressor output row per entry)


class Memo(Generic[V]):
    """At most ``size`` values by key; :meth:`get` computes and keeps a missing one."""

    def __init__(self, size: int = MEMO_SIZE) -> None:
        if size < 1:
            raise ValueError(f"a memo holds at least one entry, got size {size}")
        self.size = size
        self._data: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, compute: Callable[[], V]) -> V:
        """The value kept for *key*, else ``compute()`` (outside the lock: two threads may both compute a
        missing key; both get the same value, as the computation is pure)."""
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                self.hits += 1
                return self._data[key]
            self.misses += 1
        value = compute()
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
