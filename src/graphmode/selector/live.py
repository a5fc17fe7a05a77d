"""Observed features of a live vLLM server: ``/metrics`` scraped over a window, as in profiling."""

from __future__ import annotations

import ipaddress
import re
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from graphmode.core.errors import ConfigError, ScrapeError
from graphmode.core.records import ObservedFeatures
from graphmode.profiling.features import FeatureWindow
from graphmode.profiling.metrics import scrape_sync

_HOST = re.compile(r"[a-z0-9_]([a-z0-9_.\-]{0,252})")


def metrics_url(server: str) -> str:
    """``scheme://host[:port]/metrics`` of a server given as ``host:port``, ``http(s)://host:port`` or that
    followed by ``/metrics``. Anything else (another path, a query, a fragment, credentials) is a
    :class:`ConfigError`: the URL is rebuilt from its scheme, host and port, so nothing but a server's
    /metrics is ever fetched (issue 12: a service scraping for anyone must not read other local pages)."""
    text = server.strip()
    try:
        parts = urlsplit(text if "://" in text else "http://" + text)
        port = parts.port
    except ValueError:
        raise ConfigError("server URL has an invalid host or port") from None
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"server URL must be http:// or https://, got {parts.scheme[:20]}://")
    if not parts.hostname:
        raise ConfigError("server URL has no host")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ConfigError("server URL must not carry credentials (user:password@)")
    if parts.path.rstrip("/") not in ("", "/metrics"):
        raise ConfigError("server URL must name a server (scheme://host:port), optionally with /metrics; "
                          "no other path")
    if parts.query or parts.fragment or "?" in text or "#" in text:
        raise ConfigError("server URL must not have a query or a fragment")
    host = parts.hostname
    if ":" in host:  # IPv6 literal
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError("server URL has an invalid IPv6 address") from None
        host = f"[{host}]"
    elif not _HOST.fullmatch(host):
        raise ConfigError("server URL host must be a DNS name or an IP address")
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "") + "/metrics"


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
