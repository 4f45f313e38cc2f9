"""Generate the VllmTuning CustomResourceDefinition from the pydantic models.

Pydantic emits JSON Schema (draft 2020-12); a CRD needs a *structural*
OpenAPI v3.0 schema: no ``$ref``, no ``anyOf`` for optional fields, boolean
``exclusiveMinimum``, no ``additionalProperties: false`` (unknown fields are
pruned by the API server instead), no titles. This module does that
translation and adds what only a CRD has: printer columns, the status
subresource, names and categories. ``crds/`` holds its output and a test keeps
the two equal, so the models stay the single source of truth.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

from vllm_autotuner.api import resource
from vllm_autotuner.api.resource import VllmTuning
from vllm_autotuner.api.spec import OVERLAY, VllmTuningSpec
from vllm_autotuner.api.status import VllmTuningStatus

PRINTER_COLUMNS = [
    {"name": "Target", "type": "string", "jsonPath": ".spec.targetRef.name", "description": "Deployment being tuned"},
    {"name": "Mode", "type": "string", "jsonPath": ".spec.mode", "description": "Auto, Recommend or Paused"},
    {
        "name": "Tokens",
        "type": "integer",
        "jsonPath": ".status.current.maxNumBatchedTokens",
        "description": "--max-num-batched-tokens in effect",
    },
    {
        "name": "Seqs",
        "type": "integer",
        "jsonPath": ".status.current.maxNumSeqs",
        "description": "--max-num-seqs in effect",
    },
    {
        "name": "Schedule",
        "type": "string",
        "jsonPath": ".status.activeSchedule",
        "description": "Time-of-day schedule in force",
    },
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        "description": "Ready condition",
    },
    {
        "name": "Holding",
        "type": "string",
        "jsonPath": ".status.history[0].hold",
        "description": "Why the last decision held (Cooldown, ChangeFreeze, RolloutSlots, ...); empty after a change",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    # -o wide: what Recommend mode would set, and the traffic it judged
    {
        "name": "Rec-Tokens",
        "type": "integer",
        "jsonPath": ".status.recommendation.maxNumBatchedTokens",
        "description": "--max-num-batched-tokens the policy recommends",
        "priority": 1,
    },
    {
        "name": "Rec-Seqs",
        "type": "integer",
        "jsonPath": ".status.recommendation.maxNumSeqs",
        "description": "--max-num-seqs the policy recommends",
        "priority": 1,
    },
    {
        "name": "Regime",
        "type": "string",
        "jsonPath": ".status.regime",
        "description": "Traffic regime of the last observation (load level and length mix, or the tier)",
        "priority": 1,
    },
]

# JSON Schema keywords with no place in a structural CRD schema.
_DROPPED_KEYWORDS = {"title", "examples", "$defs"}


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline a ``$ref``, keeping sibling keywords (pydantic puts description and default beside it)."""
    if "$ref" not in schema:
        return schema
    target = defs[schema["$ref"].rsplit("/", 1)[-1]]
    merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return _resolve(merged, defs)


