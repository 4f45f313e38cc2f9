"""The demo's live view: one line per simulated hour, and one per decision of the operator.

A line per event rather than a redrawn screen: it reads the same in a
terminal, in ``make demo | tee``, and in a test's captured output, and the
scroll-back is the story of the day. Each hourly line holds the demo clock,
the part of the day, the traffic offered to each Deployment, both
Deployments' knobs with their TTFT and ITL p95 over the past simulated hour
against the SLO in force, and the operator's latest decision. A change the
operator makes, and how its rollout ends, get a line of their own when they
happen.

:class:`LiveView` only formats and remembers what it has shown; :mod:`.run`
feeds it what it reads from the cluster and Prometheus.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from vllm_autotuner.api import SLO, Knobs
from vllm_autotuner.sim.demo.plan import STATIC, TUNED, DemoDay
from vllm_autotuner.sim.demo.report import Decision

MARK = {True: "ok", False: "MISS"}


@dataclass(frozen=True)
class Latency:
    """p95s of one Deployment over the past simulated hour (NaN: no data yet)."""

    ttft: float
    itl: float

    def within(self, slo: SLO) -> bool | None:
        if math.isnan(self.ttft) or math.isnan(self.itl):
            return None
        return self.ttft <= slo.ttft.seconds and self.itl <= slo.itl.seconds

    def text(self, slo: SLO) -> str:
        verdict = self.within(slo)
        ttft = "  -  " if math.isnan(self.ttft) else f"{self.ttft:5.2f}s"
        itl = "  -  " if math.isnan(self.itl) else f"{self.itl * 1000:4.0f}ms"
        return f"TTFT {ttft} ITL {itl} {'' if verdict is None else MARK[verdict]:4}"


def knobs_text(knobs: Knobs | None) -> str:
    return "?" if knobs is None else f"{knobs.max_num_batched_tokens}/{knobs.max_num_seqs}"


@dataclass
class LiveView:
    """What has been printed, so each decision and rollout is told once."""

    day: DemoDay
    width: int = field(default_factory=lambda: max(100, shutil.get_terminal_size((160, 24)).columns))
    decisions: list[Decision] = field(default_factory=list)
    _seen: set[tuple[str, str, str]] = field(default_factory=set)
    _rollout: tuple[str, str] | None = None
    _told: str = ""

    def header(self, slo: SLO) -> str:
        return (f"demo clock, part of the day, requests/s offered to each Deployment | knobs (tokens/seqs) and p95s "
                f"over the past simulated hour, against TTFT <= {slo.ttft.seconds:g}s and ITL <= "
                f"{slo.itl.seconds * 1000:g}ms by day; below, the operator's latest decision when it says something new")

    def hour_line(self, t: float, knobs: dict[str, Knobs | None], latency: dict[str, Latency], slo: SLO) -> str:
        """The numbers at ``t``, and the operator's latest decision on a line of its own when its reason is new."""
        offered = self.day.offered(t)
        traffic = " ".join(f"{name} {rate:4.1f}" for name, rate in offered.items() if rate > 0) or "idle"
        columns = [f"{self.day.clock(t)} {self.day.phase(t):12} {traffic:24}"]
        for name, label in ((TUNED, "tuned"), (STATIC, "static")):
            columns.append(f"{label} {knobs_text(knobs.get(name)):>10} {latency[name].text(slo)}")
        lines = [_clip(" | ".join(columns), self.width)]
        latest = self.decisions[-1] if self.decisions else None
        if latest is not None and latest.reason != self._told:
            self._told = latest.reason
            lines.append(_clip(f"      operator: {latest.action}: {latest.reason}", self.width))
        return "\n".join(lines)

    def new_decisions(self, status: dict[str, Any]) -> list[str]:
        """Lines for the decisions in ``status.history`` not seen before (Changes and Rollbacks; Holds kept quiet)."""
        lines = []
        for record in reversed(status.get("history") or []):  # oldest first
            key = (record["time"], record["action"], record["reason"])
            if key in self._seen:
                continue
            self._seen.add(key)
            decision = Decision(time=datetime.fromisoformat(record["time"]).timestamp(), action=record["action"],
                                knobs=f"{record['maxNumBatchedTokens']}/{record['maxNumSeqs']}",
                                reason=record["reason"])
            self.decisions.append(decision)
            if decision.action != "Hold":
                lines.append(_clip(f"{self.day.clock(decision.time)} >>> operator: {decision.action} to "
                                   f"{decision.knobs}: {decision.reason}", self.width))
        self.decisions.sort(key=lambda d: d.time)
        rollout = status.get("lastRollout")
        if rollout and rollout.get("finishedAt") and self._rollout != (rollout["startedAt"], rollout["phase"]):
            self._rollout = (rollout["startedAt"], rollout["phase"])
            took = (datetime.fromisoformat(rollout["finishedAt"]) - datetime.fromisoformat(rollout["startedAt"]))
            to = rollout["to"]
            lines.append(f"{self.day.clock(datetime.fromisoformat(rollout['finishedAt']).timestamp())} >>> rollout to "
                         f"{to['maxNumBatchedTokens']}/{to['maxNumSeqs']} {rollout['phase']} after "
                         f"{took.total_seconds():.0f}s (a simulated {took.total_seconds() / self.day.hour * 60:.0f} "
                         f"min) {rollout.get('message') or ''}".rstrip())
        return lines


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
