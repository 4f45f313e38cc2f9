"""The windows of our own rollout measure what the restart costs.

During a rolling restart of ours ``decide`` holds, but the windows it is
given count the goodput the restart loses (``lastRollout.lostSeconds``,
which prices the next change). The window then takes every pod of the
Deployment that still reports, the old revision's and the new one's:
the new ReplicaSet's pods alone are too few, and refusing the window as
partial would leave the restart's cost unmeasured. So do the windows after
the rollout that still reach back into it. What our rollout is, too: a
template someone else changed during it (an image bump) rolls out their
change, whose outcome is theirs, while an autoscaler's scaling leaves it
ours. The reconciler is
driven here with a stand-in for the API server calls and the Prometheus
window; what it reads and writes is the real code's.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from vllm_autotuner.api import ConditionType, KnobSource, RolloutPhase
from vllm_autotuner.api.types import utc_timestamp
from vllm_autotuner.controller import events
from vllm_autotuner.controller.cache import ClusterCache, deployment_index, replicaset_index
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler
from vllm_autotuner.observe.window import WindowData
from vllm_autotuner.policy import HoldReason
from vllm_autotuner.rollout.progress import template_record

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
OLD, NEW = ("llm", "llama-6c9d-x2x4q"), ("llm", "llama-7f8b-k9j2w")


#: The tuning's metadata, in the cache as in the apiserver.
TUNING_META = {"name": "llama", "namespace": "llm", "uid": "t-uid", "generation": 1}


class Kube:
    """The API calls an evaluation of a rollout in progress makes: the new ReplicaSet's pods, and the tuning read
    again before a patch."""

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return []

    def read_tuning(self, namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": dict(TUNING_META)}


class Windows:
    """Prometheus' answer for the window, with the matchers, the end and the reach it was asked with."""

    def __init__(self, data: WindowData) -> None:
        self.data = data
        self.asked: list[tuple[Any, ...]] = []
        self.ends: list[datetime] = []
        self.reaches: list[int | None] = []

    async def window(self, connection, selector, window_seconds, at, extra=(),  # noqa: ANN001, ANN201
                     reach_seconds=None):  # noqa: ANN001
        self.asked.append(extra)
        self.ends.append(datetime.fromtimestamp(at, UTC))
        self.reaches.append(reach_seconds)
        return self.data


def replicaset(name: str, revision: str, ready: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "llm", "uid": f"{name}-uid", "ownerReferences": [{"uid": "d-uid"}],
                         "labels": {"pod-template-hash": name.rsplit("-", 1)[1]},
                         "annotations": {"deployment.kubernetes.io/revision": revision}},
            "status": {"replicas": ready, "readyReplicas": ready, "availableReplicas": ready}}


