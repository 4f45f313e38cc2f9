"""Leader election on a coordination.k8s.io Lease, so that of several replicas exactly one acts.

kopf's own peering pauses operators of equal priority rather than electing
one of them, so the chart's two replicas would both stand still. This is the
client-go algorithm instead: a replica holds the Lease while it renews it;
the others watch the record and take over once it has not changed for the
lease duration *by their own clock* (no cross-node clock comparison), with
every write guarded by resourceVersion so two candidates cannot both win.
A leader that has not renewed for the renew deadline, which is shorter than
the lease duration, stops acting (the process exits and Kubernetes restarts
it as a candidate), as controller-runtime does: it has stopped before any
standby can take over. So that a hung connection cannot hold it past that
point, every API call has a timeout and every round is cut off at the
deadline. Its writes (a Deployment patch, a status, an Event) run in worker
threads that stopping does not interrupt, so each is sent only with time
left before any standby could lead, and may take no longer than that time
(``write_seconds_left``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseConfig:
    """Timings as in client-go (leaseDuration 15s, renewDeadline 10s, retryPeriod 2s).

    lease_seconds: a standby takes over once the Lease has not changed for this long.
    renew_deadline_seconds: the leader stops once no renewal has succeeded for this long
        (counted from when the renewal was sent); shorter than lease_seconds, so it stops
        before a standby can take over, whatever its API calls do.
    renew_seconds: how often the leader renews; retry_seconds: how often a standby
        tries, or the leader retries a failed renewal.
    """

    namespace: str
    name: str
    identity: str
    lease_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    renew_seconds: float = 5.0
    retry_seconds: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.renew_deadline_seconds < self.lease_seconds:
            raise ValueError(f"renew deadline {self.renew_deadline_seconds}s must be positive and below "
                             f"the lease duration {self.lease_seconds}s")


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Acquire, renew and (on shutdown) release one Lease. Blocking API calls run in a thread."""

    def __init__(self, api: client.CoordinationV1Api, config: LeaseConfig,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.config = config
        self._monotonic = monotonic
        self._observed: tuple[str | None, str | None] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._renewed_at = 0.0  # when the last successful round started
        # Per API call, as client-go's leader-election client (renewDeadline / 2): a hung
        # connection fails instead of keeping the thread, and shutdown, waiting.
        self._timeout = config.renew_deadline_seconds / 2
        self.is_leader = False

    def _body(self, resource_version: str | None, transitions: int, acquire_time: str | None) -> client.V1Lease:
        now = _now_micro()
        return client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.config.name, namespace=self.config.namespace,
                                         resource_version=resource_version),
            spec=client.V1LeaseSpec(
                holder_identity=self.config.identity,
                lease_duration_seconds=int(self.config.lease_seconds),
                acquire_time=acquire_time or now,
                renew_time=now,
                lease_transitions=transitions,
            ),
        )

    def try_acquire_or_renew(self) -> bool:
        """One round of the algorithm; True when this replica holds the lease afterwards."""
        cfg = self.config
        started = self._monotonic()
        try:
            lease = self.api.read_namespaced_lease(cfg.name, cfg.namespace, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status != 404:
                raise
            try:
                self.api.create_namespaced_lease(cfg.namespace, self._body(None, 0, None),
                                                 _request_timeout=self._timeout)
            except ApiException as create_exc:
                if create_exc.status == 409:
                    return False
                raise
            self._observed, self._observed_at = None, self._monotonic()
            self._renewed_at = started
            return True
        spec = lease.spec
        record = (spec.holder_identity, str(spec.renew_time))
        if record != self._observed:
            self._observed, self._observed_at = record, self._monotonic()
        held_by_me = spec.holder_identity == cfg.identity
        duration = spec.lease_duration_seconds or cfg.lease_seconds
        expired = self._monotonic() - self._observed_at > duration
        if not held_by_me and spec.holder_identity and not expired:
            return False
        transitions = (spec.lease_transitions or 0) + (0 if held_by_me else 1)
        acquire = spec.acquire_time.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if held_by_me and spec.acquire_time else None
        try:
            updated = self.api.replace_namespaced_lease(
                cfg.name, cfg.namespace, self._body(lease.metadata.resource_version, transitions, acquire),
                _request_timeout=self._timeout,
            )
        except ApiException as exc:
            if exc.status == 409:  # someone else wrote first
                return False
            raise
        self._observed = (updated.spec.holder_identity, str(updated.spec.renew_time))
        self._observed_at = self._monotonic()
        self._renewed_at = started
        return True

    async def _round(self, timeout: float) -> bool:
        """try_acquire_or_renew in a thread; False when it fails or has not finished within timeout."""
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.try_acquire_or_renew), timeout)
        except TimeoutError:
            log.warning("lease update did not finish within %.1fs", timeout)
        except ApiException as exc:
            log.warning("lease update failed: %s", exc.reason)
        except HTTPError as exc:
            log.warning("lease update failed: %s", exc)
        return False

    async def acquire(self) -> None:
        """Wait until this replica is the leader."""
        announced = False
        while True:
            if await self._round(self.config.renew_deadline_seconds):
                self.is_leader = True
                log.info("became leader", extra={"lease": self.config.name, "identity": self.config.identity})
                return
            if not announced:
                log.info("another replica leads; standing by", extra={"lease": self.config.name})
                announced = True
            await asyncio.sleep(self.config.retry_seconds)

    async def hold(self) -> None:
        """Renew while leading; return once no renewal has succeeded for the renew deadline."""
        cfg = self.config
        pause = cfg.renew_seconds
        while True:
            deadline = self._renewed_at + cfg.renew_deadline_seconds
            # wake with a retry's time left for a round, not at the deadline (a late start: nothing left to try)
            await asyncio.sleep(max(0.0, min(pause, deadline - self._monotonic() - cfg.retry_seconds)))
            left = deadline - self._monotonic()
            if left <= 0:
                break
            pause = cfg.renew_seconds if await self._round(left) else cfg.retry_seconds
        self.is_leader = False
        log.error("lost leadership: lease not renewed for %.1fs", cfg.renew_deadline_seconds)

    def write_seconds_left(self) -> float:
        """How long a write sent now has to land before a standby could take the Lease over, by this replica's clock:
        the lease duration from the start of the last successful round (a standby counts it from later, when it read
        that round's record); 0 when not leading. ``kube.Kube`` sends no write with too little of it left."""
        if not self.is_leader:
            return 0.0
        return self._renewed_at + self.config.lease_seconds - self._monotonic()

    def release(self) -> None:
        """Give the lease up on clean shutdown so a standby takes over at once."""
        if not self.is_leader:
            return
        try:
            lease = self.api.read_namespaced_lease(self.config.name, self.config.namespace,
                                                   _request_timeout=self._timeout)
            if lease.spec.holder_identity == self.config.identity:
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                self.api.replace_namespaced_lease(self.config.name, self.config.namespace, lease,
                                                  _request_timeout=self._timeout)
        except ApiException as exc:
            log.warning("could not release the lease: %s", exc.reason)
        except HTTPError as exc:
            log.warning("could not release the lease: %s", exc)
        self.is_leader = False
