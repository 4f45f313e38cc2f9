"""The operator's rollout slots: rollouts in progress hold them; waiting changes are served first come, first served."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from vllm_autotuner.rollout.slots import RolloutSlots

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
A, B, C = ("ns", "a"), ("ns", "b"), ("ns", "c")


def tunings(*keys, in_progress=()):
    return {k: {"status": {"lastRollout": {"phase": "InProgress"}}} if k in in_progress else {} for k in keys}


def test_without_a_limit_no_slot_is_ever_held():
    slots = RolloutSlots(0)
    slots.record(A, T0, rolling=True, waiting=False)
    assert slots.holders(B, tunings(A, B, in_progress=[A])) == []


def test_rollouts_of_other_tunings_hold_slots_by_what_was_seen_else_by_their_status():
    slots = RolloutSlots(2)
    everyone = tunings(A, B, C, in_progress=[B, C])
    slots.record(A, T0, rolling=True, waiting=False)
    slots.record(B, T0, rolling=False, waiting=False)  # finished since its status was read
    assert slots.holders(A, everyone) == ["ns/c (rolling out)"]  # by its status; not A's own
    assert slots.holders(C, everyone) == ["ns/a (rolling out)"]
    assert slots.holders(A, tunings(A, B)) == []  # C deleted: gone from the cache, it holds nothing


def test_a_change_that_waited_longer_goes_first_whatever_the_order_of_evaluation():
    slots = RolloutSlots(1)
    everyone = tunings(A, B, C)
    slots.record(A, T0, rolling=True, waiting=False)
    slots.record(C, T0, rolling=False, waiting=True)  # waits first
    slots.record(B, T0 + timedelta(minutes=1), rolling=False, waiting=True)
    slots.record(C, T0 + timedelta(minutes=2), rolling=False, waiting=True)  # still waiting: its place is kept
    slots.record(A, T0 + timedelta(minutes=3), rolling=False, waiting=False)  # the rollout is complete
    assert slots.holders(B, everyone) == ["ns/c (waiting since 2024-05-01T12:00:00Z)"]  # B, evaluated first, waits
    assert slots.holders(C, everyone) == []
    slots.record(C, T0 + timedelta(minutes=3), rolling=True, waiting=False)  # C took it
    assert slots.holders(B, everyone) == ["ns/c (rolling out)"]
    slots.record(C, T0 + timedelta(minutes=9), rolling=False, waiting=False)
    assert slots.holders(B, everyone) == []


def test_a_change_that_stops_waiting_or_a_deleted_tuning_leaves_the_queue():
    slots = RolloutSlots(1)
    everyone = tunings(A, B, C)
    slots.record(A, T0, rolling=False, waiting=True)
    slots.record(B, T0 + timedelta(minutes=1), rolling=False, waiting=True)
    assert len(slots.holders(B, everyone)) == 1
    slots.record(A, T0 + timedelta(minutes=2), rolling=False, waiting=False)  # e.g. a freeze opened, or Paused
    assert slots.holders(B, everyone) == []
    slots.record(A, T0 + timedelta(minutes=3), rolling=False, waiting=True)  # back: behind B now
    assert slots.holders(B, everyone) == []
    assert slots.holders(A, everyone) == ["ns/b (waiting since 2024-05-01T12:01:00Z)"]
    slots.forget(B)
    assert slots.holders(A, everyone) == []
