"""The VllmTuning models and the CRD generated from them."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from tests.bad_specs import BAD_SPECS

from vllm_autotuner.api import VllmTuning, VllmTuningSpec
from vllm_autotuner.api.crd import crd, crd_yaml, stale_fields, stale_in_openapi
from vllm_autotuner.api.types import duration_seconds, format_duration, time_zone
from vllm_autotuner.cli import main

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "vllmtunings.autotuner.vllm-tuning.io.yaml"
META = "io.k8s.apimachinery.pkg.apis.meta.v1"


def _version(doc):
    return doc["spec"]["versions"][0]


def test_committed_crd_is_the_generated_one(capsys):
    assert main(["crd"]) == 0
    out = capsys.readouterr().out
    assert out == CRD_FILE.read_text(), "crds/ is stale: run `make crd` and commit the result"
    assert out == crd_yaml()


def test_an_installed_crd_older_than_the_operator_is_named_by_the_fields_it_lacks_or_narrows():
    """``helm upgrade`` leaves the old CRD: the apiserver would drop the fields it lacks from every status write, and
    refuse a whole write with a value its narrower enum or bound refuses."""
    installed = yaml.safe_load(CRD_FILE.read_text())
    assert stale_fields(installed) == []
    schema = _version(installed)["schema"]["openAPIV3Schema"]
    status = schema["properties"]["status"]["properties"]
    del status["lastRollout"]["properties"]["to"]  # a field and everything beneath it: named once
    status["lastRollout"]["properties"]["phase"]["enum"].remove("Unverified")  # a value added since
    del status["history"]["items"]["properties"]["hold"]  # a field of a list's items
    status["history"]["maxItems"] //= 2
    del schema["properties"]["spec"]["properties"]["engine"]["properties"]["gpuMemoryGib"]
    ours = _version(crd())["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["history"]
    assert sorted(stale_fields(installed)) == [
        "spec.engine.gpuMemoryGib", f"status.history (maxItems {ours['maxItems'] // 2}, not {ours['maxItems']})",
        "status.history[].hold", "status.lastRollout.phase (values Unverified)", "status.lastRollout.to"]
    status["history"] = {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    assert sorted(stale_fields(installed)) == [  # beneath history, what is written is kept
        "spec.engine.gpuMemoryGib", "status.lastRollout.phase (values Unverified)", "status.lastRollout.to"]
    _version(installed)["name"] = "v1alpha0"
    assert stale_fields(installed) == ["version v1alpha1"]


def published(installed: dict) -> dict:
    """The OpenAPI v3 document the apiserver publishes at /openapi/v3/apis/autotuner.vllm-tuning.io/v1alpha1 for
    the CRD ``installed``, in what sets it apart from the CRD's schema (read from a real apiserver): metadata is a
    $ref to ObjectMeta, the kinds are named by an extension, the List kind comes with it."""
    schema = copy.deepcopy(_version(installed)["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"allOf": [{"$ref": f"#/components/schemas/{META}.ObjectMeta"}]}
    kind = {"group": "autotuner.vllm-tuning.io", "version": "v1alpha1"}
    return {"openapi": "3.0.0", "components": {"schemas": {
        f"{META}.ObjectMeta": {"type": "object", "properties": {"name": {"type": "string"}}},
        "io.vllm-tuning.autotuner.v1alpha1.VllmTuning": {
            **schema, "x-kubernetes-group-version-kind": [{**kind, "kind": "VllmTuning"}]},
        "io.vllm-tuning.autotuner.v1alpha1.VllmTuningList": {
            "type": "object", "required": ["items"], "properties": {"items": {"type": "array", "items": {
                "$ref": "#/components/schemas/io.vllm-tuning.autotuner.v1alpha1.VllmTuning"}}},
            "x-kubernetes-group-version-kind": [{**kind, "kind": "VllmTuningList"}]}}}}


def test_an_older_crd_is_found_by_the_schema_the_apiserver_publishes_from_it():
    """A client not allowed to read the CRD judges it by its published OpenAPI v3 schema, the same way."""
    installed = yaml.safe_load(CRD_FILE.read_text())
    assert stale_in_openapi(published(installed)) == []
    status = _version(installed)["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    del status["learned"]
    status["lastRollout"]["properties"]["phase"]["enum"].remove("Unverified")
    assert stale_in_openapi(published(installed)) == stale_fields(installed) == [
        "status.lastRollout.phase (values Unverified)", "status.learned"]
    document = published(installed)
    del document["components"]["schemas"]["io.vllm-tuning.autotuner.v1alpha1.VllmTuning"]
    for unknown in (document, "<html>sign in</html>", [], {"components": {"schemas": []}}):
        # not published yet, or no apiserver's OpenAPI: nothing known, not a CRD lacking its version
        with pytest.raises(ValueError, match="holds no VllmTuning schema"):
            stale_in_openapi(unknown)  # type: ignore[arg-type]


def test_crd_identity_subresource_and_columns():
    doc = yaml.safe_load(CRD_FILE.read_text())
    assert doc["metadata"]["name"] == "vllmtunings.autotuner.vllm-tuning.io"
    names = doc["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"], names["categories"]) == (
        "VllmTuning",
        "vllmtunings",
        ["vlt"],
        ["all", "vllm"],
    )
    version = _version(doc)
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Target",
        "Mode",
        "Tokens",
        "Seqs",
        "Schedule",
        "Ready",
        "Holding",
        "Age",
        "Rec-Tokens",
        "Rec-Seqs",
        "Regime",
    ]


def _walk(node, path="spec"):
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural_and_every_spec_field_is_described():
    spec = _version(crd())["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for path, node in _walk(spec):
        assert "$ref" not in node and "anyOf" not in node and "title" not in node, path
        assert "type" in node, f"{path} has no type"
        assert node.get("additionalProperties") is not False, path
        if not path.endswith("{}"):
            assert node.get("description"), f"{path} has no description"


def _rules(node):
    return [v["rule"] for v in node.get("x-kubernetes-validations", [])]


def test_cel_rules_cover_what_one_field_cannot_say():
    spec = _version(crd())["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    bounds = spec["bounds"]
    assert any(r.endswith("self.maxNumBatchedTokens.min >= self.maxNumSeqs.min") for r in _rules(bounds))
    assert any(r.endswith("self.min <= self.max") for r in _rules(bounds["properties"]["maxNumBatchedTokens"]))
    assert any(r.endswith("self.min <= self.max") for r in _rules(bounds["properties"]["maxNumSeqs"]))
    assert any("Tiers" in r for r in _rules(spec["traffic"]))
    schedule = spec["schedules"]["items"]
    assert any("has(self.knobs)" in r for r in _rules(schedule))
    assert "self.start != self.end" in _rules(schedule)
    assert spec["schedules"]["x-kubernetes-list-map-keys"] == ["name"]
    assert "pattern" in schedule["properties"]["timeZone"] and "pattern" in schedule["properties"]["start"]
    assert "pattern" in spec["traffic"]["properties"]["window"]
    freeze = spec["rollout"]["properties"]["freezes"]
    assert "self.start != self.end" in _rules(freeze["items"]) and "has(self.knobs)" not in " ".join(
        _rules(freeze["items"]))
    assert freeze["x-kubernetes-list-map-keys"] == ["name"] and "pattern" in freeze["items"]["properties"]["end"]


def test_schedules_and_freezes_the_apiserver_could_not_check_are_named_as_spec_problems():
    from vllm_autotuner.controller.reconcile import spec_problems

    window = {"name": "peak", "timeZone": "Mars/Olympus_Mons", "start": "0 9 * * *", "end": "0 61 * * *"}
    spec = VllmTuningSpec.model_validate({"targetRef": {"name": "llama"}, "rollout": {"freezes": [window]},
                                          "schedules": [{**window, "slo": {"itl": {"seconds": 0.05}}}]})
    problems = spec_problems(spec)
    assert [p.split(":")[0] for p in problems] == [
        "spec.schedules[peak].timeZone", "spec.schedules[peak].end",
        "spec.rollout.freezes[peak].timeZone", "spec.rollout.freezes[peak].end"], problems


def test_a_window_whose_end_fires_whenever_its_start_does_is_a_spec_problem():
    from vllm_autotuner.controller.reconcile import spec_problems

    never = {"name": "never", "start": "0 22 * * *", "end": "00 22 * * 0-6"}  # not the same text: admission took it
    december = {"name": "december", "start": "0 22 * * *", "end": "0 22 * 1-11 *"}  # open in December only
    spec = VllmTuningSpec.model_validate({"targetRef": {"name": "llama"}, "rollout": {"freezes": [never, december]},
                                          "schedules": [{**never, "slo": {"itl": {"seconds": 0.05}}}]})
    assert spec_problems(spec) == [
        f"spec.{path}[never].end: '00 22 * * 0-6' fires whenever start '0 22 * * *' does, so the window is never "
        "open: give it an end after its start" for path in ("schedules", "rollout.freezes")]
    # open at weekends, in December, an hour a day: none of them is said never to open
    opening = [("*/15 * * * *", "*/15 * * * 1-5"), ("0 * * * *", "0 * * 1-11 *"), ("* * * * *", "* 0-22 * * *")]
    freezes = [{"name": f"w{i}", "start": start, "end": end} for i, (start, end) in enumerate(opening)]
    assert spec_problems(VllmTuningSpec.model_validate({"targetRef": {"name": "llama"},
                                                        "rollout": {"freezes": freezes}})) == []


def test_a_schedules_bounds_that_do_not_fit_over_spec_bounds_are_a_spec_problem():
    from vllm_autotuner.controller.reconcile import spec_problems

    night = {"name": "night", "start": "0 22 * * *", "end": "0 6 * * *",
             "bounds": {"maxNumBatchedTokens": {"min": 16384}, "maxNumSeqs": {"min": 32}}}
    spec = VllmTuningSpec.model_validate({"targetRef": {"name": "llama"}, "schedules": [night], "bounds": {
        "maxNumBatchedTokens": {"min": 16, "max": 8192}, "maxNumSeqs": {"max": 64}}})
    assert spec_problems(spec) == [
        "spec.schedules[night].bounds over spec.bounds: maxNumBatchedTokens.min 16384 > maxNumBatchedTokens.max 8192"]
    wider = VllmTuningSpec.model_validate({"targetRef": {"name": "llama"}, "schedules": [night]})
    assert spec_problems(wider) == []  # the same window over spec.bounds that leave room for it
    low = VllmTuningSpec.model_validate({"targetRef": {"name": "llama"}, "schedules": [
        {**night, "bounds": {"maxNumSeqs": {"min": 64, "max": 128}}}], "bounds": {"maxNumBatchedTokens": {"min": 32}}})
    assert spec_problems(low) == ["spec.schedules[night].bounds over spec.bounds: maxNumBatchedTokens.min 32 < "
                                  "maxNumSeqs.min 64 (vLLM needs max_num_batched_tokens >= max_num_seqs)"]


def test_crd_defaults_fill_nested_objects():
    spec = _version(crd())["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["rollout"]["default"] == {}
    assert spec["rollout"]["properties"]["cooldown"]["default"] == "15m"
    assert spec["slo"]["properties"]["ttft"]["default"] == {"seconds": 2.0}
    assert spec["mode"]["enum"] == ["Auto", "Recommend", "Paused"]


MINIMAL = {
    "apiVersion": "autotuner.vllm-tuning.io/v1alpha1",
    "kind": "VllmTuning",
    "metadata": {"name": "chat", "namespace": "llm"},
    "spec": {"targetRef": {"name": "llama"}},
}


def test_a_schedules_overlay_is_written_back_as_given():
    night = {"name": "night", "start": "0 22 * * *", "end": "0 6 * * *",
             "bounds": {"maxNumSeqs": {"max": 64}}, "slo": {"ttft": {"seconds": 10}}}
    obj = VllmTuning.from_object({**MINIMAL, "spec": {**MINIMAL["spec"], "schedules": [night]}})
    (written,) = obj.to_object()["spec"]["schedules"]
    assert (written["bounds"], written["slo"]) == (night["bounds"], night["slo"])  # no default to override the spec's
    again = VllmTuning.from_object(obj.to_object())
    assert again.spec.schedules[0].bounds.model_fields_set == {"max_num_seqs"}


def test_minimal_object_gets_documented_defaults():
    obj = VllmTuning.from_object(MINIMAL)
    spec = obj.spec
    assert spec.mode == "Auto" and spec.traffic.strategy == "Adaptive"
    assert (spec.bounds.max_num_batched_tokens.min, spec.bounds.max_num_batched_tokens.max) == (256, 32768)
    assert spec.slo.itl.seconds == 0.1 and spec.slo.ttft.quantile == 0.95
    assert spec.prometheus.query_offset == "2s"
    assert obj.to_object()["spec"]["targetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama",
                                                   "ignoreController": False}


@pytest.mark.parametrize(
    "patch",
    [
        {"mode": "Sometimes"},
        {"traffic": {"window": "five minutes"}},
        {"traffic": {"window": "1s"}},
        {"traffic": {"evaluationInterval": "500ms"}},
        {"prometheus": {"queryOffset": "2m"}},  # past what the staleness limit leaves
        {"prometheus": {"headers": {"AUTHORIZATION": "Basic eDp5"}}},  # credentials belong in a Secret
        {"prometheus": {"headers": {"X-Scope-OrgID": "a\nX-Admin: 1"}}},  # one header becomes two
        {"prometheus": {"headers": {f"X-{i}": "1" for i in range(9)}}},
        {"prometheus": {"basicAuth": {"username": {"name": "p", "key": "user"}}}},
        {"bounds": {"maxNumSeqs": {"min": 0}}},
        {
            "schedules": [
                {
                    "name": "night",
                    "start": "0 22 * *",
                    "end": "0 6 * * *",
                    "knobs": {"maxNumBatchedTokens": 8, "maxNumSeqs": 4},
                }
            ]
        },
        {"unknownField": 1},
    ],
)
def test_bad_specs_are_rejected_by_the_models(patch):
    with pytest.raises(ValidationError):
        VllmTuningSpec.model_validate({"targetRef": {"name": "llama"}, **patch})


def test_durations_and_zones():
    assert duration_seconds("1h30m") == 5400 and duration_seconds("250ms") == 0.25
    assert format_duration(5400) == "1h30m" and format_duration(0) == "0s"
    with pytest.raises(ValueError, match="e.g. 30s"):
        duration_seconds("5 minutes")
    assert str(time_zone("Europe/Berlin")) == "Europe/Berlin"
    for unknown in ("Mars/Olympus_Mons", "America", "Etc"):  # the last two: folders of the zone database
        with pytest.raises(ValueError, match="IANA"):
            time_zone(unknown)


#: How the apiserver words what the models refuse in their own words (pydantic's): an unknown enum value, a
#: missing field, a wrong type, a key a CEL rule checks and the models' key type refuses.
_APISERVER_WORDS = ("Unsupported value", "Required value", "must be of type", "keys must be")


@pytest.mark.parametrize(("spec", "field", "reason"), BAD_SPECS)
def test_the_models_refuse_what_admission_refuses(spec, field, reason):
    """Every spec the CRD refuses (``tests/bad_specs.py``, checked on a real apiserver by the integration test) is
    refused by the models too, with the CEL rule's own words where it is one."""
    with pytest.raises(ValidationError) as refused:
        VllmTuningSpec.model_validate(spec)
    if not reason.startswith(_APISERVER_WORDS):
        assert reason in str(refused.value), str(refused.value)
