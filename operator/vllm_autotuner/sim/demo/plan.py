"""The demo's compressed day: its clock, its traffic, and the objects it creates.

A day is what the operator's work needs to be seen: traffic that rises and
falls, a mix of requests that changes under its feet, and a night window with
other targets. The demo squeezes 24 simulated hours into ``duration`` seconds
of wall-clock time. What belongs to the day is scaled by that factor: the
traffic's shape, the schedule window, and the VllmTuning's observation
window, evaluation interval, cooldown and settle time. What belongs to the
machines is not: the simulated
engines run in real time, so a request's TTFT and inter-token latency are
what an H100 would give it, and a rolling restart takes the seconds the
fleet's start-up takes.

The traffic (rates per vLLM replica; the Deployments have two):

* 06:00-09:00 morning ramp: chat from 1.5 to 12 requests/s.
* 09:00-12:00 chat peak: 14 requests/s.
* 12:00-18:00 RAG: the document assistant's busy hours, questions with
  4k-token prompts answered in a few paragraphs (256 tokens on average) at
  4.8 requests/s, and a little chat (0.5 requests/s). vLLM's default budget
  of 8192 tokens lets one step carry whole long prompts, and every decoding
  request waits for that step (~0.15 s): a stream stalls every few tokens
  and misses the inter-token latency target. A budget of 2048 chunks the
  prompts and keeps every step near 70 ms.
* 18:00-22:00 evening: chat falling from 7 to 3 requests/s.
* 22:00-06:00 night: chat at 1.5 requests/s, and a batch summarisation job
  (3k-token documents) at 2.5 requests/s in the nightly window.

Loads sit where the knobs matter and nothing saturates: about 80 % of a
replica's capacity in the RAG hours (capacity measured by
``sim.capacity.saturation_rate``: ~30 chat or ~5.9 RAG requests/s on the H100
profile, whatever the budget), half of it at the chat peak, where any sane
config meets the SLO. (A first version answered RAG questions in 128 tokens:
its six RAG hours then carried a sixth of the day's tokens, and even a
policy at the best config from the first RAG request could not have passed
1.2x the static Deployment's SLO goodput over the day.) Each period's traffic sits clearly inside one of the
policy's traffic regimes (rate, prompt and output length binned in powers
of two, with hysteresis), not on a boundary where the noise of a short
window would make the regime flap and restart the policy's wait.

The VllmTuning is what a platform team writes for interactive chat: TTFT p95
within 2 s (a 4k-token prompt must be read first) and ITL p95 within 75 ms
(13 tokens per second, faster than people read), and the bounds of
deploy/examples/chat.yaml (1024-16384 tokens, 32-512 sequences: vLLM's
default of 1024 sequences is more than an 8B model's KV cache on one H100
holds at these context lengths). The night window relaxes the SLO for the
batch job, whose requests only need to finish (TTFT 30 s, ITL 250 ms), and
asks for big steps (a budget of 16384 tokens) for its throughput.

Cron has minute resolution, so the night window opens and closes at the whole
wall-clock minutes nearest to 00:00 and 04:00 on the demo's clock, and the
batch job runs exactly while it is open (clipped to the end of the day).

Everything here is pure; :mod:`.run` creates the objects and sends the
traffic.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import yaml

from vllm_autotuner.api import API_VERSION, KIND, VllmTuningSpec
from vllm_autotuner.sim.fleet import FLEET_LABEL
from vllm_autotuner.sim.localenv import ROOT
from vllm_autotuner.sim.workload import (
    CHAT,
    SUMMARIZATION,
    LengthDist,
    Mix,
    Phase,
    Piecewise,
    Poisson,
    RequestClass,
    Scenario,
    Stream,
)

NAMESPACE = "vllm-demo"
TUNED = "llama-3-8b-tuned"
STATIC = "llama-3-8b-static"
REPLICAS = 2
PROFILE = "llama3-8b-h100"
FLEET_PREFIX = "demo"
FLEET_NODES = 2 * REPLICAS + 2
"""Both Deployments' pods, a surge pod for a rolling update, and one spare."""
FLEET_TIME_SCALE = 0.05
"""vLLM pods start in a twentieth of the real time: 5 s for a cold 8B start on an H100."""
EXAMPLE = ROOT / "deploy" / "examples" / "vllm-llama-3-8b.yaml"
"""The vLLM Deployment the demo runs twice, as users find it in the repository."""

DAY_START_HOUR = 6.0
HOURS = 24.0
QUARTER = 0.25
"""Traffic rates change in steps of a quarter of a simulated hour."""
CHAT_RATE = ((6.0, 1.5), (9.0, 12.0), (9.5, 14.0), (12.0, 14.0), (12.0, 0.5), (18.0, 0.5), (18.0, 7.0),
             (22.0, 3.0), (22.5, 1.5), (30.0, 1.5))
