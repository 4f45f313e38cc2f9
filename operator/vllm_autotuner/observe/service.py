"""Shares observation windows between tunings: one set of queries per key and tick.

Tunings that read the same Prometheus, with the same selector and window
(and reach for server starts, ``queries.reach``),
evaluated at the same aligned instant, get the same ``WindowData``: the
first asks, the others await its answer. In the naive mode (the scale
benchmark's baseline) each tuning adds its own pod matchers, so nothing is
shared. Queries run in a worker thread; failures are shared too, so a dead
Prometheus costs one timeout per tick, not one per tuning.

Windows are kept until the evaluator's tick is over (``forget``): a later
tick asks for a later instant, and a window of a thousand pods' histograms
holds some 15 MiB.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from vllm_autotuner.observe.client import Connection, PrometheusClient
from vllm_autotuner.observe.queries import Matcher, Selector
from vllm_autotuner.observe.window import WindowData, fetch_window

WindowKey = tuple[Connection, Selector, float, float, tuple[Matcher, ...], int | None]


class ObservationService:
    """Fetches ``WindowData`` once per key; ``client_for`` builds (and the service keeps) one client per connection."""

    def __init__(self, client_for: Callable[[Connection], PrometheusClient] = PrometheusClient) -> None:
        self._client_for = client_for
        self._clients: dict[Connection, PrometheusClient] = {}
        self._used: set[Connection] = set()  # connections asked for since the last ``forget``
        self._windows: dict[WindowKey, asyncio.Future[WindowData]] = {}

    def client(self, connection: Connection) -> PrometheusClient:
        if connection not in self._clients:
            self._clients[connection] = self._client_for(connection)
        self._used.add(connection)
        return self._clients[connection]

    async def window(self, connection: Connection, selector: Selector, window_seconds: float, at: float,
                     extra: tuple[Matcher, ...] = (), reach_seconds: int | None = None) -> WindowData:
        """The window ending at ``at``; raises ``PrometheusError`` like ``fetch_window``."""
        key = (connection, selector, window_seconds, at, extra, reach_seconds)
        future = self._windows.get(key)
        if future is None:
            client = self.client(connection)
            future = asyncio.ensure_future(
                asyncio.to_thread(fetch_window, client, selector, window_seconds, at, extra, reach_seconds))
            future.add_done_callback(lambda f: f.cancelled() or f.exception())  # a failure nobody awaits is not an error
            self._windows[key] = future
        return await asyncio.shield(future)

    def forget(self) -> None:
        """Drop the windows fetched so far (those being fetched still answer whoever awaits them), and the
        clients of connections no tuning asked for since the last call (a rotated token, an edited URL)."""
        self._windows.clear()
        for connection in set(self._clients) - self._used:
            self._clients.pop(connection).close()
        self._used.clear()
