"""Leader election timing: a leader stops before any standby can take over, whatever its API calls do.

Each replica gets its own fake CoordinationV1Api over one shared Lease (resourceVersion-guarded
like the apiserver), whose calls can be made to hang, time out or fail. The durations are short
and real: the elector's own sleeps and deadlines are what is under test.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
import types
from datetime import datetime

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import ProtocolError, ReadTimeoutError

from vllm_autotuner.controller import kube as kube_module
from vllm_autotuner.controller.kube import Kube, NotLeading
from vllm_autotuner.controller.leader import LeaderElector, LeaseConfig
from vllm_autotuner.controller.metrics import OperatorMetrics

LEASE, DEADLINE = 2.0, 1.0


class Store:
    """The apiserver's one Lease, and when each holder's writes were committed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lease: client.V1Lease | None = None
        self.commits: list[tuple[str, float]] = []  # (holder, monotonic time)

    def commit(self, body: client.V1Lease) -> client.V1Lease:
        spec = body.spec
        for field in ("acquire_time", "renew_time"):
            if isinstance(getattr(spec, field), str):
                setattr(spec, field, datetime.fromisoformat(getattr(spec, field)))
        version = int(self.lease.metadata.resource_version) + 1 if self.lease else 1
        body.metadata.resource_version = str(version)
        self.lease = copy.deepcopy(body)
        self.commits.append((spec.holder_identity, time.monotonic()))
        return copy.deepcopy(body)

    def commit_times(self, holder: str) -> list[float]:
        with self.lock:
            return [at for who, at in self.commits if who == holder]


class FakeLeases:
    """One replica's CoordinationV1Api. fault: None, "hang" (ignores the timeout, as a
    trickling connection does), "timeout" (fails after it) or "error" (fails at once)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.fault: str | None = None
        self.timeouts: list[float] = []
        self.unblock = threading.Event()

    def _call(self, timeout: float) -> None:
        self.timeouts.append(timeout)
        if self.fault == "hang":
            self.unblock.wait()
            raise ProtocolError("connection reset")
        if self.fault == "timeout":
            time.sleep(timeout)
            raise ReadTimeoutError(None, "/leases", "read timed out")
        if self.fault == "error":
            raise ApiException(status=503, reason="Service Unavailable")

    def read_namespaced_lease(self, name, namespace, *, _request_timeout):
        self._call(_request_timeout)
        with self.store.lock:
            if self.store.lease is None:
                raise ApiException(status=404, reason="Not Found")
            return copy.deepcopy(self.store.lease)

    def create_namespaced_lease(self, namespace, body, *, _request_timeout):
        self._call(_request_timeout)
        with self.store.lock:
            if self.store.lease is not None:
                raise ApiException(status=409, reason="AlreadyExists")
            return self.store.commit(body)

    def replace_namespaced_lease(self, name, namespace, body, *, _request_timeout):
        self._call(_request_timeout)
        with self.store.lock:
            if body.metadata.resource_version != self.store.lease.metadata.resource_version:
                raise ApiException(status=409, reason="Conflict")
            return self.store.commit(body)


def replica(store: Store, identity: str) -> tuple[FakeLeases, LeaderElector]:
    api = FakeLeases(store)
    config = LeaseConfig("ns", "lease", identity, lease_seconds=LEASE, renew_deadline_seconds=DEADLINE,
                         renew_seconds=0.1, retry_seconds=0.05)
    return api, LeaderElector(api, config)


async def timed(coro) -> float:
    await coro
    return time.monotonic()


async def until(condition, limit: float = 5.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


def test_the_renew_deadline_defaults_to_client_gos_and_must_be_below_the_lease_duration():
    config = LeaseConfig("ns", "lease", "a")
    assert (config.lease_seconds, config.renew_deadline_seconds) == (15.0, 10.0)
    for deadline in (15.0, 20.0, 0.0):
        with pytest.raises(ValueError, match="renew deadline"):
            LeaseConfig("ns", "lease", "a", renew_deadline_seconds=deadline)


def test_a_leader_that_renews_keeps_the_lease_and_every_call_is_bounded():
    store = Store()
    api_a, a = replica(store, "a")
    api_b, b = replica(store, "b")

    async def main() -> None:
        await asyncio.wait_for(a.acquire(), 5)
        holding = asyncio.create_task(a.hold())
        standby = asyncio.create_task(b.acquire())
        done, _ = await asyncio.wait({holding, standby}, timeout=3 * LEASE)
        holding.cancel()
        standby.cancel()
        assert not done and a.is_leader and not b.is_leader
        assert len(store.commit_times("a")) > 10 and not store.commit_times("b")

    asyncio.run(main())
    timeouts = api_a.timeouts + api_b.timeouts
    assert timeouts and all(0 < t <= DEADLINE for t in timeouts)


@pytest.mark.parametrize("fault", ["hang", "timeout", "error"])
def test_a_leader_that_cannot_renew_stops_before_a_standby_takes_over(fault):
    store = Store()
    api_a, a = replica(store, "a")
    _, b = replica(store, "b")

    async def main() -> None:
        await asyncio.wait_for(a.acquire(), 5)
        holding = asyncio.create_task(timed(a.hold()))
        await until(lambda: len(store.commit_times("a")) >= 3)
        api_a.fault = fault
        standby = asyncio.create_task(b.acquire())
        try:
            stopped = await asyncio.wait_for(holding, LEASE + DEADLINE)
            await asyncio.wait_for(standby, 2 * LEASE)
        finally:
            api_a.unblock.set()
            standby.cancel()
        last_renewal, took_over = store.commit_times("a")[-1], store.commit_times("b")[0]
        assert not a.is_leader and b.is_leader
        assert last_renewal + DEADLINE - 0.1 < stopped < last_renewal + LEASE
        assert stopped < took_over

    asyncio.run(main())


def test_a_standby_whose_call_hangs_tries_again():
    store = Store()
    api, b = replica(store, "b")
    api.fault = "hang"

    async def main() -> None:
        standby = asyncio.create_task(b.acquire())
        try:
            await until(lambda: api.timeouts)
            api.fault = None
            await asyncio.wait_for(standby, DEADLINE + 1)
        finally:
            api.unblock.set()
            standby.cancel()
        assert b.is_leader and store.commit_times("b")

    asyncio.run(main())


def test_a_leader_that_starts_holding_late_renews_before_its_deadline():
    store = Store()
    a = LeaderElector(FakeLeases(store), LeaseConfig("ns", "lease", "a", lease_seconds=LEASE,
                                                     renew_deadline_seconds=DEADLINE, renew_seconds=0.3,
                                                     retry_seconds=0.2))

    async def main() -> None:
        await asyncio.wait_for(a.acquire(), 5)
        await asyncio.sleep(DEADLINE - 0.25)  # the rest of a slow winning round before hold() starts
        holding = asyncio.create_task(a.hold())
        try:
            await until(lambda: len(store.commit_times("a")) >= 3 or holding.done())
        finally:
            holding.cancel()
        assert a.is_leader and len(store.commit_times("a")) >= 3

    asyncio.run(main())


class Deployments:
    """A Kube's AppsV1Api that records when each patch was sent and how long it was let take."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, float]] = []  # (monotonic time, timeout)

    def patch_namespaced_deployment(self, name, namespace, body, **kwargs):
        self.sent.append((time.monotonic(), kwargs["_request_timeout"]))
        return types.SimpleNamespace(data=b"{}")