def _strip_optional(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """``anyOf: [X, {type: null}]`` -> X: an absent field is how Kubernetes says None."""
    options = schema.get("anyOf")
    if options is None:
        return schema
    non_null = [o for o in options if o.get("type") != "null"]
    if len(non_null) != 1:
        raise ValueError(f"cannot express a union in a structural schema: {schema}")
    merged = {**_resolve(non_null[0], defs), **{k: v for k, v in schema.items() if k != "anyOf"}}
    if merged.get("default", 0) is None:
        del merged["default"]
    return merged


def _minimal_default(value: Any, schema: dict[str, Any]) -> Any:
    """Drop keys of an object default that the nested schema would default to anyway."""
    if not isinstance(value, dict) or "properties" not in schema:
        return value
    out = {}
    for key, item in value.items():
        sub = schema["properties"].get(key, {})
        item = _minimal_default(item, sub)
        if item is None or item in ([], {}) or sub.get("default") == item:
            continue
        out[key] = item
    return out


def structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Translate one pydantic JSON Schema node into a structural OpenAPI v3.0 node."""
    schema = _strip_optional(_resolve(schema, defs), defs)
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROPPED_KEYWORDS:
            continue
        if key == "properties":
            out[key] = {name: structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = structural(value, defs)
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out[key] = structural(value, defs)
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out[key.replace("exclusive", "").lower()] = value
            out[key] = True
        else:
            out[key] = value
    if out.pop(OVERLAY, False):  # the apiserver then fills in none of its fields
        out = _without(out, "default")
    if "default" in out:
        out["default"] = _minimal_default(out["default"], out)
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return _ordered(out)


def _without(node: dict[str, Any], keyword: str) -> dict[str, Any]:
    """A schema node without the schema keyword ``keyword`` at any depth (a property of that name stays)."""
    out = {k: v for k, v in node.items() if k != keyword}
    if "properties" in out:
        out["properties"] = {name: _without(sub, keyword) for name, sub in out["properties"].items()}
    for nested in ("items", "additionalProperties"):
        if isinstance(out.get(nested), dict):
            out[nested] = _without(out[nested], keyword)
    return out


# Keywords first in this order (then any other, then the nested ones), so the
# committed YAML reads like a hand-written CRD: type and description on top.
_KEY_ORDER = ["type", "description", "default", "enum", "format", "pattern", "minLength", "maxLength",
              "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "minItems", "maxItems"]
_NESTED_LAST = ["properties", "additionalProperties", "items", "required"]


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    rank = {k: i for i, k in enumerate(_KEY_ORDER)}
    last = {k: i for i, k in enumerate(_NESTED_LAST)}
    return dict(sorted(node.items(), key=lambda kv: (kv[0] in last, last.get(kv[0], rank.get(kv[0], len(rank))))))


def _model_schema(model: type) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation", ref_template="#/$defs/{model}")
    return structural(raw, raw.get("$defs", {}))


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition object.

    The status schema has no CEL rules: status records what was observed, a
    config vLLM refuses included (knobs assumed from the defaults, a rollout
    that failed), and a rule there would make the apiserver refuse every
    status write of the operator (a 422 on each), freezing the status.
    """
    spec_schema = _model_schema(VllmTuningSpec)
    status_schema = _without(_model_schema(VllmTuningStatus), "x-kubernetes-validations")
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": resource.CRD_NAME},
        "spec": {
            "group": resource.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": resource.KIND,
                "listKind": f"{resource.KIND}List",
                "plural": resource.PLURAL,
                "singular": resource.SINGULAR,
                "shortNames": resource.SHORT_NAMES,
                "categories": resource.CATEGORIES,
            },
            "versions": [
                {
                    "name": resource.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": VllmTuning.__doc__,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string", "description": "APIVersion of this object."},
                                "kind": {"type": "string", "description": "Kind of this object: VllmTuning."},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def _fields(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every field beneath ``schema`` with its schema, by path: ``.name`` for a property, ``[]`` for a list's
    items, ``{}`` for a map's values."""
    for name, sub in (schema.get("properties") or {}).items():
        yield f"{path}.{name}", sub
        yield from _fields(sub, f"{path}.{name}")
    for key, mark in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(schema.get(key), dict):
            yield f"{path}{mark}", schema[key]
            yield from _fields(schema[key], f"{path}{mark}")


#: Bounds an older CRD may hold tighter than this version's: the apiserver refuses a whole write past them (422)
_UPPER_BOUNDS = ("maximum", "maxLength", "maxItems", "maxProperties")
_LOWER_BOUNDS = ("minimum", "minLength", "minItems", "minProperties")


def _narrower(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    """How ``theirs`` (a field's schema in the installed CRD) refuses what ``ours`` allows: values missing from its
    enum, a tighter bound; empty when it refuses nothing more."""
    if "enum" in theirs:
        if lacking := [value for value in ours.get("enum", ()) if value not in theirs["enum"]]:
            return f"values {', '.join(map(str, lacking))}"
    for keys, tighter in ((_UPPER_BOUNDS, lambda t, o: t < o), (_LOWER_BOUNDS, lambda t, o: t > o)):
        for key in keys:
            if key in theirs and (key not in ours or tighter(theirs[key], ours[key])):
                return f"{key} {theirs[key]}, not {ours.get(key, 'none')}"
    return ""


def stale_fields(installed: dict[str, Any]) -> list[str]:
    """The fields of this version's VllmTuning schema that ``installed`` (the CRD as the apiserver serves it) lacks
    or holds to narrower values, by path (``status.history[].hold``, ``status.lastRollout.phase (values
    Unverified)``), or the version itself: an older CRD, which ``helm upgrade`` leaves in place (Helm never
    upgrades a chart's crds/). The apiserver prunes a field its CRD lacks from every write, so an operator on it
    would lose the status it relies on between evaluations, and say nothing; a value past a narrower enum or bound
    fails the whole write. Below a node that keeps unknown fields nothing is pruned."""
    served = {v.get("name"): v for v in (installed.get("spec") or {}).get("versions") or []}
    if resource.VERSION not in served:
        return [f"version {resource.VERSION}"]
    return _stale((served[resource.VERSION].get("schema") or {}).get("openAPIV3Schema") or {})


def stale_in_openapi(document: dict[str, Any]) -> list[str]:
    """``stale_fields`` of the CRD from the OpenAPI v3 document of its group-version, as the apiserver publishes it
    at ``/openapi/v3/apis/<group>/<version>`` to every authenticated client, who may not be allowed to read the CRD.
    The VllmTuning schema there (``io.vllm-tuning.autotuner.v1alpha1.VllmTuning``, found by the kind it names) is
    the CRD's ``openAPIV3Schema`` as installed, extensions and defaults included, but for ``metadata`` (a ``$ref``
    to ObjectMeta, which ours leaves unspecified) and the descriptions of ``apiVersion`` and ``kind``.

    ``ValueError`` when the document holds no VllmTuning schema: the version is served (the caller asked discovery
    first), so the apiserver has not published it yet, or what answered is no apiserver's OpenAPI (a proxy's page):
    nothing is known of the CRD's fields, which a stale verdict would wrongly say to apply."""
    kind = {"group": resource.GROUP, "version": resource.VERSION, "kind": resource.KIND}
    schemas = (document.get("components") or {}).get("schemas") if isinstance(document, dict) else None
    for schema in (schemas or {}).values() if isinstance(schemas, dict) else ():
        if isinstance(schema, dict) and kind in schema.get("x-kubernetes-group-version-kind", ()):
            return _stale(schema)
    raise ValueError(f"the OpenAPI document published holds no {resource.KIND} schema")


def _stale(schema: dict[str, Any]) -> list[str]:
    """``stale_fields`` of the installed VllmTuning ``schema``, from the CRD or as published: the two differ nowhere
    it looks."""
    theirs = dict(_fields(schema, ""))
    covered = [path for path, sub in theirs.items() if sub.get("x-kubernetes-preserve-unknown-fields")]
    stale: list[str] = []
    for path, ours in _fields(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"], ""):
        if any(path.startswith((f"{top}.", f"{top}[", f"{top}{{")) for top in covered):
            continue
        if path not in theirs:
            stale.append(path.lstrip("."))
            covered.append(path)  # its own fields are missing with it: named once
        elif narrower := _narrower(ours, theirs[path]):
            stale.append(f"{path.lstrip('.')} ({narrower})")
    return stale


class _NoAliasDumper(yaml.SafeDumper):
    """Writes repeated sub-trees in full: a CRD with YAML anchors is valid but unreadable."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def crd_yaml() -> str:
    """The CRD as the YAML committed under crds/."""
    header = "# Generated by `vllm-autotuner crd` from operator/vllm_autotuner/api; do not edit.\n"
    return header + yaml.dump(crd(), Dumper=_NoAliasDumper, sort_keys=False, width=120)