def cache(finished: timedelta | None = None, settle: str | None = None) -> ClusterCache:
    """A 2-replica Deployment halfway through our rollout to 4096 tokens and 64 sequences, or with the rollout
    ``finished`` that long ago; ``settle``: the tuning's settle time, if not the default."""
    args = ["--model", "m", "--max-num-batched-tokens", "4096", "--max-num-seqs", "64"]
    deployment = {
        "metadata": {"name": "llama", "namespace": "llm", "uid": "d-uid", "generation": 2,
                     "annotations": {"deployment.kubernetes.io/revision": "2"}},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "llama"}}, "template": {"spec": {"containers": [
            {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": args,
             "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}},
        "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2 if finished else 1,
                   "availableReplicas": 2 if finished else 1},
    }
    replicasets: dict[Any, list[dict[str, Any]]] = {}
    for body in (replicaset("llama-6c9d", "1", 0 if finished else 1), replicaset("llama-7f8b", "2", 2 if finished else 0)):
        for key, value in replicaset_index("llm", body).items():
            replicasets.setdefault(key, []).append(value)
    started = NOW - timedelta(minutes=3)
    rollout = {"from": {"maxNumBatchedTokens": 2048, "maxNumSeqs": 32},
               "to": {"maxNumBatchedTokens": 4096, "maxNumSeqs": 64},
               "source": "Traffic", "reason": "TTFT", "startedAt": utc_timestamp(started), "phase": "InProgress",
               "deploymentGeneration": 2, "progressedAt": utc_timestamp(NOW - timedelta(seconds=30)),
               "progressMark": 1, "baselineAttainment": 0.95}
    current = {"maxNumBatchedTokens": 2048, "maxNumSeqs": 32, "since": utc_timestamp(NOW - timedelta(hours=2)),
               "source": "Initial"}
    if finished is not None:
        rollout.update(phase="Succeeded", finishedAt=utc_timestamp(NOW - finished))
        current.update(maxNumBatchedTokens=4096, maxNumSeqs=64, since=utc_timestamp(NOW - finished), source="Traffic")
    tuning = {"metadata": dict(TUNING_META),
              "spec": {"targetRef": {"name": "llama"}, "prometheus": {"url": "http://prometheus:9090"},
                       **({"rollout": {"settleTime": settle}} if settle else {})},
              "status": {"observedGeneration": 1, "lastRollout": rollout, "targetUid": "d-uid", "current": current}}
    result = ClusterCache()
    result.bind({k: [v] for k, v in deployment_index("llm", "llama", deployment).items()}, replicasets)
    result.on_tuning_event(None, tuning)
    return result


def window(pods: tuple[tuple[str, str], ...]) -> WindowData:
    """Five minutes in which the pods of the restart answer half their requests within the 2 s TTFT target."""
    data = WindowData(at=NOW.timestamp(), window_seconds=300.0)
    for key, value in (("requests", 2.0), ("completed", 2.0), ("output_len_sum", 400.0), ("output_len_count", 2.0),
                       ("last_seen", NOW.timestamp() - 5)):
        data.values[key] = {pod: value for pod in pods}
    ttft = {1.0: 50.0, 2.0: 100.0, 8.0: 200.0, math.inf: 200.0}
    itl = {0.05: 1000.0, 0.1: 1000.0, math.inf: 1000.0}
    for key, buckets in (("ttft", ttft), ("itl", itl)):
        data.buckets[key] = {pod: dict(buckets) for pod in pods}
    return data


def evaluate(windows: Windows, naive: bool = False, finished: timedelta | None = None,
             settle: str | None = None) -> Any:
    reconciler = Reconciler(Kube(), cache(finished, settle), windows, OperatorMetrics(),  # type: ignore[arg-type]
                            OperatorSettings(naive_queries=naive))
    report = asyncio.run(reconciler.evaluate(("llm", "llama"), NOW.timestamp(), write=False))
    assert report is not None and report.decision is not None
    return report


def test_our_rollout_windows_count_what_the_restart_loses_over_both_revisions() -> None:
    report = evaluate(Windows(window((OLD, NEW))))
    rollout = report.state.last_rollout
    assert rollout.phase == "InProgress" and report.decision.hold == "RolloutInProgress"
    # half the requests in time against 95 % before: 0.45 of the 30 s evaluation interval lost
    assert rollout.lost_seconds == pytest.approx(0.45 * 30)
    available = next(c for c in report.state.conditions if c.type == "MetricsAvailable")
    assert available.reason == "WindowObserved" and available.message.startswith("2 pods")


def test_naive_queries_ask_for_every_revision_of_the_deployment() -> None:
    windows = Windows(window((OLD, NEW)))
    evaluate(windows, naive=True)
    assert windows.asked == [(("namespace", "=", "llm"), ("pod", "=~", "(llama-6c9d-.*|llama-7f8b-.*)"))]


def test_windows_reaching_back_into_our_finished_rollout_count_both_revisions_too() -> None:
    windows = Windows(window((OLD, NEW)))
    report = evaluate(windows, naive=True, finished=timedelta(seconds=10))  # within the 300 s window
    rollout = report.state.last_rollout
    assert rollout.phase == "Succeeded" and rollout.lost_seconds == pytest.approx(0.45 * 30)
    assert windows.asked == [(("namespace", "=", "llm"), ("pod", "=~", "(llama-6c9d-.*|llama-7f8b-.*)"))]
    assert report.decision.hold == "MixedConfig"  # several configs served it: no evidence for a decision


def test_the_window_ends_the_query_offset_before_the_evaluation_and_is_judged_by_its_own_span() -> None:
    # queryOffset (2 s by default): the window is [NOW - 302 s, NOW - 2 s], so a rollout finished 301 s before
    # the evaluation is inside it, and both revisions served it
    windows = Windows(window((OLD, NEW)))
    report = evaluate(windows, naive=True, finished=timedelta(seconds=301))
    assert windows.ends == [NOW - timedelta(seconds=2)]
    assert windows.asked == [(("namespace", "=", "llm"), ("pod", "=~", "(llama-6c9d-.*|llama-7f8b-.*)"))]
    assert report.decision.hold == "MixedConfig"


def test_server_starts_are_looked_for_as_far_back_as_the_settle_time_before_the_window() -> None:
    # without `_created` gauges a restart shows only over the span queried: with the 5m window, a window before it
    # (600 s back) covers the default 2m settle time; a 10m settle time needs 900 s, or a pod restarted 12 minutes
    # ago would count in a window that starts only 7 minutes after it
    for settle, back in ((None, 600), ("10m", 900)):
        windows = Windows(window((NEW,)))
        evaluate(windows, finished=timedelta(hours=1), settle=settle)
        assert windows.reaches == [back]


def test_windows_after_our_rollout_take_the_current_revision_only() -> None:
    windows = Windows(window((NEW, ("llm", "llama-7f8b-p4q7z"))))
    report = evaluate(windows, naive=True, finished=timedelta(minutes=6))
    assert windows.asked == [(("namespace", "=", "llm"), ("pod", "=~", "(llama-7f8b-.*)"))]
    assert report.decision.hold == "NotSettled"


def test_a_deployment_watched_before_our_own_write_lands_is_not_judged() -> None:
    """The watch lags (reconnecting): the evaluation after our write to 4096/64 (generation 2) still sees
    generation 1, with the old knobs. Read as it is, that is a person's revert of our change, adopted as Manual, and
    our rollout no longer followed (a config that crash-loops would never be rolled back): nothing is judged."""
    behind = cache()
    deployment = behind.deployment("llm", "llama")
    assert deployment is not None
    deployment["metadata"]["generation"] = 1
    deployment["status"].update(observedGeneration=1, updatedReplicas=2, availableReplicas=2)
    deployment["spec"]["template"]["spec"]["containers"][0]["args"] = [
        "--model", "m", "--max-num-batched-tokens", "2048", "--max-num-seqs", "32"]
    reconciler = Reconciler(Kube(), behind, Windows(window((OLD, NEW))), OperatorMetrics(),  # type: ignore[arg-type]
                            OperatorSettings())
    report = asyncio.run(reconciler.evaluate(("llm", "llama"), NOW.timestamp(), write=False))
    assert report is not None and report.decision is None
    assert report.has(ConditionType.READY, False, events.WATCH_BEHIND)
    assert [reason for reason, _, _ in report.events] == [events.WATCH_BEHIND]
    rollout, current = report.state.last_rollout, report.state.current
    assert rollout is not None and rollout.phase == RolloutPhase.IN_PROGRESS and not report.state.reverts
    assert current is not None and current.source == KnobSource.INITIAL


#: A pod of the new ReplicaSet whose vLLM crash-loops since 30 s before NOW.
CRASHING = {"metadata": {"name": NEW[1], "ownerReferences": [{"kind": "ReplicaSet", "uid": "llama-7f8b-uid"}]},
            "status": {"containerStatuses": [{
                "name": "vllm", "restartCount": 3, "ready": False, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"reason": "Error", "exitCode": 1, "message": "not enough KV cache",
                                             "finishedAt": utc_timestamp(NOW - timedelta(seconds=30))}}}]}}