def test_a_leader_that_cannot_renew_sends_no_write_that_could_land_after_a_standby_takes_over(monkeypatch):
    """Its writes run in threads that stopping does not interrupt: each is sent only with time left before a standby
    could lead, and may take no longer than that; then none is sent at all."""
    monkeypatch.setattr(kube_module, "WRITE_MARGIN", 0.1)
    store = Store()
    api_a, a = replica(store, "a")
    _, b = replica(store, "b")
    kube = Kube(client.ApiClient(), OperatorMetrics())
    kube.apps = deployments = Deployments()  # type: ignore[assignment]
    kube.write_seconds_left = a.write_seconds_left
    refused: list[float] = []

    async def writes() -> None:
        while True:
            try:
                await asyncio.to_thread(kube.patch_deployment, "ns", "llm", {})
            except NotLeading:
                refused.append(time.monotonic())
            await asyncio.sleep(0.01)

    async def main() -> None:
        assert a.write_seconds_left() == 0.0  # not leading yet
        await asyncio.wait_for(a.acquire(), 5)
        holding = asyncio.create_task(a.hold())
        writing = asyncio.create_task(writes())
        await until(lambda: len(store.commit_times("a")) >= 3)
        api_a.fault = "error"
        try:
            await asyncio.wait_for(b.acquire(), 2 * LEASE + 1)
        finally:
            writing.cancel()
            holding.cancel()
        took_over = store.commit_times("b")[0]
        assert deployments.sent and refused and refused[0] < took_over
        assert max(at + timeout for at, timeout in deployments.sent) < took_over
        assert min(timeout for _, timeout in deployments.sent) > 0

    asyncio.run(main())
