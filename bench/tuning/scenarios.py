"""The scenarios the tuning benchmark scores, and the VllmTuning spec the adaptive policy runs with.

Loads are fractions of a replica's measured capacity under vLLM's defaults
(``saturation_rate``), so "busy" means the same thing on every profile. The
knobs matter only near that capacity, where a bad config breaches a latency
target and a good one does not, so the loads sit at the knee: where static
configs start to part ways, measured with static configs on two-hour runs
(chat from 92 %, long prompts from 85 %, the L4's code traffic from 80 %)
before any scenario was scored. The long prompts behind cached system
prompts, added later, take long prompts' 85 % without a measure of their
own knee; static configs part ways there too (256 tokens meet both targets
for 97.8 % of requests, 512 for 36.6 %, vLLM's default for 0.4 %). Fleets have four replicas, so one pod out
for a restart leaves three quarters of the capacity. SLOs are ones a
platform team would write:
interactive chat TTFT p95 1 s and ITL p95 50 ms; long-prompt RAG TTFT 2 s
(a 4k-token prompt has to be read first), same ITL; a nightly batch window
whose requests only need to finish (TTFT 60 s, ITL 250 ms); the slow L4
cannot stream faster than its weight reads (about 70 ms a step), so its
service promises ITL 150 ms; a 70B model on four H100s streams at about
60 ms a token under load (vLLM's own 70B TP4 benchmark, cited in
``sim.profiles``), so its services promise ITL 100 ms (a first run had
held it to chat's 50 ms, which no static config met at this load either: a
target nothing meets measures nothing). Nothing here is tuned to flatter
the policy: loads and targets come from the knee and the service, not from
its score.

A request meets the ITL target when its own inter-token latency at the
target's quantile is within it (``runner.score``). Loads and targets were
set when a request's mean time per output token was judged instead; under
the stricter rule the A100's chat target of 50 ms is met at these loads by
512-token budgets only (2048, vLLM's default there, meets it for 0.3 % of
requests). They were kept, not re-chosen to suit the new scores.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import cache

from vllm_autotuner.api import VllmTuningSpec
from vllm_autotuner.sim.capacity import saturation_rate
from vllm_autotuner.sim.engine import EngineConfig
from vllm_autotuner.sim.profiles import get_profile
from vllm_autotuner.sim.workload import (
    CHAT,
    CODE,
    DAY,
    HOUR,
    RAG,
    SUMMARIZATION,
    LengthDist,
    Mix,
    Phase,
    Poisson,
    Scenario,
    Stream,
    bursty,
    chat_rag_shift,
    diurnal_with_batch_window,
    step_change,
)

#: Simulated wall-clock time of a scenario's t = 0 (a Monday, midnight UTC).
START = datetime(2024, 5, 6, tzinfo=UTC)
CHAT_SLO = {"ttft": {"seconds": 1.0}, "itl": {"seconds": 0.05}}
RAG_SLO = {"ttft": {"seconds": 2.0}, "itl": {"seconds": 0.05}}
BATCH_SLO = {"ttft": {"seconds": 60.0}, "itl": {"seconds": 0.25}}
L4_SLO = {"ttft": {"seconds": 3.0}, "itl": {"seconds": 0.15}}
#: ITL target of a 70B model's service: it streams no faster than about 60 ms a token under load.
BIG_MODEL_ITL = 0.1
CACHED_RAG = Mix("rag-cached-prefix", (replace(
    RAG.classes[0], name="rag-cached-prefix", prompt=LengthDist(4096, 0.3, 3328, 7680), prefix_tokens=3072,
    prefix_variants=4),))
"""Long prompts, each behind one of four 3072-token system prompts the prefix cache keeps: about a thousand
tokens of each computed. vLLM counts such a prompt whole in its step-token histogram while its step computes what
follows the cached prefix."""


@dataclass(frozen=True)
class BenchScenario:
    """One scenario on one profile: traffic, fleet size and the spec of the VllmTuning."""

    name: str
    profile: str
    replicas: int
    traffic: Scenario
    spec: VllmTuningSpec
    seed: int = 1

    @property
    def hours(self) -> float:
        return self.traffic.duration / HOUR

    @property
    def key(self) -> str:
        return f"{self.name}/{self.profile}"


@cache
def capacity(profile: str, mix: Mix) -> float:
    """Requests per second one replica of ``profile`` sustains for ``mix`` with vLLM's default knobs."""
    return saturation_rate(get_profile(profile), mix, EngineConfig())


def _spec(profile: str, slo: dict, **fields: object) -> VllmTuningSpec:
    """The VllmTuning spec; a 70B model's service promises ITL BIG_MODEL_ITL instead of chat's 50 ms."""
    if get_profile(profile).model.params > 30e9:
        slo = {**slo, "itl": {"seconds": max(slo["itl"]["seconds"], BIG_MODEL_ITL)}}
    return VllmTuningSpec.model_validate({"targetRef": {"name": "vllm"}, "slo": slo, **fields})


def _shortened(scenario: Scenario, hours: float) -> Scenario:
    """The first ``hours`` of a scenario (streams and phases cut at the new end), for the quick run."""
    end = hours * HOUR
    streams = tuple(replace(s, end=min(s.end, end)) for s in scenario.streams if s.start < end)
    phases = tuple(Phase(p.name, p.start, min(p.end, end)) for p in scenario.phases if p.start < end)
    return Scenario(scenario.name, streams, phases, end)


