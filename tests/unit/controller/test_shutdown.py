"""Stopping: a replica acts only while it holds the Lease, and lets go of it only once it has stopped acting."""

from __future__ import annotations

import asyncio

from vllm_autotuner.controller.operator import _unless_stopped, wind_down


class Lease:
    """Stands in for ``LeaderElector.hold``: renews until lost (the task returns) or cancelled (released)."""

    def __init__(self) -> None:
        self.lost = asyncio.Event()
        self.renewing = True

    async def hold(self) -> None:
        try:
            await self.lost.wait()
        finally:
            self.renewing = False


def test_a_replica_that_loses_the_lease_while_stopping_cancels_the_writes_in_flight() -> None:
    async def scenario() -> list[str]:
        lease, writes = Lease(), []

        async def evaluation() -> None:
            await asyncio.sleep(0.05)
            lease.lost.set()  # the renew deadline passes while this evaluation still runs
            await asyncio.sleep(0.05)
            writes.append("patch")  # a standby may lead by now

        holding = asyncio.create_task(lease.hold())
        assert await wind_down([asyncio.create_task(evaluation())], holding)
        return writes

    assert asyncio.run(scenario()) == []


def test_a_replica_stopped_while_leading_renews_until_its_evaluations_finish() -> None:
    async def scenario() -> tuple[bool, list[bool]]:
        lease, renewing_at_write = Lease(), []

        async def evaluation() -> None:
            await asyncio.sleep(0.05)
            renewing_at_write.append(lease.renewing)

        holding = asyncio.create_task(lease.hold())
        lost = await wind_down([asyncio.create_task(evaluation())], holding)
        assert holding.cancelled() and not lease.renewing  # let go, for the caller to release
        return lost, renewing_at_write

    assert asyncio.run(scenario()) == (False, [True])


def test_a_lease_lost_before_stopping_cancels_everything_at_once() -> None:
    async def scenario() -> bool:
        lease = Lease()
        lease.lost.set()
        holding = asyncio.create_task(lease.hold())
        await asyncio.sleep(0)
        forever = asyncio.create_task(asyncio.Event().wait())
        lost = await wind_down([forever], holding)
        return lost and forever.cancelled()

    assert asyncio.run(scenario())


def test_a_standby_told_to_stop_stops_waiting_for_the_lease_and_a_leader_in_the_making_finishes() -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        stop, waited = asyncio.Event(), []

        async def acquire(lead: asyncio.Event) -> None:
            try:
                await lead.wait()
            finally:
                waited.append(lead.is_set())

        stop.set()  # SIGTERM while another replica leads: the wait for the Lease ends there
        standby = await _unless_stopped(acquire(asyncio.Event()), stop)
        won = asyncio.Event()
        won.set()
        leader = await _unless_stopped(acquire(won), asyncio.Event())
        return standby, leader, waited == [False, True]

    assert asyncio.run(scenario()) == (False, True, True)