"""Chat requests/s per replica through the day, as (hour, rate) points joined by straight lines;
hours past 24 are the next morning."""
RAG_HOURS, RAG_RATE = (12.0, 18.0), 4.8
DOCUMENT_QA = Mix("rag", (RequestClass("rag", LengthDist(4096, 0.3, 1024, 7680), LengthDist(256, 0.5, 16, 1024)),))
"""The document assistant's requests: retrieved passages in the prompt, an answer of a few paragraphs."""
BATCH_HOURS, BATCH_RATE = (24.0, 28.0), 2.5
PHASES = (("morning ramp", 6.0, 9.0), ("chat peak", 9.0, 12.0), ("RAG", 12.0, 18.0), ("evening", 18.0, 22.0),
          ("night", 22.0, 30.0))

CHAT_SLO = {"ttft": {"quantile": 0.95, "seconds": 2.0}, "itl": {"quantile": 0.95, "seconds": 0.075}}
BATCH_SLO = {"ttft": {"quantile": 0.95, "seconds": 30.0}, "itl": {"quantile": 0.95, "seconds": 0.25}}
BOUNDS = {"maxNumBatchedTokens": {"min": 1024, "max": 16384}, "maxNumSeqs": {"min": 32, "max": 512}}
NIGHT_BOUNDS = {"maxNumBatchedTokens": {"min": 16384, "max": 16384}, "maxNumSeqs": {"min": 256, "max": 512}}
NIGHT_WINDOW = "nightly-batch"
PRE_ROLL_S = 30
"""Long enough for a rolling restart of both replicas on the fleet (two start-ups of ~5 s, plus probes)."""
PROGRESS_DEADLINE_S = 120
MAX_STEP_FACTOR = 4
MIN_DURATION_S = 180.0
MIN_WINDOW_S = 6.0


@dataclass(frozen=True)
class DemoDay:
    """One compressed day: 06:00 at ``start`` (Unix seconds), 06:00 the next morning ``duration`` seconds later."""

    start: float
    duration: float
    window: tuple[float, float]
    """Unix times the nightly window opens and closes: whole minutes."""

    @classmethod
    def plan(cls, start: float, duration: float) -> DemoDay:
        """The day starting now; ``duration`` of at least :data:`MIN_DURATION_S`."""
        if duration < MIN_DURATION_S:
            raise ValueError(f"a day needs at least {MIN_DURATION_S:g}s (3m): the operator observes one simulated "
                             "hour at a time, and a rolling restart takes ~15s")
        hour = duration / HOURS
        opens = 60 * round((start + (BATCH_HOURS[0] - DAY_START_HOUR) * hour) / 60)
        closes = max(60 * round((start + (BATCH_HOURS[1] - DAY_START_HOUR) * hour) / 60), opens + 60)
        return cls(start, duration, (opens, closes))

    @property
    def end(self) -> float:
        return self.start + self.duration

    @property
    def hour(self) -> float:
        """Wall-clock seconds per simulated hour."""
        return self.duration / HOURS

    def hours(self, t: float) -> float:
        """The demo clock at Unix time ``t``: hours since the first midnight (6.0 at the start, 30.0 at the end)."""
        return DAY_START_HOUR + (t - self.start) / self.hour

    def at(self, hours: float) -> float:
        """The Unix time at which the demo clock shows ``hours``."""
        return self.start + (hours - DAY_START_HOUR) * self.hour

    def clock(self, t: float) -> str:
        """``HH:MM`` on the demo clock."""
        minutes = int(self.hours(t) * 60) % (24 * 60)
        return f"{minutes // 60:02d}:{minutes % 60:02d}"

    def phases(self) -> list[Phase]:
        """The named parts of the day, in seconds from the start."""
        return [Phase(name, self.at(lo) - self.start, self.at(hi) - self.start) for name, lo, hi in PHASES]

    def phase(self, t: float) -> str:
        hours = self.hours(t)
        return next((name for name, lo, hi in PHASES if lo <= hours < hi), "")

    # --- traffic -----------------------------------------------------------------------------------

    def chat_steps(self) -> list[tuple[float, float]]:
        """(seconds from the start, chat requests/s per replica) at each quarter hour."""
        steps = []
        for k in range(int(HOURS / QUARTER)):
            middle = DAY_START_HOUR + (k + 0.5) * QUARTER
            steps.append((k * QUARTER * self.hour, _interpolate(CHAT_RATE, middle)))
        return steps

    def batch_span(self) -> tuple[float, float]:
        """Seconds from the start during which the batch job runs: the night window, within the day."""
        return self.window[0] - self.start, min(self.window[1], self.end) - self.start

    def scenario(self) -> Scenario:
        """The requests one Deployment gets (both get the same), timed in seconds from the start."""
        rag = (self.at(RAG_HOURS[0]) - self.start, self.at(RAG_HOURS[1]) - self.start)
        streams = [
            Stream(Piecewise(tuple((t, rate * REPLICAS) for t, rate in self.chat_steps())), CHAT, 0.0, self.duration),
            Stream(Poisson(RAG_RATE * REPLICAS), DOCUMENT_QA, *rag),
        ]
        batch = self.batch_span()
        if batch[1] > batch[0]:
            streams.append(Stream(Poisson(BATCH_RATE * REPLICAS), SUMMARIZATION, *batch))
        return Scenario("demo-day", tuple(streams), tuple(self.phases()), self.duration)

    def offered(self, t: float) -> dict[str, float]:
        """Requests/s each stream sends to one Deployment at Unix time ``t``."""
        since = t - self.start
        chat = next((rate for start, rate in reversed(self.chat_steps()) if start <= since), 0.0)
        hours = self.hours(t)
        batch = self.batch_span()
        return {
            "chat": chat * REPLICAS,
            "rag": RAG_RATE * REPLICAS if RAG_HOURS[0] <= hours < RAG_HOURS[1] else 0.0,
            "batch": BATCH_RATE * REPLICAS if batch[0] <= since < batch[1] else 0.0,
        }

    # --- objects ---------------------------------------------------------------------------------

    def tuning(self) -> dict[str, Any]:
        """The VllmTuning of the tuned Deployment: Adaptive under chat SLOs, and the nightly batch window.

        Its observation window is a quarter of a simulated hour (at least
        :data:`MIN_WINDOW_S`, for enough requests); it evaluates five times
        per window, counts a new config's samples a fifth of a window after it
        went live, and waits a simulated hour between traffic-driven changes.
        The policy acts on a traffic regime once it has lasted a window, so it
        answers a change of traffic within about half an hour, and the
        rolling restart takes about as long again.
        """
        hour = self.hour
        window = max(hour / 4, MIN_WINDOW_S)
        opens, closes = (datetime.fromtimestamp(t, UTC) for t in self.window)
        spec = {
            "targetRef": {"name": TUNED},
            "mode": "Auto",
            "slo": CHAT_SLO,
            "bounds": BOUNDS,
            "traffic": {"strategy": "Adaptive", "window": _duration(window),
                        "evaluationInterval": _duration(window / 5)},
            "rollout": {"cooldown": _duration(hour), "settleTime": _duration(window / 5),
                        "maxStepFactor": MAX_STEP_FACTOR, "progressDeadline": f"{PROGRESS_DEADLINE_S}s"},
            "schedules": [{
                "name": NIGHT_WINDOW, "timeZone": "UTC",
                "start": f"{opens.minute} {opens.hour} * * *", "end": f"{closes.minute} {closes.hour} * * *",
                "preRoll": f"{PRE_ROLL_S}s", "slo": BATCH_SLO, "bounds": NIGHT_BOUNDS,
            }],
        }
        VllmTuningSpec.model_validate(spec)  # a typo here should fail before the API server sees it
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": TUNED, "namespace": NAMESPACE},
                "spec": spec}

    def spec(self) -> VllmTuningSpec:
        return VllmTuningSpec.model_validate(self.tuning()["spec"])


