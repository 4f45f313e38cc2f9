"""The knob patch and the rollout-progress judgement, on Kubernetes-shaped objects."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

from vllm_autotuner.api import Knobs
from vllm_autotuner.api.types import utc_timestamp
from vllm_autotuner.controller.cache import deployment_index
from vllm_autotuner.rollout.patch import (
    KNOBS_ANNOTATION,
    TUNING_ANNOTATION,
    WRITTEN_AT_ANNOTATION,
    baseline_annotation,
    command_line_writer,
    knob_patch,
    template_engine_args,
    undo_patch,
    unrecorded_write,
    written_baseline,
    written_reason,
)
from vllm_autotuner.rollout.progress import (
    Progress,
    progress_deadline,
    progress_mark,
    rollout_in_progress,
    rollout_state,
    template_rolling,
    unavailable_at_once,
)

WRITTEN = datetime(2024, 5, 1, 12, 0, 30, 700_000, tzinfo=UTC)


def deployment(args, generation=3, status=None, annotations=None):
    return {
        "metadata": {"name": "llama", "resourceVersion": "42", "generation": generation},
        "spec": {
            "replicas": 2,
            "template": {
                "metadata": {"annotations": annotations or {}},
                "spec": {
                    "containers": [
                        {"name": "sidecar", "image": "envoy", "args": ["--port", "9"]},
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:v0.11.0",
                            "args": args,
                            "env": [{"name": "A", "value": "1"}],
                        },
                    ]
                },
            },
        },
        "status": status or {},
    }


def test_patch_touches_only_the_vllm_container_args_and_carries_the_resource_version():
    dep = deployment(["--model", "M", "--max-num-seqs", "64"])
    patch = knob_patch(dep, None, Knobs(max_num_batched_tokens=4096, max_num_seqs=128), "ITL breach", "chat", "Traffic",
                       WRITTEN)
    assert patch["metadata"] == {"resourceVersion": "42"}
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    assert container == {
        "name": "vllm",
        "args": ["--model", "M", "--max-num-seqs", "128", "--max-num-batched-tokens", "4096"],
    }
    annotations = patch["spec"]["template"]["metadata"]["annotations"]
    assert annotations[KNOBS_ANNOTATION] == "maxNumBatchedTokens=4096,maxNumSeqs=128"
    assert annotations[WRITTEN_AT_ANNOTATION] == "2024-05-01T12:00:30Z"  # the status's own format


def test_operator_written_knobs_are_recognised_and_manual_edits_are_not():
    knobs = Knobs(max_num_batched_tokens=4096, max_num_seqs=128)
    known = WRITTEN - timedelta(minutes=5)  # the latest change the status knows of
    ours = deployment(
        ["--max-num-seqs", "128"],
        annotations={KNOBS_ANNOTATION: "maxNumBatchedTokens=4096,maxNumSeqs=128", TUNING_ANNOTATION: "chat",
                     WRITTEN_AT_ANNOTATION: "2024-05-01T12:00:30Z"},
    )
    assert unrecorded_write(ours, knobs, "chat", known) == WRITTEN.replace(microsecond=0)
    assert not unrecorded_write(ours, Knobs(max_num_batched_tokens=4096, max_num_seqs=64), "chat", known)
    assert not unrecorded_write(ours, knobs, "chat-night", known)  # another tuning's change is not ours to resume
    assert template_engine_args(ours, "vllm").max_num_seqs == 128


def test_our_annotations_put_back_from_an_older_revision_are_not_a_write_of_ours():
    knobs = Knobs(max_num_batched_tokens=4096, max_num_seqs=128)
    annotations = {KNOBS_ANNOTATION: "maxNumBatchedTokens=4096,maxNumSeqs=128", TUNING_ANNOTATION: "chat"}
    undone = deployment(["--max-num-seqs", "128"], annotations={**annotations,
                                                                 WRITTEN_AT_ANNOTATION: "2024-05-01T12:00:30Z"})
    assert not unrecorded_write(undone, knobs, "chat", WRITTEN + timedelta(hours=1))  # `kubectl rollout undo`
    assert not unrecorded_write(undone, knobs, "chat", WRITTEN.replace(microsecond=0))  # the very rollout we know
    # written by an operator that did not stamp its writes, or stamped by hand: a lost write cannot be told apart
    for written_at in (None, "yesterday", "2024-05-01T12:00:30"):
        stamp = {} if written_at is None else {WRITTEN_AT_ANNOTATION: written_at}
        old = deployment(["--max-num-seqs", "128"], annotations={**annotations, **stamp})
        assert not unrecorded_write(old, knobs, "chat", WRITTEN - timedelta(hours=1)), written_at


def wrote(manager, operation, time, **containers):
    """A ``metadata.managedFields`` entry as the apiserver keeps it: ``manager``'s ``operation`` at ``time``, owning
    the replica count, and of each container named in ``containers`` the fields listed (``f:args``...)."""
    fields = {f'k:{{"name":"{name}"}}': {".": {}, "f:image": {}, "f:name": {}, **{f: {} for f in owned}}
              for name, owned in containers.items()}
    return {"manager": manager, "operation": operation, "apiVersion": "apps/v1", "time": time,
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}, "f:template": {"f:spec": {
                "f:containers": fields}}}}}


def test_who_last_wrote_the_vllm_command_line_is_read_from_the_write_history():
    created = wrote("OpenAPI-Generator", "Update", "2024-05-01T10:00:00Z", sidecar=["f:args"], vllm=["f:command"])
    ours = wrote("vllm-autotuner", "Update", "2024-05-01T12:00:30Z", vllm=["f:args"])
    edit = wrote("kubectl-edit", "Update", "2024-05-01T13:00:00Z", vllm=["f:args"])
    sidecar = wrote("kubectl-patch", "Update", "2024-05-01T14:00:00Z", sidecar=["f:args"])
    flux = wrote("kustomize-controller", "Apply", "2024-05-01T15:00:00Z", vllm=["f:args", "f:command"])

    def writer(*history):
        dep = deployment(["--max-num-seqs", "64"])
        dep["metadata"]["managedFields"] = list(history)
        return command_line_writer(dep, "vllm")

    assert writer(created, edit, sidecar) == "kubectl-edit"  # the newest owner of its args or command
    assert writer(flux, created, edit) == "kustomize-controller (server-side apply)"  # next apply puts it back
    assert writer(created, ours) is None  # the operator's own write
    assert writer(created) == "OpenAPI-Generator"  # its command, as created
    assert writer(sidecar) is None and writer() is None  # another container's args; no history kept


def test_the_cache_keeps_of_the_write_history_only_who_wrote_the_command_lines():
    dep = deployment(["--max-num-seqs", "64"])
    dep["metadata"]["managedFields"] = [
        wrote("kube-controller-manager", "Update", "2024-05-01T10:00:01Z"),
        wrote("kubectl-edit", "Update", "2024-05-01T13:00:00Z", vllm=["f:args"])]

    (cached,) = deployment_index("default", "llama", dep).values()

    (kept,) = cached["metadata"]["managedFields"]
    assert kept["manager"] == "kubectl-edit" and kept["fieldsV1"] == {"f:spec": {"f:template": {"f:spec": {
        "f:containers": {'k:{"name":"vllm"}': {"f:args": {}}}}}}}
    assert command_line_writer(cached, "vllm") == command_line_writer(dep, "vllm") == "kubectl-edit"
    del dep["metadata"]["managedFields"][1]
    (cached,) = deployment_index("default", "llama", dep).values()
    assert "managedFields" not in cached["metadata"]


def merge(dep, patch):
    """``dep`` with a patch of ``knob_patch``'s or ``undo_patch``'s shape merged in, as the apiserver's strategic
    merge does it (annotations and the container's fields set, None deleting)."""
    out = copy.deepcopy(dep)

    def put(into, values):
        for key, value in values.items():
            if value is None:
                into.pop(key, None)
            else:
                into[key] = value

    put(out["metadata"].setdefault("annotations", {}),
        {k: v for k, v in (patch["metadata"].get("annotations") or {}).items()})
    template = patch["spec"]["template"]
    put(out["spec"]["template"]["metadata"].setdefault("annotations", {}), template["metadata"]["annotations"])
    (fields,) = template["spec"]["containers"]
    put(next(c for c in out["spec"]["template"]["spec"]["containers"] if c["name"] == fields["name"]), fields)
    return out


def replicaset_template(dep):
    """The ReplicaSet's copy of ``dep``'s pod template: the Deployment controller adds the template hash label."""
    template = copy.deepcopy(dep["spec"]["template"])
    template["metadata"].setdefault("labels", {})["pod-template-hash"] = "7f8b"
    return template


def test_a_rollback_of_our_change_puts_back_the_replaced_template_exactly():
    a, b = Knobs(max_num_batched_tokens=2048, max_num_seqs=64), Knobs(max_num_batched_tokens=512, max_num_seqs=64)
    before = deployment(["--model", "M", "--max-num-batched-tokens=2K", "--max-num-seqs", "64"],
                        annotations={"team": "serving"})
    live = merge(before, knob_patch(before, None, b, "ITL breach", "chat", "Traffic", WRITTEN))
    assert live["spec"]["template"] != before["spec"]["template"]

    later = WRITTEN + timedelta(minutes=10)
    patch = undo_patch(live, None, replicaset_template(before), a, "512 failed", "chat", later, "RolloutFailed")

    assert patch is not None
    undone = merge(live, patch)
    assert undone["spec"]["template"] == before["spec"]["template"]  # the old ReplicaSet's: no new pods
    # only our stamps on the Deployment: the controller copies its annotations onto every later ReplicaSet, ours or
    # not, and a kubernetes.io/change-cause of ours would overwrite a manifest's (GitOps self-heal fights over it)
    assert all(key.startswith("autotuner.vllm-tuning.io/") for key in patch["metadata"]["annotations"])
    # a lost status write of the rollback is still told from a person's undo, and says which verdict it followed
    assert unrecorded_write(undone, a, "chat", WRITTEN) == later.replace(microsecond=0)
    assert written_reason(undone) == ("Rollback", "512 failed", "RolloutFailed")


def test_only_the_rollback_of_a_judged_rollout_carries_its_verdict():
    a, b = Knobs(max_num_batched_tokens=2048, max_num_seqs=64), Knobs(max_num_batched_tokens=512, max_num_seqs=64)
    before = deployment(["--max-num-batched-tokens", "512", "--max-num-seqs", "64"])
    back = merge(before, knob_patch(before, None, a, "512 could not start its pods", "chat", "Rollback", WRITTEN,
                                    "RolloutBlocked"))
    assert written_reason(back) == ("Rollback", "512 could not start its pods", "RolloutBlocked")

    later = merge(back, knob_patch(back, None, b, "ITL breach", "chat", "Traffic", WRITTEN + timedelta(hours=1)))

    assert written_reason(later) == ("Traffic", "ITL breach", "")  # the next change's stamp leaves none behind


def test_a_rollback_carries_what_went_wrong_beside_its_verdict_which_an_older_operator_reads_whole():
    a, b = Knobs(max_num_batched_tokens=2048, max_num_seqs=64), Knobs(max_num_batched_tokens=512, max_num_seqs=64)
    before = deployment(["--max-num-batched-tokens", "512", "--max-num-seqs", "64"])
    why = "pod x cannot be scheduled: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu"
    back = merge(before, knob_patch(before, None, a, "512 could not start its pods", "chat", "Rollback", WRITTEN,
                                    f"RolloutBlocked: {why}"))
    annotations = back["spec"]["template"]["metadata"]["annotations"]
    assert annotations["autotuner.vllm-tuning.io/verdict"] == "RolloutBlocked"  # as chart 0.5.55 compares it
    assert written_reason(back) == ("Rollback", "512 could not start its pods", f"RolloutBlocked: {why}")
    later = merge(back, knob_patch(back, None, b, "ITL breach", "chat", "Traffic", WRITTEN + timedelta(hours=1)))
    assert written_reason(later) == ("Traffic", "ITL breach", "")
    assert "autotuner.vllm-tuning.io/verdict-message" not in later["spec"]["template"]["metadata"]["annotations"]


def test_a_rollback_puts_back_the_baseline_of_the_template_it_restores_and_has_none_of_its_own():
    """A change's baseline is in the template: a rollback puts back the old template exactly (its ReplicaSet, no new
    pods), the baseline of the change that wrote it too, and its own stamp (newer, on the Deployment) has none."""
    a, b = Knobs(max_num_batched_tokens=2048, max_num_seqs=64), Knobs(max_num_batched_tokens=512, max_num_seqs=64)
    start = deployment(["--max-num-batched-tokens", "8192", "--max-num-seqs", "64"])
    older = merge(start, knob_patch(start, None, a, "TTFT", "chat", "Traffic", WRITTEN - timedelta(hours=1), None,
                                    baseline_annotation("chat", 0.9, 1.0)))
    live = merge(older, knob_patch(older, None, b, "ITL breach", "chat", "Traffic", WRITTEN, None,
                                   baseline_annotation("chat", 0.8, 2.0)))
    assert written_baseline(live) == {"regime": "chat", "baseline_attainment": 0.8, "baseline_request_rate": 2.0}
    patch = undo_patch(live, None, replicaset_template(older), a, "512 failed", "chat", WRITTEN + timedelta(minutes=5),
                       "RolloutFailed")
    assert patch is not None
    undone = merge(live, patch)
    assert undone["spec"]["template"] == older["spec"]["template"]
    assert written_baseline(undone) == {}


def test_a_rollback_puts_back_nothing_but_our_change():
    a, b = Knobs(max_num_batched_tokens=2048, max_num_seqs=64), Knobs(max_num_batched_tokens=512, max_num_seqs=64)
    before = deployment(["--max-num-batched-tokens", "2048", "--max-num-seqs", "64"])
    live = merge(before, knob_patch(before, None, b, "ITL breach", "chat", "Traffic", WRITTEN))
    assert undo_patch(live, None, replicaset_template(before), a, "r", "chat", WRITTEN) is not None

    edited = copy.deepcopy(live)  # someone changed the image since
    edited["spec"]["template"]["spec"]["containers"][1]["image"] = "vllm/vllm-openai:v0.11.1"
    assert undo_patch(edited, None, replicaset_template(before), a, "r", "chat", WRITTEN) is None
    other = copy.deepcopy(live)  # or another flag
    other["spec"]["template"]["spec"]["containers"][1]["args"] += ["--enable-prefix-caching"]
    assert undo_patch(other, None, replicaset_template(before), a, "r", "chat", WRITTEN) is None
    elsewhere = Knobs(max_num_batched_tokens=1024, max_num_seqs=64)  # the template replaced ran another config
    assert undo_patch(live, None, replicaset_template(before), elsewhere, "r", "chat", WRITTEN) is None


def crashing_pod(restarts):
    return {
        "metadata": {"name": "llama-abc-1"},
        "status": {
            "containerStatuses": [
                {
                    "name": "vllm",
                    "restartCount": restarts,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting"}},
                    "lastState": {
                        "terminated": {
                            "exitCode": 1,
                            "message": "ValueError: No available memory for the cache blocks.",
                        }
                    },
                }
            ]
        },
    }


def test_progress_complete_in_progress_and_failed():
    done = deployment([], status={"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2})
    assert rollout_state(done, 3, [], "vllm", 10, 600).progress is Progress.COMPLETE
    assert not rollout_in_progress(done)

    midway = deployment(
        [], status={"observedGeneration": 3, "replicas": 3, "updatedReplicas": 1, "availableReplicas": 2}
    )
    assert rollout_state(midway, 3, [], "vllm", 10, 600).progress is Progress.IN_PROGRESS
    assert rollout_in_progress(midway)
    late = rollout_state(midway, 3, [], "vllm", 601, 600)
    assert late.progress is Progress.FAILED and "progressDeadline 600s" in late.message

    stale = deployment(
        [], status={"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}
    )
    assert rollout_state(stale, 3, [], "vllm", 1, 600).progress is Progress.IN_PROGRESS


def test_crash_loop_fails_fast_with_the_vllm_error():
    midway = deployment(
        [], status={"observedGeneration": 3, "replicas": 3, "updatedReplicas": 1, "availableReplicas": 2}
    )
    assert rollout_state(midway, 3, [crashing_pod(1)], "vllm", 30, 600).progress is Progress.IN_PROGRESS
    failed = rollout_state(midway, 3, [crashing_pod(2)], "vllm", 30, 600)
    assert failed.progress is Progress.FAILED
    assert "No available memory for the cache blocks" in failed.message and "llama-abc-1" in failed.message


def pending_pod(message: str) -> dict:
    """A new pod the scheduler could not place, as kube-scheduler reports it."""
    return {"metadata": {"name": "llama-abc-9"}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}}


def test_a_new_pod_that_cannot_be_scheduled_blocks_the_rollout_at_the_deadline_and_does_not_fail_it():
    surging = deployment(
        [], status={"observedGeneration": 3, "replicas": 3, "updatedReplicas": 1, "availableReplicas": 2}
    )
    pending = [pending_pod("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")]
    assert rollout_state(surging, 3, pending, "vllm", 120, 600).progress is Progress.IN_PROGRESS  # a node may come
    blocked = rollout_state(surging, 3, pending, "vllm", 601, 600)
    assert blocked.progress is Progress.BLOCKED
    assert "llama-abc-9 cannot be scheduled: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu" in blocked.message
    assert "maxSurge: 0 and maxUnavailable: 1" in blocked.message
    assert rollout_state(surging, 3, [], "vllm", 601, 600).progress is Progress.FAILED  # nothing known of the pods
    assert rollout_state(surging, 3, [*pending, crashing_pod(2)], "vllm", 30, 600).progress is Progress.FAILED
    # a new pod serves the config (it starts), the next finds no GPU (a node went half way): blocked, not failed
    serving = vllm_pod({"running": {"startedAt": "2024-05-01T12:01:00Z"}}, ready=True)
    assert rollout_state(surging, 3, [serving, *pending], "vllm", 601, 600).progress is Progress.BLOCKED
    # one that runs and is not Ready yet has read the knobs: what holds the rollout may be the config
    loading = vllm_pod({"running": {"startedAt": "2024-05-01T12:01:00Z"}})
    assert rollout_state(surging, 3, [serving, loading, *pending], "vllm", 601, 600).progress is Progress.FAILED
    assert rollout_state(surging, 3, [serving], "vllm", 601, 600).progress is Progress.FAILED  # none holds it back


def test_a_new_pod_waiting_for_a_draining_pods_gpu_is_not_told_to_stop_old_pods_first():
    """maxSurge 0 already: the replacement is created as the old pod starts to drain and waits for its GPU."""
    pending = [pending_pod("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")]
    status = {"observedGeneration": 3, "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1}
    for strategy in ({"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}, {"type": "Recreate"},
                     {"rollingUpdate": {"maxSurge": "10%", "maxUnavailable": "50%"}}):  # 10% of 2 rounds up to 1
        stopping = deployment([], status=status)
        stopping["spec"]["strategy"] = strategy
        blocked = rollout_state(stopping, 3, pending, "vllm", 631, 600)  # past 600s, and the 30s drain if not surging
        assert blocked.progress is Progress.BLOCKED and "Insufficient nvidia.com/gpu" in blocked.message
        surges = "10%" in str(strategy)
        assert ("maxSurge: 0 and maxUnavailable: 1" in blocked.message) is surges, strategy
        assert ("spec.rollout.progressDeadline above that drain" in blocked.message) is not surges, strategy


def test_a_strategy_that_stops_old_pods_first_gives_their_drain_before_a_new_pod_loads():
    """maxSurge 0: the new pod is Pending for the GPU of the old one while it drains (1800s), before vLLM loads: it
    was Blocked at the spec's 600s. Recreate: no new pod exists until every old one is gone, and a rollout stalled
    then was Failed, its config recorded as failed though no pod ever ran it."""
    pending = [pending_pod("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")]
    one = {"observedGeneration": 3, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 0}
    stopping = deployment([], status=one)
    stopping["spec"].update(replicas=1, strategy={"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}})
    stopping["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 1800
    assert progress_deadline(stopping, pending, "vllm", 600).seconds == 2400
    assert rollout_state(stopping, 3, pending, "vllm", 700, 600).progress is Progress.IN_PROGRESS
    assert rollout_state(stopping, 3, pending, "vllm", 2401, 600).progress is Progress.BLOCKED

    recreate = deployment([], status={**one, "updatedReplicas": 0, "replicas": 0})
    recreate["spec"].update(replicas=1, strategy={"type": "Recreate"})
    recreate["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 1800
    draining = vllm_pod({"running": {}})
    draining["metadata"]["deletionTimestamp"] = "2024-05-01T12:00:00Z"
    for listed in ([draining], []):
        stalled = rollout_state(recreate, 3, listed, "vllm", 2401, 600)
        assert stalled.progress is Progress.BLOCKED and "no pod of the new template" in stalled.message, listed
    only_gone = deployment([], status={**one, "updatedReplicas": 1})
    only_gone["spec"].update(replicas=1, strategy={"type": "Recreate"})
    assert rollout_state(only_gone, 3, [draining], "vllm", 700, 600).progress is Progress.BLOCKED


def test_a_rollout_is_what_the_deployment_controller_rolls_not_a_pod_lost_after_it():
    """An autoscaler's pod that finds no GPU, or a pod lost with its node, after the rollout completed: the
    Deployment controller keeps its Progressing condition at NewReplicaSetAvailable. Its own tuning holds while
    the Deployment is short of replicas; no other tuning waits for a rollout slot."""
    def dep(replicas, updated, available, reason=None, observed=3):
        status = {"observedGeneration": observed, "replicas": replicas, "updatedReplicas": updated,
                  "availableReplicas": available}
        if reason:
            status["conditions"] = [{"type": "Progressing", "status": "True", "reason": reason}]
        d = deployment([], status=status)
        d["spec"]["replicas"] = 3
        return d

    short = dep(3, 3, 2, "NewReplicaSetAvailable")  # scaled up to 3, one pod pending
    assert not template_rolling(short) and rollout_in_progress(short)
    assert template_rolling(dep(3, 3, 2, "ReplicaSetUpdated"))  # the last new pod is still loading
    assert template_rolling(dep(3, 3, 2))  # no condition (a controller that sets none): every replica available
    assert not template_rolling(dep(3, 3, 3)) and not rollout_in_progress(dep(3, 3, 3))
    assert template_rolling(dep(4, 3, 3, "NewReplicaSetAvailable"))  # an old pod is still to be stopped
    assert template_rolling(dep(3, 2, 3, "NewReplicaSetAvailable"))  # a new one is still to be created
    assert template_rolling(dep(3, 3, 3, "NewReplicaSetAvailable", observed=2))  # a new template not yet seen
    assert template_rolling(dep(3, 3, 3, "ProgressDeadlineExceeded")) and template_rolling(
        dep(3, 3, 2, "NewReplicaSetCreated"))
    # paused or just resumed, the condition says nothing of a rollout: every replica available is none
    for reason in ("DeploymentPaused", "DeploymentResumed"):
        assert not template_rolling(dep(3, 3, 3, reason)) and template_rolling(dep(3, 3, 2, reason)), reason
        assert template_rolling(dep(3, 2, 3, reason)), reason  # a template change left unrolled by the pause
    # our own rollout is judged by availability: it is complete only once every replica serves the new template
    assert rollout_state(short, 3, [], "vllm", 10, 600).progress is not Progress.COMPLETE


def test_a_pod_that_turns_ready_is_progress_while_min_ready_seconds_keeps_it_unavailable():
    """minReadySeconds 300 as a warm-up and ten minutes of model load: the pod turns Ready at 10 minutes and
    available at 15. The Deployment controller counts readiness as progress; a 12-minute deadline from creation
    is not exceeded."""
    from vllm_autotuner.api import CurrentKnobs, KnobSource, VllmTuningStatus
    from vllm_autotuner.policy import rollout_progressed
    from vllm_autotuner.policy.decision import with_rollout

    t0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    current = CurrentKnobs(max_num_batched_tokens=8192, max_num_seqs=256, since="2024-05-01T10:00:00Z",
                           source=KnobSource.INITIAL)
    state = with_rollout(VllmTuningStatus(current=current), t0, Knobs(max_num_batched_tokens=2048, max_num_seqs=256),
                         KnobSource.TRAFFIC, "ITL breach")

    def judged(at, ready, available):
        nonlocal state
        dep = deployment([], generation=4, status={
            "observedGeneration": 4, "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1 + available})
        dep["spec"]["minReadySeconds"] = 300
        state = rollout_progressed(state, at, progress_mark(dep, {"status": {
            "replicas": 1, "readyReplicas": ready, "availableReplicas": available}}, 4))
        since = datetime.fromisoformat(state.last_rollout.progressed_at or state.last_rollout.started_at)
        return rollout_state(dep, 4, [], "vllm", (at - since).total_seconds(), 720).progress

    assert judged(t0, 0, 0) is Progress.IN_PROGRESS  # created
    assert judged(t0 + timedelta(minutes=10), 1, 0) is Progress.IN_PROGRESS  # Ready
    assert judged(t0 + timedelta(minutes=12, seconds=1), 1, 0) is Progress.IN_PROGRESS
    assert judged(t0 + timedelta(minutes=22, seconds=1), 1, 0) is Progress.FAILED  # 12 minutes after it turned Ready


def test_new_pods_that_never_started_vllm_block_the_rollout_and_one_that_ran_fails_it():
    surging = deployment(
        [], status={"observedGeneration": 3, "replicas": 3, "updatedReplicas": 1, "availableReplicas": 2}
    )

    def pod(state, restarts=0, last=None):
        status = {"name": "vllm", "restartCount": restarts, "state": state, "lastState": last or {}}
        return {"metadata": {"name": "llama-abc-9"}, "status": {"phase": "Pending", "containerStatuses": [
            {"name": "sidecar", "restartCount": 0, "state": {"running": {}}}, status]}}

    pulling = pod({"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "vllm:v0.12"'}})
    blocked = rollout_state(surging, 3, [pulling], "vllm", 601, 600)
    assert blocked.progress is Progress.BLOCKED and "ImagePullBackOff" in blocked.message
    assert "maxSurge" not in blocked.message  # the GPU advice is for pods with no room only
    # vLLM ran and never became Ready (its probes killed it once): it read the knobs, the rollout failed
    slow = pod({"running": {}}, restarts=1, last={"terminated": {"exitCode": 137, "reason": "Error"}})
    assert rollout_state(surging, 3, [slow], "vllm", 601, 600).progress is Progress.FAILED
    assert rollout_state(surging, 3, [pod({"running": {}})], "vllm", 601, 600).progress is Progress.FAILED
    quota = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
             "message": 'pods "llama-abc-9" is forbidden: exceeded quota: gpus, requested: nvidia.com/gpu=1'}
    refused = deployment([], status={**surging["status"], "conditions": [quota]})
    blocked = rollout_state(refused, 3, [], "vllm", 601, 600)
    assert blocked.progress is Progress.BLOCKED and "exceeded quota" in blocked.message


def test_the_deployment_controllers_progress_deadline_exceeded_decides_nothing():
    """A 70B model loads for 15 minutes a pod: the Deployment controller's condition (600 s unless the Deployment
    says otherwise) runs out long before the 30 minutes the VllmTuning allows, and decides nothing."""
    exceeded = {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                "message": 'ReplicaSet "llama-abc" has timed out progressing.'}
    loading = deployment([], status={"observedGeneration": 3, "replicas": 3, "updatedReplicas": 1,
                                     "availableReplicas": 2, "conditions": [exceeded]})
    pod = vllm_pod({"running": {"startedAt": "2024-05-01T12:01:00Z"}})
    pending = [pending_pod("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")]

    assert rollout_state(loading, 3, [pod], "vllm", 601, 1800).progress is Progress.IN_PROGRESS
    assert rollout_state(loading, 3, pending, "vllm", 601, 1800).progress is Progress.IN_PROGRESS  # nor Blocked
    late = rollout_state(loading, 3, [pod], "vllm", 1801, 1800)
    assert late.progress is Progress.FAILED and "progressDeadline 1800s" in late.message


def loading_deployment(**spec):
    """One new pod of three created and not available yet, the Deployment's spec updated with ``spec``."""
    dep = deployment([], status={"observedGeneration": 3, "replicas": 3, "updatedReplicas": 1,
                                 "availableReplicas": 2})
    dep["spec"].update(spec)
    return dep


def with_startup_probe(dep, **probe):
    dep["spec"]["template"]["spec"]["containers"][1]["startupProbe"] = {"httpGet": {"path": "/health"}, **probe}
    return dep


def test_a_deployment_that_gives_its_pods_longer_than_the_specs_deadline_is_not_failed_before_it():
    """vLLM runs, not Ready, 11 minutes after the pod's creation under the spec's 10-minute deadline: the
    Deployment's own progressDeadlineSeconds, or the kubelet's startupProbe budget, allows it longer, and the
    verdict past it names the deadline and where it came from."""
    pod = [vllm_pod({"running": {"startedAt": "2024-05-01T12:01:00Z"}})]
    slow = loading_deployment(progressDeadlineSeconds=3600)
    assert rollout_state(slow, 3, pod, "vllm", 660, 600).progress is Progress.IN_PROGRESS
    late = rollout_state(slow, 3, pod, "vllm", 3601, 600)
    assert late.progress is Progress.FAILED
    assert "progressDeadline 3600s, the Deployment's progressDeadlineSeconds" in late.message

    probed = with_startup_probe(loading_deployment(), periodSeconds=10, failureThreshold=180)  # 30 minutes
    assert rollout_state(probed, 3, pod, "vllm", 660, 600).progress is Progress.IN_PROGRESS
    assert rollout_state(probed, 3, pod, "vllm", 1900, 600).progress is Progress.IN_PROGRESS
    late = rollout_state(probed, 3, pod, "vllm", 1922, 600)  # 1800 s + its 1 s timeout + 120 s
    assert late.progress is Progress.FAILED
    assert "progressDeadline 1921s, container vllm's startupProbe 0s + 180 x 10s + 1s + 120s" in late.message
    # a pod that finds no GPU has started no vLLM for the probe to wait for: blocked at the spec's deadline
    pending = [pending_pod("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")]
    assert rollout_state(probed, 3, pending, "vllm", 601, 600).progress is Progress.BLOCKED
    # another container's probe says nothing of vLLM's start
    sidecar = loading_deployment()
    sidecar["spec"]["template"]["spec"]["containers"][0]["startupProbe"] = {"failureThreshold": 180}
    assert rollout_state(sidecar, 3, pod, "vllm", 660, 600).progress is Progress.FAILED
    # the spec's deadline stands where it is the longest, and is named
    late = rollout_state(slow, 3, pod, "vllm", 4000, 3900)
    assert late.progress is Progress.FAILED
    assert "(progressDeadline 3900s, spec.rollout.progressDeadline)" in late.message


def test_a_pod_that_waits_out_min_ready_seconds_longer_than_the_deadline_is_not_failed():
    """minReadySeconds 900 (Kubernetes asks for it under progressDeadlineSeconds, 1000 here): every new pod
    Ready, none available yet for 15 minutes, no progress meanwhile; the controller's syncs take a little longer."""
    waiting = loading_deployment(minReadySeconds=900, progressDeadlineSeconds=1000)
    ready = [vllm_pod({"running": {}}, ready=True)]
    assert rollout_state(waiting, 3, ready, "vllm", 901, 600).progress is Progress.IN_PROGRESS
    late = rollout_state(waiting, 3, ready, "vllm", 1021, 600)
    assert late.progress is Progress.FAILED and "the Deployment's minReadySeconds 900s + 120s" in late.message


def test_a_strategy_that_stops_old_pods_first_adds_their_drain_to_the_startup_probes_budget():
    """maxSurge 0 or Recreate: the new pod waits for an old pod's GPU, free once it has drained."""
    pod = [vllm_pod({"running": {}})]
    for strategy in ({"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}, {"type": "Recreate"}):
        stopping = with_startup_probe(loading_deployment(strategy=strategy), periodSeconds=10, failureThreshold=90)
        stopping["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 300
        assert rollout_state(stopping, 3, pod, "vllm", 1321, 600).progress is Progress.IN_PROGRESS, strategy
        late = rollout_state(stopping, 3, pod, "vllm", 1322, 600)  # 300 + 900 + 1 + 120
        assert late.progress is Progress.FAILED and "after a 300s drain" in late.message, strategy
    surging = with_startup_probe(loading_deployment(), periodSeconds=10, failureThreshold=90)
    surging["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 300
    assert rollout_state(surging, 3, pod, "vllm", 1022, 600).progress is Progress.FAILED  # no old pod to wait for


def vllm_pod(state, restarts=0, ended=None, ready=False):
    """A pod of the rollout, its vLLM container in ``state``, last ended as ``ended`` (a ``terminated`` record)."""
    status = {"name": "vllm", "ready": ready, "restartCount": restarts, "state": state,
              "lastState": {"terminated": ended} if ended else {}}
    return {"metadata": {"name": "llama-abc-1"}, "status": {"containerStatuses": [status]}}


def exited(at, message="ValueError: No available memory for the cache blocks.", code=1, reason="Error"):
    return {"exitCode": code, "reason": reason, "message": message, "finishedAt": utc_timestamp(at)}


def test_only_crashes_in_this_rollout_of_a_container_not_serving_fail_it():
    """A rollback of our change scales the old ReplicaSet back up: its pods ran for days, and one restarted
    twice on an NCCL error on Monday. That is no crash loop of the rollback's, nor is a crash the pod recovered
    from; a pod whose vLLM keeps exiting since the rollback is."""
    a, b = Knobs(max_num_batched_tokens=2048, max_num_seqs=64), Knobs(max_num_batched_tokens=512, max_num_seqs=64)
    before = deployment(["--max-num-batched-tokens", "2048", "--max-num-seqs", "64"])
    live = merge(before, knob_patch(before, None, b, "ITL breach", "chat", "Traffic", WRITTEN))
    back = WRITTEN + timedelta(minutes=10)
    undone = merge(live, undo_patch(live, None, replicaset_template(before), a, "512 failed", "chat", back))
    undone["status"] = {"observedGeneration": 3, "replicas": 3, "updatedReplicas": 1, "availableReplicas": 1}
    monday = exited(back - timedelta(days=3), "NCCL watchdog timeout")
    running = {"running": {"startedAt": "2024-04-28T09:00:00Z"}}

    def judged(pod):
        return rollout_state(undone, 3, [pod], "vllm", 30, 600).progress

    assert judged(vllm_pod(running, restarts=3, ended=monday, ready=True)) is Progress.IN_PROGRESS
    assert judged(vllm_pod(running, restarts=3, ended=monday)) is Progress.IN_PROGRESS  # a readiness probe failing
    backing_off = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}}
    assert judged(vllm_pod(backing_off, restarts=2, ended=exited(back - timedelta(seconds=5)))) is (
        Progress.IN_PROGRESS)  # its last exit was before the rollback
    assert judged(vllm_pod(running, restarts=2, ended=exited(back + timedelta(minutes=1)), ready=True)) is (
        Progress.IN_PROGRESS)  # it recovered
    failed = rollout_state(undone, 3, [vllm_pod(backing_off, restarts=2, ended=exited(back + timedelta(minutes=1)))],
                           "vllm", 30, 600)
    assert failed.progress is Progress.FAILED and "No available memory for the cache blocks" in failed.message
    assert judged(vllm_pod(running, restarts=2, ended=exited(back))) is Progress.FAILED  # loading a third time


def test_a_new_pod_on_its_way_out_did_not_run_the_config_nor_crash_loops_in_it():
    """The kubelet evicted the surge pod (node pressure while the weights were pulled: phase Failed, its vLLM
    container's end unknown), its replacement finds no GPU: no pod of the config ran vLLM, so it is blocked, not
    failed (the config would be recorded as failed). So for one being deleted, or marked for a disruption."""
    surging = deployment(
        [], status={"observedGeneration": 3, "replicas": 3, "updatedReplicas": 1, "availableReplicas": 2}
    )
    pending = pending_pod("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
    evicted = vllm_pod({"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown",
                                       "message": "The container could not be located when the pod was terminated"}})
    evicted["status"].update({"phase": "Failed", "reason": "Evicted"})
    deleted = vllm_pod({"running": {}})
    deleted["metadata"]["deletionTimestamp"] = "2024-05-01T12:05:00Z"
    preempted = vllm_pod({"running": {}})
    preempted["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True",
                                          "reason": "PreemptionByScheduler"}]
    probed = with_startup_probe(copy.deepcopy(surging), periodSeconds=10, failureThreshold=180)
    for gone in (evicted, deleted, preempted):
        blocked = rollout_state(surging, 3, [gone, pending], "vllm", 601, 600)
        assert blocked.progress is Progress.BLOCKED and "Insufficient nvidia.com/gpu" in blocked.message, gone
        # nor does it load vLLM, which the startupProbe's budget would wait for
        assert rollout_state(probed, 3, [gone, pending], "vllm", 601, 600).progress is Progress.BLOCKED, gone
    running = vllm_pod({"running": {}})
    assert rollout_state(surging, 3, [running, pending], "vllm", 601, 600).progress is Progress.FAILED
    assert rollout_state(surging, 3, [{**preempted, "status": {**preempted["status"], "conditions": [
        {"type": "DisruptionTarget", "status": "False"}]}}, pending], "vllm", 601, 600).progress is Progress.FAILED

    # a crash loop is a running pod's: it still fails the rollout at once, and a deleted one's is its replacement's
    crashing = crashing_pod(2)
    crashing["status"]["phase"] = "Running"
    assert rollout_state(surging, 3, [crashing], "vllm", 30, 600).progress is Progress.FAILED
    crashing["metadata"]["deletionTimestamp"] = "2024-05-01T12:05:00Z"
    assert rollout_state(surging, 3, [crashing], "vllm", 30, 600).progress is Progress.IN_PROGRESS


def test_a_container_the_runtime_cannot_start_blocks_the_rollout_and_does_not_fail_it():
    """The NVIDIA container toolkit cannot load a node's driver: containerd's StartError (exit code 128), the
    kubelet restarting the container in back-off. vLLM never ran, so the knobs are not to blame."""
    b = Knobs(max_num_batched_tokens=512, max_num_seqs=64)
    before = deployment(["--max-num-batched-tokens", "2048", "--max-num-seqs", "64"])
    written = merge(before, knob_patch(before, None, b, "ITL breach", "chat", "Traffic", WRITTEN))
    written["status"] = {"observedGeneration": 3, "replicas": 3, "updatedReplicas": 1, "availableReplicas": 2}
    mismatch = ("failed to create containerd task: failed to create shim task: nvidia-container-cli: initialization "
                "error: nvml error: driver/library version mismatch")
    ended = exited(WRITTEN + timedelta(minutes=1), mismatch, code=128, reason="StartError")

    for waiting in ("CrashLoopBackOff", "RunContainerError"):
        pod = vllm_pod({"waiting": {"reason": waiting, "message": "back-off 20s restarting failed container"}},
                       restarts=2, ended=ended)
        assert rollout_state(written, 3, [pod], "vllm", 60, 600).progress is Progress.IN_PROGRESS
        blocked = rollout_state(written, 3, [pod], "vllm", 601, 600)
        assert blocked.progress is Progress.BLOCKED, waiting
        assert "cannot start its container (StartError)" in blocked.message and mismatch in blocked.message


def test_a_slow_rollout_that_keeps_progressing_is_not_failed_and_a_stalled_one_is():
    """Eight pods, one at a time, four minutes each (32 minutes) under a 10-minute progressDeadline."""
    from datetime import UTC, datetime, timedelta

    from vllm_autotuner.api import CurrentKnobs, KnobSource, VllmTuningStatus
    from vllm_autotuner.policy import rollout_progressed
    from vllm_autotuner.policy.decision import with_rollout

    t0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    current = CurrentKnobs(max_num_batched_tokens=8192, max_num_seqs=256, since="2024-05-01T10:00:00Z",
                           source=KnobSource.INITIAL)
    state = with_rollout(VllmTuningStatus(current=current), t0, Knobs(max_num_batched_tokens=2048, max_num_seqs=256),
                         KnobSource.TRAFFIC, "ITL breach")
    # before the Deployment controller has seen the patch, its counts are the old template's: no progress
    before = deployment([], generation=4, status={"observedGeneration": 3, "updatedReplicas": 8})
    assert progress_mark(before, {"status": {"availableReplicas": 8}}, 4) == 0

    def judged(at, updated, available):
        nonlocal state
        dep = deployment([], generation=4, status={
            "observedGeneration": 4, "replicas": 8, "updatedReplicas": updated, "availableReplicas": 7})
        dep["spec"]["replicas"] = 8
        state = rollout_progressed(state, at, progress_mark(dep, {"status": {"availableReplicas": available}}, 4))
        since = datetime.fromisoformat(state.last_rollout.progressed_at or state.last_rollout.started_at)
        return rollout_state(dep, 4, [], "vllm", (at - since).total_seconds(), 600).progress

    for pod in range(1, 8):  # pod n is created at 4n-4 minutes and Ready at 4n
        assert judged(t0 + timedelta(minutes=4 * pod - 4), pod, pod - 1) is Progress.IN_PROGRESS
        assert judged(t0 + timedelta(minutes=4 * pod), pod, pod) is Progress.IN_PROGRESS
    assert state.last_rollout.progress_mark == 14 and state.last_rollout.progressed_at == "2024-05-01T12:28:00Z"
    # the eighth pod is created, then never becomes Ready (no GPU left): failed ten minutes after the last step
    assert judged(t0 + timedelta(minutes=29), 8, 7) is Progress.IN_PROGRESS
    assert judged(t0 + timedelta(minutes=39), 8, 7) is Progress.IN_PROGRESS
    assert judged(t0 + timedelta(minutes=39, seconds=1), 8, 7) is Progress.FAILED
    # paused, the clock does not run
    paused = rollout_progressed(state, t0 + timedelta(minutes=50), 15 - 1, halted=True)
    assert paused.last_rollout.progressed_at == "2024-05-01T12:50:00Z"


def test_a_rollout_an_autoscaler_scales_down_half_way_goes_on_counting_its_steps():
    """Twenty pods, one at a time (maxSurge 0, maxUnavailable 1), three minutes each, under a 10-minute deadline;
    after ten, the HPA asks for ten replicas and the Deployment controller scales both ReplicaSets down (five new,
    five old). The steps after that are progress, though the mark never again reaches the twenty it had."""
    from datetime import UTC, datetime, timedelta

    from vllm_autotuner.api import CurrentKnobs, KnobSource, VllmTuningStatus
    from vllm_autotuner.policy import rollout_progressed
    from vllm_autotuner.policy.decision import with_rollout

    t0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    current = CurrentKnobs(max_num_batched_tokens=8192, max_num_seqs=256, since="2024-05-01T10:00:00Z",
                           source=KnobSource.INITIAL)
    state = with_rollout(VllmTuningStatus(current=current), t0, Knobs(max_num_batched_tokens=4096, max_num_seqs=256),
                         KnobSource.TRAFFIC, "ITL breach")

    def judged(at, replicas, updated, new_available, generation=4):
        nonlocal state
        dep = deployment([], generation=generation, status={
            "observedGeneration": generation, "replicas": replicas, "updatedReplicas": updated,
            "availableReplicas": replicas if new_available == updated else replicas - 1})
        dep["spec"]["replicas"] = replicas
        state = rollout_progressed(state, at, progress_mark(dep, {"status": {"availableReplicas": new_available}}, 4))
        since = datetime.fromisoformat(state.last_rollout.progressed_at or state.last_rollout.started_at)
        return rollout_state(dep, 4, [], "vllm", (at - since).total_seconds(), 600).progress

    for pod in range(1, 11):  # pod n is created at 3n-3 minutes and Ready at 3n
        assert judged(t0 + timedelta(minutes=3 * pod - 3), 20, pod, pod - 1) is Progress.IN_PROGRESS
        assert judged(t0 + timedelta(minutes=3 * pod), 20, pod, pod) is Progress.IN_PROGRESS
    assert state.last_rollout.progress_mark == 20
    scaled = t0 + timedelta(minutes=30, seconds=1)  # the HPA's scale-down is generation 5
    assert judged(scaled, 10, 5, 5, generation=5) is Progress.IN_PROGRESS
    for pod in range(6, 11):  # then the five old pods left are replaced, one at a time again
        at = scaled + timedelta(minutes=3 * (pod - 5))
        assert judged(at - timedelta(minutes=3), 10, pod, pod - 1, generation=5) is Progress.IN_PROGRESS
        progress = judged(at, 10, pod, pod, generation=5)
        assert progress is (Progress.COMPLETE if pod == 10 else Progress.IN_PROGRESS), pod
    # a fall restarts no clock: scaled down after the tenth pod, then stalled, it fails ten minutes after that pod
    state = with_rollout(VllmTuningStatus(current=current), t0, Knobs(max_num_batched_tokens=4096, max_num_seqs=256),
                         KnobSource.TRAFFIC, "ITL breach")
    assert judged(t0 + timedelta(minutes=30), 20, 10, 10) is Progress.IN_PROGRESS
    assert judged(scaled, 10, 5, 5, generation=5) is Progress.IN_PROGRESS
    assert judged(t0 + timedelta(minutes=40), 10, 5, 5, generation=5) is Progress.IN_PROGRESS
    assert judged(t0 + timedelta(minutes=40, seconds=1), 10, 5, 5, generation=5) is Progress.FAILED


def test_the_pods_a_rollout_stops_at_once_are_resolved_as_the_deployment_controller_does():
    def at_once(replicas, strategy=None):
        dep = deployment([])
        dep["spec"]["replicas"] = replicas
        if strategy is not None:
            dep["spec"]["strategy"] = strategy
        return unavailable_at_once(dep)

    # Kubernetes' default, 25 % each way: maxUnavailable rounds down, so below four replicas it only surges
    assert [at_once(n) for n in (1, 2, 3, 4, 8, 10)] == [0, 0, 0, 1, 2, 2]
    assert at_once(4, {"type": "Recreate"}) == 4
    assert at_once(4, {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}) == 1
    assert at_once(8, {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": "50%"}}) == 4
    assert at_once(2, {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}}) == 1
    assert at_once(2, {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 5}}) == 2
