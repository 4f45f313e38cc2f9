"""A spec made invalid during the operator's rollout still has that rollout seen through.

What admission cannot check (a time zone, a cron expression) makes the spec
invalid and stops every change, but the rollout the last valid spec started
is the operator's own: it is judged as before, so that it is rolled back if
its pods crash-loop and recorded when they are all Ready. The reconciler is
driven with the stand-ins of ``test_reconcile_rollout``.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.controller import test_reconcile_rollout as harness

from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.reconcile import OperatorSettings, Reconciler


@pytest.mark.parametrize("zone", ["Mars/Olympus", "America"])  # the second: a folder of the zone database
def test_a_rollout_in_progress_is_judged_while_the_spec_is_invalid(zone: str) -> None:
    cache = harness.cache()  # halfway through our rollout to 4096 tokens and 64 sequences
    tuning = cache.tunings[("llm", "llama")]
    tuning["spec"]["schedules"] = [{"name": "night", "timeZone": zone, "start": "0 22 * * *",
                                    "end": "0 6 * * *", "knobs": {"maxNumBatchedTokens": 8192, "maxNumSeqs": 64}}]
    deployment = cache.deployment("llm", "llama")
    deployment["status"].update(updatedReplicas=2, availableReplicas=2)  # now every pod of the new config is Ready
    reconciler = Reconciler(harness.Kube(), cache, harness.Windows(harness.window(())),  # type: ignore[arg-type]
                            OperatorMetrics(), OperatorSettings())
    report = asyncio.run(reconciler.evaluate(("llm", "llama"), harness.NOW.timestamp(), write=False))
    assert report is not None and report.decision is None  # no decision: nothing new is changed
    (ready,) = [c for c in report.state.conditions if c.type == "Ready"]
    assert (ready.status, ready.reason) == ("False", "InvalidSpec") and repr(zone) in ready.message
    rollout = report.state.last_rollout
    assert rollout is not None and rollout.phase == "Succeeded"
    assert report.state.current.max_num_batched_tokens == 4096