def _interpolate(points: tuple[tuple[float, float], ...], x: float) -> float:
    """The polyline through ``points`` at ``x`` (a repeated x is a step: the later point holds after it)."""
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x0 <= x < x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1] if x >= points[-1][0] else points[0][1]


def _duration(seconds: float) -> str:
    """A Go-style duration to a tenth of a second, e.g. ``7.5s``."""
    return f"{math.ceil(seconds * 10) / 10:g}s"


def vllm_deployment(name: str) -> dict[str, Any]:
    """deploy/examples' vLLM Deployment as ``name``: two replicas on the demo's GPU nodes, vLLM's default knobs.

    Only what the demo needs is changed: the name and labels, no knob flags
    (vLLM's defaults for an H100, 8192 tokens and 1024 sequences, apply), a
    rolling update that starts the new pod before stopping an old one (the
    demo's fleet has a spare GPU, so a restart costs no capacity), and a node
    selector for the demo's own simulated nodes.
    """
    documents = [doc for doc in yaml.safe_load_all(EXAMPLE.read_text()) if doc]
    deployment = copy.deepcopy(next(doc for doc in documents if doc["kind"] == "Deployment"))
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "inference",
              "app.kubernetes.io/part-of": "vllm-autotuner-demo"}
    deployment["metadata"] = {"name": name, "namespace": NAMESPACE, "labels": labels}
    spec = deployment["spec"]
    spec["replicas"] = REPLICAS
    spec["selector"] = {"matchLabels": {"app.kubernetes.io/name": name}}
    spec["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    template = spec["template"]
    template["metadata"]["labels"] = labels
    template["spec"].setdefault("nodeSelector", {})[FLEET_LABEL] = FLEET_PREFIX
    (container,) = template["spec"]["containers"]
    container["args"] = [arg for arg in container["args"] if not arg.startswith(("--max-num-batched-tokens",
                                                                               "--max-num-seqs"))]
    return deployment


def huggingface_secret() -> dict[str, Any]:
    """The Secret the example's pods read HF_TOKEN from (the simulator downloads no model)."""
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "huggingface", "namespace": NAMESPACE},
            "stringData": {"token": "not-needed-by-the-simulator"}}
