"""What the watches have seen: VllmTunings, Deployments and ReplicaSets, in memory.

kopf keeps Deployments and ReplicaSets in indexes (``kopf.index``) and feeds
every VllmTuning event in; the evaluator reads from here, so an evaluation
needs no GET of the objects it looks at, and a thousand tunings cost no more
API calls than one. kopf calls the VllmTuning handler only once the indexes
hold their initial listing, so a tuning is never evaluated against a cache
that has not seen its Deployment yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from vllm_autotuner.rollout.patch import command_line_owners

Key = tuple[str, str]  # (namespace, name)
REVISION = "deployment.kubernetes.io/revision"


def deployment_index(namespace: str, name: str, body: Mapping[str, Any]) -> dict[Key, dict[str, Any]]:
    """Index entry of a Deployment: by (namespace, name). Of its write history (``managedFields``), only who wrote
    its containers' command lines (``patch.command_line_owners``): who changed the knobs, if not the operator."""
    plain = _plain(body)
    if owners := command_line_owners(body.get("metadata", {}).get("managedFields")):
        plain["metadata"]["managedFields"] = owners
    return {(namespace, name): plain}


def replicaset_index(namespace: str, body: Mapping[str, Any]) -> dict[Key, dict[str, Any]]:
    """Index entries of a ReplicaSet: by (namespace, owner uid), for each owner. Its metadata and status only:
    its spec repeats its Deployment's pod template, and every Deployment keeps up to ten old ReplicaSets."""
    owners = body.get("metadata", {}).get("ownerReferences") or []
    entry = {"metadata": _plain(body)["metadata"], "status": dict(body.get("status") or {})}
    return {(namespace, ref["uid"]): entry for ref in owners if ref.get("uid")}


def revision(replicaset: Mapping[str, Any]) -> int:
    """The Deployment revision a ReplicaSet holds (its ``deployment.kubernetes.io/revision``; 0 before any)."""
    return int((replicaset["metadata"].get("annotations") or {}).get(REVISION, "0"))


def _target_key(body: Mapping[str, Any]) -> Key:
    return body["metadata"]["namespace"], ((body.get("spec") or {}).get("targetRef") or {}).get("name", "")


#: Metadata the operator never reads, and the largest: the write history (but for a Deployment's command lines)
#: and kubectl's copy of the whole object.
_UNREAD_METADATA = {"managedFields"}
_UNREAD_ANNOTATIONS = {"kubectl.kubernetes.io/last-applied-configuration"}


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    metadata = {k: v for k, v in dict(body.get("metadata", {})).items() if k not in _UNREAD_METADATA}
    if metadata.get("annotations"):
        metadata["annotations"] = {k: v for k, v in metadata["annotations"].items() if k not in _UNREAD_ANNOTATIONS}
    return {**dict(body), "metadata": metadata}


class ClusterCache:
    """Latest known state of the objects the operator watches."""

    def __init__(self) -> None:
        self.tunings: dict[Key, dict[str, Any]] = {}
        self._by_target: dict[Key, set[str]] = {}  # (namespace, Deployment) -> names of the tunings naming it
        self._deployments: Mapping[Key, Iterable[dict[str, Any]]] = {}
        self._replicasets: Mapping[Key, Iterable[dict[str, Any]]] = {}

    def bind(self, deployments: Mapping[Key, Iterable[dict[str, Any]]],
             replicasets: Mapping[Key, Iterable[dict[str, Any]]]) -> None:
        """Use kopf's live indexes (they update in place)."""
        self._deployments, self._replicasets = deployments, replicasets

    def on_tuning_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """Apply one VllmTuning watch event (``event_type`` None is kopf's initial listing).

        A tuning whose deletion was asked for (``deletionTimestamp``; another controller's finalizer may keep it for
        a while) is gone here already: nothing more is done for it, and it conflicts with no other tuning.
        """
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        old = self.tunings.pop(key, None)
        if old is not None:
            self._by_target.get(_target_key(old), set()).discard(key[1])
        if event_type != "DELETED" and not body["metadata"].get("deletionTimestamp"):
            self.tunings[key] = _plain(body)
            self._by_target.setdefault(_target_key(body), set()).add(key[1])

    def forget_tuning(self, namespace: str, name: str) -> None:
        """Drop a tuning found deleted by a read of our own (a re-list after a watch outage brings no DELETED
        event for it)."""
        body = self.tunings.get((namespace, name))
        if body is not None:
            self.on_tuning_event("DELETED", body)

    def tunings_of(self, namespace: str, deployment: str) -> list[str]:
        """Names of the VllmTunings in ``namespace`` whose targetRef names ``deployment``, sorted."""
        return sorted(self._by_target.get((namespace, deployment), ()))

    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = list(self._deployments.get((namespace, name), ()))
        return found[0] if found else None

    def target(self, tuning: Mapping[str, Any]) -> dict[str, Any] | None:
        """The Deployment a VllmTuning (its raw body, valid or not) names, if the cache has it."""
        return self.deployment(*_target_key(tuning))

    def replicasets(self, deployment: dict[str, Any]) -> list[dict[str, Any]]:
        """Every ReplicaSet the Deployment owns: its current revision's and the old ones it keeps."""
        meta = deployment["metadata"]
        return list(self._replicasets.get((meta["namespace"], meta.get("uid", "")), ()))

    def current_replicaset(self, deployment: dict[str, Any]) -> dict[str, Any] | None:
        """The ReplicaSet of the Deployment's current revision (the one new pods belong to)."""
        meta = deployment["metadata"]
        owned = self.replicasets(deployment)
        if not owned:
            return None
        current = (meta.get("annotations") or {}).get(REVISION)
        for rs in owned:
            if current is not None and (rs["metadata"].get("annotations") or {}).get(REVISION) == current:
                return rs
        # the ReplicaSet watch lags the Deployment's (a patch just made its new ReplicaSet): the newest seen
        return max(owned, key=revision)