def steady_chat(profile: str, replicas: int = 4) -> BenchScenario:
    """Interactive chat at 92 % of capacity all day: a good config is easy to keep, a restart is pure cost."""
    rate = 0.92 * capacity(profile, CHAT) * replicas
    traffic = Scenario("steady-chat", (Stream(Poisson(rate), CHAT),), (Phase("steady", 0, DAY),))
    return BenchScenario("steady-chat", profile, replicas, traffic, _spec(profile, CHAT_SLO))


def long_prompt(profile: str, replicas: int = 4) -> BenchScenario:
    """Long-prompt RAG (4k-token prompts) at 85 % of capacity all day: big prefill chunks stall the decodes."""
    rate = 0.85 * capacity(profile, RAG) * replicas
    traffic = Scenario("long-prompt", (Stream(Poisson(rate), RAG),), (Phase("steady", 0, DAY),))
    return BenchScenario("long-prompt", profile, replicas, traffic, _spec(profile, RAG_SLO))


def diurnal_batch(profile: str, replicas: int = 4) -> BenchScenario:
    """Chat peaking at 95 % of capacity at 14:00, and a summarisation batch job 01:00-05:00 under a night schedule.

    The schedule relaxes the SLO for the batch window (requests only need to
    finish) and lets the policy use the whole range; outside it, chat's tight
    targets hold.
    """
    peak = 0.95 * capacity(profile, CHAT) * replicas
    batch = 0.6 * capacity(profile, SUMMARIZATION) * replicas
    night = {"name": "batch-window", "start": "0 1 * * *", "end": "0 5 * * *", "slo": BATCH_SLO}
    traffic = diurnal_with_batch_window(peak, batch)
    return BenchScenario("diurnal-batch", profile, replicas, traffic, _spec(profile, CHAT_SLO, schedules=[night]))


def bursty_chat(profile: str, replicas: int = 4) -> BenchScenario:
    """Chat in bursts of 120 % of capacity (2 minutes on average) between spells at 60 % (5 minutes)."""
    one = capacity(profile, CHAT) * replicas
    return BenchScenario("bursty", profile, replicas, bursty(1.2 * one, 0.6 * one), _spec(profile, CHAT_SLO))


def shift(profile: str, replicas: int = 4, hours: tuple[float, float, float] = (10, 16, 24)) -> BenchScenario:
    """Chat at 92 % of capacity, long-prompt RAG at 85 % of its capacity from 10:00 to 16:00, then chat again."""
    chat = 0.92 * capacity(profile, CHAT) * replicas
    rag = 0.85 * capacity(profile, RAG) * replicas
    start, end, total = hours
    return BenchScenario(
        "shift", profile, replicas, _shortened(chat_rag_shift(chat, rag, start, end), total), _spec(profile, RAG_SLO)
    )


def overload(profile: str, replicas: int = 4) -> BenchScenario:
    """Chat at 80 % of capacity with an overload of 130 % from 12:00 to 15:00."""
    one = capacity(profile, CHAT) * replicas
    traffic = step_change([(0, 0.8 * one), (12, 1.3 * one), (15, 0.8 * one)])
    return BenchScenario("overload", profile, replicas, traffic, _spec(profile, CHAT_SLO))


def cached_prompts(profile: str, replicas: int = 4) -> BenchScenario:
    """Long prompts behind cached system prompts (``CACHED_RAG``) at 85 % of capacity all day, RAG's SLO: the
    prompts look like long-prompt RAG's in vLLM's histograms, and their steps compute a quarter of them."""
    rate = 0.85 * capacity(profile, CACHED_RAG) * replicas
    traffic = Scenario("cached-prompts", (Stream(Poisson(rate), CACHED_RAG),), (Phase("steady", 0, DAY),))
    return BenchScenario("cached-prompts", profile, replicas, traffic, _spec(profile, RAG_SLO))


def memory_tight(profile: str = "llama3-8b-l4", replicas: int = 4) -> BenchScenario:
    """Code assistance at 80 % of capacity on a GPU whose memory leaves little room: large budgets fail start-up."""
    rate = 0.8 * capacity(profile, CODE) * replicas
    traffic = Scenario("memory-tight", (Stream(Poisson(rate), CODE),), (Phase("steady", 0, DAY),))
    return BenchScenario("memory-tight", profile, replicas, traffic, _spec(profile, L4_SLO))


def full() -> list[BenchScenario]:
    """Every scenario, each >= 24 simulated hours, on the H100, A100 and 70B-TP4 profiles (and the L4)."""
    return [
        steady_chat("llama3-70b-h100-tp4"),
        long_prompt("llama3-8b-a100"),
        long_prompt("llama3-8b-h100"),
        diurnal_batch("llama3-8b-a100"),
        bursty_chat("llama3-70b-h100-tp4"),
        shift("llama3-8b-h100"),
        shift("llama3-8b-a100"),
        overload("llama3-8b-a100"),
        memory_tight(),
        cached_prompts("llama3-8b-a100"),
    ]


def quick() -> list[BenchScenario]:
    """A reduced run: the shift on the A100 compressed to 5 hours (RAG from 1:30 to 3:30), and 6 hours of the
    memory-tight profile."""
    tight = memory_tight()
    return [
        shift("llama3-8b-a100", hours=(1.5, 3.5, 5)),
        BenchScenario(tight.name, tight.profile, tight.replicas, _shortened(tight.traffic, 6), tight.spec),
    ]
