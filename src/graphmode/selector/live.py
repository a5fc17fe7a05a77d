"""Observed features of a live vLLM server: ``/metrics`` scraped over a window, as in profiling."""

from __future__ import annotations

import time
from collections.abc import Callable

from graphmode.core.errors import ScrapeError
from graphmode.core.records import ObservedFeatures
from graphmode.profiling.features import FeatureWindow
from graphmode.profiling.metrics import scrape_sync


def metrics_url(server: str) -> str:
    base = server.rstrip("/")
    if not base.startswith(("http://", "https://")):
        base = "http://" + base
    return base if base.endswith("/metrics") else base + "/metrics"


def observe_server(
    server: str,
    window_s: float = 30.0,
    interval_s: float = 1.0,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    on_sample: Callable[[int], None] | None = None,
    windows: list[FeatureWindow] | None = None,
) -> ObservedFeatures:
    """Scrape ``server`` every ``interval_s`` for ``window_s`` seconds and compute its features.

    Raises :class:`ScrapeError` when the first scrape fails (wrong URL, server down); a later failed
    scrape is skipped. At least two snapshots are taken, so rates are defined. ``windows``, when given,
    receives the window, so a caller can take more from the same snapshots (e.g. its step sizes).
    """
    if window_s <= 0 or interval_s <= 0:
        raise ValueError("window and interval must be positive")
    url = metrics_url(server)
    window = FeatureWindow(window_s + interval_s)
    if windows is not None:
        windows.append(window)
    window.add(scrape_sync(url, clock=clock))
    start = clock()
    n = 1
    while clock() - start < window_s or n < 2:
        sleep(interval_s)
        try:
            window.add(scrape_sync(url, clock=clock))
            n += 1
        except ScrapeError:
            continue
        if on_sample is not None:
            on_sample(n)
    return window.features()
