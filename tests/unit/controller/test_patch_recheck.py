"""Before a patch of its target the tuning is read again from the apiserver: the watch's copy may be one deleted
(kopf's re-list after a watch outage brings no DELETED event for it), created anew or edited meanwhile. The
reconciler is driven with the stand-ins of ``test_track_rollout``."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from tests.unit.controller import test_track_rollout as harness
from tests.unit.test_rollout_pure import merge
from urllib3.exceptions import ReadTimeoutError

from vllm_autotuner.api import DecisionAction, KnobSource
from vllm_autotuner.controller import events
from vllm_autotuner.controller.cache import ClusterCache
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler, Report
from vllm_autotuner.policy.decision import Decision, with_rollout
from vllm_autotuner.rollout.patch import written_baseline

META = {"name": harness.TUNING, "namespace": "default", "uid": harness.TUNING_UID, "generation": 1}


class Kube(harness.Kube):
    """The tuning as the apiserver has it now: ``live`` (its metadata), or an error for the read."""

    def __init__(self, pods: list[dict[str, Any]], live: dict[str, Any] | Exception) -> None:
        super().__init__(pods)
        self.live = live

    def read_tuning(self, namespace: str, name: str) -> dict[str, Any]:
        if isinstance(self.live, Exception):
            raise self.live
        return {"metadata": self.live}


def cached() -> ClusterCache:
    cache = ClusterCache()
    cache.on_tuning_event(None, {"metadata": dict(META), "spec": {"targetRef": {"name": "llama"}}})
    return cache


def rollback(live: dict[str, Any] | Exception) -> tuple[Report, Kube, ClusterCache]:
    """Our unverified config found crash-looping at a scale-up, its rollback due, with the tuning read as ``live``."""
    state, written = harness.unverified_at_zero()
    up = harness.T0 + timedelta(hours=3)
    kube = Kube([harness.crash_looping("ValueError: not enough KV cache", up + timedelta(minutes=1))], live)
    cache = cached()
    report = harness.track(state, harness.scaled(written, 1, 1, 0), up + timedelta(minutes=2), kube, cache=cache)
    return report, kube, cache


def patch_failed(report: Report) -> tuple[str, str]:
    (message, type_), = [(message, type_) for reason, message, type_ in report.events
                         if reason == events.PATCH_FAILED]
    return message, type_


def test_a_tuning_deleted_while_the_watch_was_down_patches_nothing_and_is_forgotten() -> None:
    report, kube, cache = rollback(ApiException(status=404, reason="Not Found"))
    assert not kube.patches and list(cache.tunings) == []
    message, type_ = patch_failed(report)
    assert "was deleted" in message and type_ == events.NORMAL


@pytest.mark.parametrize(("live", "said"), [
    ({**META, "uid": "another"}, "created again"),
    ({**META, "deletionTimestamp": "2024-05-01T12:00:00Z"}, "is being deleted"),
    (ReadTimeoutError(None, "/apis", "read timed out"),
     "could not be read again before the patch (None: read timed out)"),
])
def test_a_tuning_created_anew_being_deleted_or_unreadable_patches_nothing(live: Any, said: str) -> None:
    report, kube, cache = rollback(live)
    assert not kube.patches and said in patch_failed(report)[0]
    assert list(cache.tunings) == ([] if "deleted" in said else [("default", harness.TUNING)])


def test_a_spec_edited_meanwhile_does_not_stop_the_rollback_of_our_failed_config() -> None:
    report, kube, cache = rollback({**META, "generation": 2})
    assert len(kube.patches) == 1 and [reason for reason, _, _ in report.events] == [
        events.ROLLOUT_FAILED, events.ROLLED_BACK]


@pytest.mark.parametrize(("generation", "patched"), [(1, True), (2, False)])
def test_a_change_decided_under_a_spec_since_edited_waits_for_the_new_spec(generation: int, patched: bool) -> None:
    state = harness.status(*harness.A.model_dump().values())
    deployment = harness.scaled(harness.deployment(harness.A), 1, 1, 1)  # its last rollout complete
    kube = Kube([], {**META, "generation": generation})
    now = harness.T0
    decided = with_rollout(state, now, harness.B, KnobSource.TRAFFIC, "TTFT", "chat", baseline_attainment=0.93,
                           baseline_request_rate=2.5)
    decision = Decision(DecisionAction.CHANGE, harness.B, "TTFT", decided, KnobSource.TRAFFIC)
    report = Report("default", harness.TUNING, decision.state, 1, now, uid=harness.TUNING_UID, decision=decision)
    reconciler = Reconciler(kube, cached(), None, OperatorMetrics(), OperatorSettings())  # type: ignore[arg-type]
    asyncio.run(reconciler._patch(harness.target_of(deployment, True), decision, report, state, during_rollout=False))
    assert bool(kube.patches) is patched is report.patched  # a change written is counted though its status is not
    assert (report.state.last_rollout is not None) is patched
    if patched:  # the baseline goes into the template with the change: a lost status write is recovered with it
        written = written_baseline(merge(deployment, kube.patches[0]))
        assert written == {"regime": "chat", "baseline_attainment": 0.93, "baseline_request_rate": 2.5}
    if not patched:
        assert "changed since it was read (generation 1, now 2)" in patch_failed(report)[0]
