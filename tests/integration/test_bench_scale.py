"""The scale benchmark runs end to end at toy size (``make bench-scale QUICK=1``).

Not a timing test: it proves that the benchmark starts its servers, gets
the operator through start-up and measured periods in every mode (batched,
capped, naive), and writes its report, and that what it counts is what the
modes promise (one query per metric family per period batched and capped,
one per family per tuning naive). Its own control plane, Prometheus and stand-in fleet, so it needs
no fixture.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_autotuner.observe.queries import FAMILIES
from vllm_autotuner.sim import localenv

pytestmark = pytest.mark.integration

TUNINGS = 4  # the quick run's size


def test_quick_run_measures_both_modes(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "bench.scale", "--quick", "--out", str(tmp_path)],
                            cwd=localenv.ROOT, env={**os.environ, "PYTHONPATH": str(localenv.ROOT)},
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| 4 | naive / batched |" in result.stdout
    assert (tmp_path / "scale.md").read_text().startswith("# Operator scale benchmark")
    report = json.loads((tmp_path / "scale.json").read_text())
    assert report["command"] == "make bench-scale QUICK=1"
    assert report["machine"]["cores"] == os.cpu_count() and report["machine"]["memory_gib"] > 0, report["machine"]
    [size] = report["sizes"]
    assert size["tunings"] == TUNINGS
    for mode, per_tuning in (("batched", 0), ("capped", 0), ("naive", 1)):
        periods = size["runs"][mode]["periods"]
        assert len(periods) == 2, mode
        for period in periods:
            assert period["evaluated"] == TUNINGS * period["ticks"], (mode, period)
            expected = len(FAMILIES) * (period["evaluated"] if per_tuning else period["ticks"])
            assert period["queries"] == expected, (mode, period)
            assert period["api_calls_by_kind"].get("patch vllmtunings/status") and period["api_seconds"] > 0, (
                mode, period)
            assert period["cpu_seconds"] > 0 and period["rss_mib"] > 0, (mode, period)
