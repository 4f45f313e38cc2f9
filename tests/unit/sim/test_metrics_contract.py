"""The exporter against a real vLLM 0.32 scrape (vllm-metrics.txt).

Both texts go through prometheus-client's parser; every family of the real
scrape must be served with the same type, HELP, label names and histogram
bounds, and nothing else may be served. The simulated engine runs with the
real server's max_model_len (256), which sets the token-count buckets.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from tests.unit.sim.helpers import random_requests
from vllm_autotuner.observe.queries import FAMILIES, SERVER_LABELS, Kind
from vllm_autotuner.sim.engine import Engine, EngineConfig
from vllm_autotuner.sim.metrics import OLD_NAMES, VllmCollector, server_info
from vllm_autotuner.sim.profiles import get_profile

# A copy of the project's shared/vllm-metrics.txt (a real vLLM 0.32 scrape).
REAL_SCRAPE = Path(__file__).parent / "data" / "vllm-metrics.txt"


def _families(text: str) -> dict[str, dict[str, object]]:
    """name -> type, HELP, the label-name sets of its samples, and per
    histogram the ``le`` bounds."""
    out: dict[str, dict[str, object]] = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = {
            "type": family.type,
            "help": family.documentation,
            "labels": sorted({tuple(sorted(set(s.labels) - {"le"})) for s in family.samples}),
            "le": [s.labels["le"] for s in family.samples if "le" in s.labels],
            "samples": sorted({s.name for s in family.samples}),
        }
    return out


def _served(old_names: bool = False, mfu: bool = False) -> str:
    engine = Engine(
        get_profile("llama3-8b-h100"),
        EngineConfig(max_model_len=256, max_num_batched_tokens=512, max_num_seqs=8, enable_mfu_metrics=mfu),
        seed=3,
    )
    for request in random_requests(50, 20, 1, prompt=100, output=60, max_prompt=120, max_output=120):
        engine.submit(request)
    engine.advance(30)
    registry = CollectorRegistry()
    registry.register(VllmCollector(engine.snapshot, server_info(engine, created=1.7e9), old_names=old_names))
    return generate_latest(registry).decode()


@pytest.fixture(scope="module")
def real() -> dict[str, dict[str, object]]:
    return _families(REAL_SCRAPE.read_text())


def test_served_families_equal_the_real_scrape(real: dict[str, dict[str, object]]) -> None:
    assert sorted(_families(_served())) == sorted(real)


@pytest.mark.parametrize("field", ["type", "help", "labels", "le", "samples"])
def test_each_field_matches(real: dict[str, dict[str, object]], field: str) -> None:
    served = _families(_served())
    mismatched = {
        name: (served[name][field], family[field])
        for name, family in real.items()
        if name in served and served[name][field] != family[field]
    }
    assert mismatched == {}


def test_old_names_serve_the_renamed_families(real: dict[str, dict[str, object]]) -> None:
    served = _families(_served(old_names=True))
    assert "vllm:num_requests_waiting_by_reason" not in served  # newer than the renames
    for new, (old, help_text) in OLD_NAMES.items():
        assert new not in served
        assert served[old]["type"] == real[new]["type"]
        assert served[old]["help"] == help_text
        assert served[old]["le"] == real[new]["le"]


def test_the_operators_label_matchers_name_values_a_real_server_exports() -> None:
    # a family's matchers select series of its newest metric: a value vLLM does not export would leave every pod to
    # the older spelling's fallback (all waiting requests), or to nothing
    values = {(s.name, label, value) for family in text_string_to_metric_families(REAL_SCRAPE.read_text())
              for s in family.samples for label, value in s.labels.items()}
    matched = [(f.metrics[0], label, value) for f in FAMILIES for label, value in f.match]
    assert matched and [m for m in matched if m not in values] == []


def test_a_pods_series_differ_in_no_label_of_a_real_server_but_those_the_operator_tells_apart() -> None:
    # the operator takes two series of one pod that agree in vLLM's own labels (SERVER_LABELS), ``le`` and those its
    # family groups by or matches for copies, scraped twice, and counts them once: a label vLLM adds to a metric the
    # operator sums would make parts of a pod's count look like copies of each other
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(REAL_SCRAPE.read_text()):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    summed = [f for f in FAMILIES if f.kind in (Kind.RATE, Kind.BUCKETS, Kind.AVERAGE)]
    unknown = {metric: labels[metric] - {*SERVER_LABELS, "le", f.part_label, *(label for label, _ in f.match)}
               for f in summed for metric in (*f.metrics, *(p.counter for p in f.parts if p.counter))
               if metric in labels}
    assert len(unknown) > len(summed) // 2 and {m: u for m, u in unknown.items() if u} == {}


def _samples(text: str) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels.get("finished_reason", "")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_served_values_follow_the_engine() -> None:
    samples = _samples(_served())
    finished = samples[("vllm:request_success_total", "length")]
    assert finished > 0
    assert all(samples[("vllm:request_success_total", r)] == 0 for r in ("stop", "abort", "error", "repetition"))
    assert samples[("vllm:e2e_request_latency_seconds_count", "")] == finished
    assert samples[("vllm:generation_tokens_total", "")] >= samples[("vllm:request_generation_tokens_sum", "")]
    assert samples[("vllm:request_params_n_count", "")] == finished


def test_mfu_counters_count_only_when_asked() -> None:
    """vLLM serves its estimated FLOPs and bytes at 0 unless started with --enable-mfu-metrics (the reference
    scrape's are 0)."""
    mfu = ("vllm:estimated_flops_per_gpu_total", "vllm:estimated_read_bytes_per_gpu_total",
           "vllm:estimated_write_bytes_per_gpu_total")
    off, on = _samples(_served()), _samples(_served(mfu=True))
    assert [off[(name, "")] for name in mfu] == [0, 0, 0]
    assert all(on[(name, "")] > 0 for name in mfu)
