"""Leader election on a coordination.k8s.io Lease, so that of several replicas exactly one acts.

kopf's own peering pauses operators of equal priority rather than electing
one of them, so the chart's two replicas would both stand still. This is the
client-go algorithm instead: a replica holds the Lease while it renews it;
the others watch the record and take over once it has not changed for the
lease duration *by their own clock* (no cross-node clock comparison), with
every write guarded by resourceVersion so two candidates cannot both win.
A leader that cannot renew in time stops acting (the process exits and
Kubernetes restarts it as a candidate), as controller-runtime does.
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

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    lease_seconds: float = 15.0
    renew_seconds: float = 5.0
    retry_seconds: float = 2.0


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
        try:
            lease = self.api.read_namespaced_lease(cfg.name, cfg.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            try:
                self.api.create_namespaced_lease(cfg.namespace, self._body(None, 0, None))
            except ApiException as create_exc:
                if create_exc.status == 409:
                    return False
                raise
            self._observed, self._observed_at = None, self._monotonic()
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
                cfg.name, cfg.namespace, self._body(lease.metadata.resource_version, transitions, acquire)
            )
        except ApiException as exc:
            if exc.status == 409:  # someone else wrote first
                return False
            raise
        self._observed = (updated.spec.holder_identity, str(updated.spec.renew_time))
        self._observed_at = self._monotonic()
        return True

    async def acquire(self) -> None:
        """Wait until this replica is the leader."""
        announced = False
        while True:
            try:
                if await asyncio.to_thread(self.try_acquire_or_renew):
                    self.is_leader = True
                    log.info("became leader", extra={"lease": self.config.name, "identity": self.config.identity})
                    return
            except ApiException as exc:
                log.warning("leader election failed: %s", exc.reason)
            if not announced:
                log.info("another replica leads; standing by", extra={"lease": self.config.name})
                announced = True
            await asyncio.sleep(self.config.retry_seconds)

    async def hold(self) -> None:
        """Renew while leading; return when the lease could not be renewed within its duration."""
        last_renewed = self._monotonic()
        while True:
            await asyncio.sleep(self.config.renew_seconds)
            try:
                if await asyncio.to_thread(self.try_acquire_or_renew):
                    last_renewed = self._monotonic()
                    continue
            except ApiException as exc:
                log.warning("lease renewal failed: %s", exc.reason)
            if self._monotonic() - last_renewed > self.config.lease_seconds:
                self.is_leader = False
                log.error("lost leadership: lease not renewed for %.0fs", self.config.lease_seconds)
                return

    def release(self) -> None:
        """Give the lease up on clean shutdown so a standby takes over at once."""
        if not self.is_leader:
            return
        try:
            lease = self.api.read_namespaced_lease(self.config.name, self.config.namespace)
            if lease.spec.holder_identity == self.config.identity:
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                self.api.replace_namespaced_lease(self.config.name, self.config.namespace, lease)
        except ApiException as exc:
            log.warning("could not release the lease: %s", exc.reason)
        self.is_leader = False
