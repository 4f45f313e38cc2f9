"""The evaluation clock: which tunings are due, evaluated together so they share queries.

One loop for all tunings rather than a kopf daemon per object: daemons need
a finalizer on every VllmTuning (which would block deleting them once the
operator is uninstalled), and tunings evaluated at the same aligned instant
share one set of Prometheus queries. Each tuning is due on multiples of its
evaluationInterval; its window ends spec.prometheus.queryOffset before that
instant. A new tuning is due at once, one deleted and created again under
its name (a new metadata.uid) included, and so is one whose spec changed
since an evaluation last read it: a due time reckoned under the old spec (a
6 h interval shortened to 30 s) would leave the change unread until then.
What an evaluation read is recorded as it starts, not at scheduling: an edit
that lands while it waits for its turn is read by it, not again at once. One
whose status write was refused (409: changed since it was read) is due again
as soon as the watch brings another version, not an evaluationInterval later.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from vllm_autotuner.api.types import duration_seconds
from vllm_autotuner.controller.cache import ClusterCache, Key
from vllm_autotuner.controller.kube import NotLeading
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.reconcile import Reconciler

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 30.0
#: Tunings evaluated at once; their API calls run in worker threads.
CONCURRENCY = 16


def interval_of(body: dict) -> float:
    """A tuning's evaluation interval; the default when the spec cannot be read (its evaluation reports why)."""
    try:
        return max(1.0, duration_seconds(body["spec"]["traffic"]["evaluationInterval"]))
    except (KeyError, TypeError, ValueError):
        return DEFAULT_INTERVAL


def _identity(body: dict) -> tuple[object, object]:
    """Which tuning, and which of its specs: its metadata.uid and generation."""
    return body["metadata"].get("uid"), body["metadata"].get("generation")


class Evaluator:
    """Runs ``Reconciler.evaluate`` for every tuning when it is due."""

    def __init__(self, cache: ClusterCache, reconciler: Reconciler, metrics: OperatorMetrics,
                 clock: Callable[[], float] = time.time) -> None:
        self.cache = cache
        self.reconciler = reconciler
        self.metrics = metrics
        self.clock = clock
        self.due: dict[Key, float] = {}
        self.read: dict[Key, tuple[object, object]] = {}  # metadata.uid and generation the last evaluation read
        self.refused: dict[Key, object] = {}  # the resourceVersion a refused status write was conditional on
        self.seen = -math.inf  # the clock at the last tick
        self.periods = 0

    def _schedule(self, now: float) -> None:
        if now < self.seen - 1.0:
            # The wall clock stepped back (an NTP correction): due times reckoned before it would not come round
            # for as long as the step, rollbacks of failing rollouts included. Everything is due now.
            log.warning("the clock went back %.0fs; evaluating every tuning now", self.seen - now)
            self.due = dict.fromkeys(self.due, math.floor(now))
        self.seen = now
        for key in list(self.due):
            body = self.cache.tunings.get(key)
            if body is None or (key in self.read and self.read[key][0] != body["metadata"].get("uid")):
                # deleted, or deleted and created again under its name (kubectl replace --force): the old
                # tuning's series, rollout slot and counted verdict go with it, and the new one is new
                del self.due[key]
                self.read.pop(key, None)
                self.refused.pop(key, None)
                self.metrics.forget(*key)
                self.reconciler.forget(key)
        for key, body in self.cache.tunings.items():
            version = body["metadata"].get("resourceVersion")
            if key not in self.due:  # a new tuning is evaluated at once
                self.due[key] = math.floor(now)
                self.metrics.watch(*key)
            elif _identity(body) != self.read.get(key) or self.refused.get(key, version) != version:
                # so is a spec no evaluation has read, and a version read anew after a refused status write
                self.due[key] = min(self.due[key], math.floor(now))
        self.metrics.tunings.set(len(self.cache.tunings))

    async def _evaluate(self, key: Key, at: float, limit: asyncio.Semaphore, stop: asyncio.Event) -> None:
        async with limit:
            if stop.is_set():
                return  # stopping: the evaluations in flight finish, no other starts (``operator.wind_down``)
            if (body := self.cache.tunings.get(key)) is not None:  # what ``evaluate`` reads before it awaits
                self.read[key] = _identity(body)
            self.refused.pop(key, None)
            try:
                report = await self.reconciler.evaluate(key, at)
                if report is not None and report.refused and body is not None:
                    self.refused[key] = body["metadata"].get("resourceVersion")
            except NotLeading as exc:  # the Lease is running out: this replica stops, the next leader evaluates
                log.warning("evaluating %s/%s stopped: %s", *key, exc)
            except Exception:  # noqa: BLE001 - one tuning's bug must not stop the others; retried next interval
                log.exception("evaluating %s/%s failed; retrying at its next interval", *key)

    async def tick(self, stop: asyncio.Event) -> int:
        """Evaluate every tuning that is due now, none once ``stop`` is set; returns how many were due."""
        now = self.clock()
        self._schedule(now)
        due = [(key, at) for key, at in self.due.items() if at <= now]
        if not due:
            return 0
        started = time.perf_counter()
        limit = asyncio.Semaphore(CONCURRENCY)
        await asyncio.gather(*(self._evaluate(key, at, limit, stop) for key, at in due))
        self.reconciler.observations.forget()  # the next tick looks at later windows
        for key, _ in due:
            body = self.cache.tunings.get(key)
            if body is not None:
                interval = interval_of(body)
                self.due[key] = (math.floor(now / interval) + 1) * interval
        self.metrics.period_seconds.observe(time.perf_counter() - started)
        self.periods += 1
        return len(due)

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until ``stop`` is set."""
        while not stop.is_set():
            await self.tick(stop)
            upcoming = min(self.due.values(), default=self.clock() + 1.0)
            delay = min(1.0, max(0.05, upcoming - self.clock()))
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
            except TimeoutError:
                pass