#: The apiserver's answer to a patch: its template is not read back in these tests.
PATCHED = {"metadata": {"generation": 3}, "spec": {"template": {}}}


class Crashing(Kube):
    """The new ReplicaSet's pod crash-loops; the patches written (a rollback) are kept."""

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return [CRASHING]

    def patch_deployment(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(patch)
        return PATCHED


def rolling_back(kube: Kube, tunings: ClusterCache) -> Reconciler:
    """A reconciler over ``tunings`` whose rollback reads no ReplicaSet's template (a rollback by a new template)."""
    reconciler = Reconciler(kube, tunings, Windows(window((OLD, NEW))), OperatorMetrics(),  # type: ignore[arg-type]
                            OperatorSettings())

    async def no_replicaset_template(target: Any) -> None:
        return None

    reconciler._replaced_template = no_replicaset_template  # type: ignore[method-assign]
    return reconciler


def test_a_second_tuning_of_the_target_stops_changes_but_not_the_rollback_of_our_crash_looping_rollout() -> None:
    """A copy of the tuning (a GitOps duplicate) appears while our rollout's new pod crash-loops: neither tuning may
    change the Deployment, but the rollout already made is still judged and rolled back (the config was ours)."""
    both = cache()
    both.deployment("llm", "llama")["metadata"]["resourceVersion"] = "7"  # type: ignore[index]
    both.on_tuning_event(None, {"metadata": {"name": "llama-copy", "namespace": "llm", "generation": 1},
                                "spec": {"targetRef": {"name": "llama"}, "prometheus": {"url": "http://p:9090"}}})
    kube = Crashing()
    reconciler = rolling_back(kube, both)
    ours = asyncio.run(reconciler.evaluate(("llm", "llama"), NOW.timestamp(), write=False))
    assert ours is not None and ours.has(ConditionType.READY, False, events.TARGET_CONFLICT)
    assert [patch["spec"]["template"]["spec"]["containers"][0]["args"] for patch in kube.patches] == [
        ["--model", "m", "--max-num-batched-tokens", "2048", "--max-num-seqs", "32"]]
    assert [(f.max_num_batched_tokens, f.max_num_seqs) for f in ours.state.failed_configs] == [(4096, 64)]
    copy = asyncio.run(reconciler.evaluate(("llm", "llama-copy"), NOW.timestamp(), write=False))
    assert copy is not None and copy.has(ConditionType.READY, False, events.TARGET_CONFLICT)
    assert len(kube.patches) == 1 and copy.state.current is None  # the copy neither changes nor adopts anything


def test_a_rollout_someone_paused_half_way_times_no_restart() -> None:
    """`kubectl rollout pause` half way through our rollout, resumed three hours later: its duration counts the
    pause, no restart's length, so the rolloutSeconds timed before it stands (else the next pre-roll and freeze lead
    would start three hours early, and every restart be priced at three hours)."""
    key = ("llm", "llama")
    halfway = cache()
    halfway.tunings[key]["status"]["rolloutSeconds"] = 240.0
    deployment = halfway.deployment(*key)
    deployment["spec"]["paused"] = True
    deployment["status"]["conditions"] = [{"type": "Progressing", "status": "Unknown", "reason": "DeploymentPaused"}]
    reconciler = Reconciler(Kube(), halfway, Windows(window((OLD, NEW))), OperatorMetrics(),  # type: ignore[arg-type]
                            OperatorSettings())
    report = asyncio.run(reconciler.evaluate(key, NOW.timestamp(), write=False))
    assert report is not None and report.has(ConditionType.READY, False, events.TARGET_PAUSED)
    assert report.state.last_rollout.halted_at == utc_timestamp(NOW)
    paused = report.state.model_dump(by_alias=True, mode="json")  # as its status write leaves it
    for halted in (False, True):  # completed three hours later: its pause unseen (a control), and seen
        resumed = cache(finished=timedelta(seconds=1))  # its Deployment and ReplicaSets, that is
        resumed.tunings[key]["status"] = paused if halted else halfway.tunings[key]["status"]
        reconciler = Reconciler(Kube(), resumed, Windows(window((OLD, NEW))),  # type: ignore[arg-type]
                                OperatorMetrics(), OperatorSettings())
        report = asyncio.run(reconciler.evaluate(key, (NOW + timedelta(hours=3)).timestamp(), write=False))
        assert report is not None and report.state.last_rollout.phase == RolloutPhase.SUCCEEDED
        assert report.state.rollout_seconds == (240.0 if halted else 3 * 3600 + 180.0)



def test_a_rollout_paused_only_once_it_completed_is_timed() -> None:
    """A rollout that completed at its own pace, its Deployment paused before the next evaluation saw it (a CD tool
    that pauses it to batch its own edits): no halt ran in it, so it times the restart."""
    key = ("llm", "llama")
    done = cache(finished=timedelta(seconds=1))
    done.tunings[key]["status"] = cache().tunings[key]["status"]  # our rollout in progress, as last written
    done.tunings[key]["status"]["rolloutSeconds"] = 240.0
    done.deployment(*key)["spec"]["paused"] = True
    reconciler = Reconciler(Kube(), done, Windows(window((OLD, NEW))), OperatorMetrics(),  # type: ignore[arg-type]
                            OperatorSettings())
    report = asyncio.run(reconciler.evaluate(key, (NOW + timedelta(minutes=2)).timestamp(), write=False))
    assert report is not None and report.state.last_rollout.phase == RolloutPhase.SUCCEEDED
    assert report.state.last_rollout.halted_at is None and report.state.rollout_seconds == 300.0


def during_our_rollout(change: Callable[[dict[str, Any]], None], done: bool, digest: bool = True) -> ClusterCache:
    """``cache()``, our rollout in progress recorded with the digest of the template our patch left (not where
    ``digest`` is False: a status written before it was), and the Deployment then edited by ``change`` (a new
    generation), the Deployment controller caught up with the edit, its rollout ``done`` or half way. The
    ReplicaSets stay as ``cache()`` has them, llama-7f8b the newest."""
    result = cache()
    deployment = result.deployment("llm", "llama")
    assert deployment is not None
    if digest:
        result.tunings["llm", "llama"]["status"]["lastRollout"]["templateDigest"] = template_record(deployment)
    change(deployment)
    deployment["metadata"].update(generation=3, resourceVersion="7")
    replicas = deployment["spec"]["replicas"]
    deployment["status"].update(observedGeneration=3, replicas=replicas, updatedReplicas=replicas if done else 1,
                                availableReplicas=replicas if done else 1)
    return result


def image_bump(deployment: dict[str, Any]) -> None:
    """A CD tool's new image for the vLLM container, our knobs left in its args."""
    deployment["spec"]["template"]["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v0.12.0"


def hpa_scale(deployment: dict[str, Any]) -> None:
    """An autoscaler's scale-up (the scale subresource): spec.replicas, and so the generation, but no template."""
    deployment["spec"]["replicas"] = 3


def judged(changed: ClusterCache, kube: Kube) -> Any:
    """An evaluation at NOW of the tuning in ``changed``."""
    report = asyncio.run(rolling_back(kube, changed).evaluate(("llm", "llama"), NOW.timestamp(), write=False))
    assert report is not None
    return report


def test_an_image_bump_during_our_rollout_that_crash_loops_is_theirs_not_our_configs_failure() -> None:
    """A CD tool bumps the image while our rollout to 4096/64 runs, and the new pods (their image, our knobs)
    crash-loop: the template is no longer the one our patch left, so its outcome is theirs. 4096/64 is not recorded
    as failed (it would never be tried again), nothing is rolled back (a restart that would not help), and the
    status and an Event say why; changes wait while their rollout runs, as for any rollout not ours."""
    kube = Crashing()
    report = judged(during_our_rollout(image_bump, done=False), kube)
    rollout, current = report.state.last_rollout, report.state.current
    assert kube.patches == [] and report.state.failed_configs == [] and report.finished == []
    assert rollout.phase == RolloutPhase.FAILED and rollout.finished_at == utc_timestamp(NOW)
    assert "changed by someone else during this rollout (at generation 3" in rollout.message
    assert [reason for reason, _, _ in report.events] == [events.ROLLOUT_OVERTAKEN]
    assert rollout.message in report.events[0][1]
    assert (current.max_num_batched_tokens, current.max_num_seqs) == (4096, 64)  # as the template has them
    assert report.decision.hold == HoldReason.ROLLOUT_IN_PROGRESS and "did not start" in report.decision.reason
    assert not report.has(ConditionType.DEGRADED, True, events.ROLLOUT_FAILED)


def test_an_image_bump_during_our_rollout_that_completes_is_not_timed_as_our_restart() -> None:
    """The same bump, its rollout complete: how long it took counts their restart too, so it is no measure of
    ours (rolloutSeconds prices every later restart), and it is no success of 4096/64 to check for a regression."""
    report = judged(during_our_rollout(image_bump, done=True), Kube())
    rollout = report.state.last_rollout
    assert report.state.rollout_seconds is None and report.finished == []
    assert rollout.phase == RolloutPhase.FAILED and rollout.message.startswith("the Deployment's pod template was")
    assert [reason for reason, _, _ in report.events] == [events.ROLLOUT_OVERTAKEN]


def test_an_autoscaler_scaling_during_our_rollout_leaves_it_ours() -> None:
    """An HPA scales the Deployment up during our rollout: a new generation, the same template. The rollout is
    still ours, timed when it completes."""
    report = judged(during_our_rollout(hpa_scale, done=True), Kube())
    assert report.state.last_rollout.phase == RolloutPhase.SUCCEEDED and report.state.rollout_seconds == 180.0
    assert [verdict.outcome for verdict in report.finished] == ["Succeeded"]


def test_a_rollout_recorded_without_a_template_digest_is_judged_as_before() -> None:
    """A rollout an operator before the digest started: every template with its knobs is judged as its rollout, a
    crash loop failing its config and rolling it back, as it was. The rollback records the digest of its own
    patch, so a change of the template during it is told apart."""
    kube = Crashing()
    report = judged(during_our_rollout(image_bump, done=False, digest=False), kube)
    assert [(f.max_num_batched_tokens, f.max_num_seqs) for f in report.state.failed_configs] == [(4096, 64)]
    assert len(kube.patches) == 1 and [verdict.outcome for verdict in report.finished] == ["Failed"]
    rollback = report.state.last_rollout
    assert rollback.source == KnobSource.ROLLBACK and rollback.template_digest == template_record(PATCHED)


def restart(deployment: dict[str, Any]) -> None:
    """``kubectl rollout restart``: the pod template stamped with the time, nothing else of it changed."""
    metadata = deployment["spec"]["template"].setdefault("metadata", {})
    metadata.setdefault("annotations", {})["kubectl.kubernetes.io/restartedAt"] = utc_timestamp(NOW)


def test_a_restart_during_our_crash_looping_rollout_leaves_it_ours_failed_and_rolled_back() -> None:
    """A person restarts our rollout to 4096/64, whose new pod crash-loops (`kubectl rollout restart`): the new pods
    run the template our patch left, only stamped, so the crash loop is still our config's: 4096/64 fails and is
    rolled back, as without the restart, rather than left crash-looping with no verdict."""
    kube = Crashing()
    report = judged(during_our_rollout(restart, done=False), kube)
    assert [(f.max_num_batched_tokens, f.max_num_seqs) for f in report.state.failed_configs] == [(4096, 64)]
    assert len(kube.patches) == 1 and [verdict.outcome for verdict in report.finished] == ["Failed"]
    assert events.ROLLOUT_OVERTAKEN not in [reason for reason, _, _ in report.events]


def test_a_digest_left_by_an_earlier_rollout_is_not_this_rollouts() -> None:
    """Our rollout to 4096/64 was written by an operator before the digest (a downgrade), over a status whose
    lastRollout an operator with it wrote for an earlier rollout: the merge patch of the older operator, which does
    not know the field, left that rollout's digest. It is no record of this rollout's template, so the crash loop is
    judged as before, failed and rolled back, not taken for someone else's change."""
    stale = cache()
    stale.deployment("llm", "llama")["metadata"]["resourceVersion"] = "7"  # type: ignore[index]
    earlier = {"metadata": {"generation": 1}, "spec": {"template": {"spec": {"containers": []}}}}
    stale.tunings["llm", "llama"]["status"]["lastRollout"]["templateDigest"] = template_record(earlier)
    kube = Crashing()
    report = judged(stale, kube)
    assert [(f.max_num_batched_tokens, f.max_num_seqs) for f in report.state.failed_configs] == [(4096, 64)]
    assert len(kube.patches) == 1 and [verdict.outcome for verdict in report.finished] == ["Failed"]


def test_a_digest_naming_no_generation_is_judged_as_no_digest() -> None:
    """A digest without the generation it is of cannot tell this rollout's from an earlier one's: read as no
    record, the rollout is judged as before (an image bump during it does not take the crash loop's verdict
    away), not closed as overtaken."""
    bare = during_our_rollout(image_bump, done=False)
    rollout = bare.tunings["llm", "llama"]["status"]["lastRollout"]
    rollout["templateDigest"] = rollout["templateDigest"].partition(":")[2]
    kube = Crashing()
    report = judged(bare, kube)
    assert [(f.max_num_batched_tokens, f.max_num_seqs) for f in report.state.failed_configs] == [(4096, 64)]
    assert len(kube.patches) == 1 and [verdict.outcome for verdict in report.finished] == ["Failed"]
    assert events.ROLLOUT_OVERTAKEN not in [reason for reason, _, _ in report.events]


def test_a_template_change_after_our_rollout_was_judged_failed_leaves_its_rollback_to_be_tried_again() -> None:
    """Our rollout to 4096/64 was judged Failed, but its rollback could not be written (a verdict kept in the
    rollout's message), and then a CD tool bumps the image, our knobs left in: the verdict came before their
    change, so the rollback is tried again rather than the crash-looping config left live with no verdict."""
    judged_before = during_our_rollout(image_bump, done=False)
    judged_before.tunings["llm", "llama"]["status"]["lastRollout"]["message"] = (
        f"{events.ROLLOUT_FAILED}: tokens=4096 seqs=64 failed: not enough KV cache")
    kube = Crashing()
    report = judged(judged_before, kube)
    assert len(kube.patches) == 1 and report.state.last_rollout.source == KnobSource.ROLLBACK
    assert events.ROLLOUT_OVERTAKEN not in [reason for reason, _, _ in report.events]
