"""Traffic for the simulated fleet: when requests arrive and how long they are.

A :class:`Scenario` is a set of *streams* (an arrival process over a time
window, with a request-length mix) and a set of named, non-overlapping
*phases* that cover its duration. Streams say what traffic there is (chat
all day, a batch-summarisation job at night on top of it); phases are the
time windows a benchmark scores separately ("night batch", "day peak").
:meth:`Scenario.generate` draws the whole thing with numpy from one seed.

Arrival processes: :class:`Poisson`, :class:`OnOff` (bursty, Markov-modulated
Poisson), :class:`Diurnal` (a 24-hour cosine rate curve) and
:class:`Piecewise` (step changes). Length mixes: chat (~512 prompt / 256
output tokens), long-prompt RAG (~4k / 128), code (~1.5k / 400), batch
summarisation (~3k / 300), and ShareGPT-like (217 / 198, the means vLLM's own
benchmark reports for ShareGPT; used for calibration). Lengths are
log-normal with the stated mean and coefficient of variation, clipped to a
range, and every prompt + output fits ``max_model_len``.

The builders at the end make the scenarios the tuning benchmark scores; their
rates are arguments because a replica's capacity depends on the profile.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from vllm_autotuner.sim.engine import Request

HOUR = 3600.0
DAY = 24 * HOUR
CLIENT_TIMEOUT_S = 600.0
"""How long a client waits for a first token: the OpenAI Python client's default timeout (an httpx read timeout of
600 s: a streaming client that has read nothing for that long raises and closes the connection). It does not try
again: the client retries a timeout only while it waits for the response headers (``SyncAPIClient.request`` wraps
the send, not the reading of the stream), and vLLM's ``StreamingResponse`` sends a stream's headers before its
first token."""


@dataclass(frozen=True, slots=True)
class LengthDist:
    """Log-normal token counts with mean ``mean`` and coefficient of variation
    ``cv`` before clipping to ``[low, high]``."""

    mean: float
    cv: float
    low: int
    high: int

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        sigma = math.sqrt(math.log1p(self.cv**2))
        mu = math.log(self.mean) - sigma**2 / 2
        return np.clip(np.rint(rng.lognormal(mu, sigma, n)), self.low, self.high).astype(np.int64)


@dataclass(frozen=True, slots=True)
class RequestClass:
    """One kind of request in a mix.

    With ``prefix_variants > 0`` each request starts with one of that many
    shared prefixes of ``prefix_tokens`` tokens (system prompts, templates),
    which prefix caching can reuse.
    """

    name: str
    prompt: LengthDist
    output: LengthDist
    weight: float = 1.0
    prefix_tokens: int = 0
    prefix_variants: int = 0


@dataclass(frozen=True, slots=True)
class Mix:
    """Request classes drawn in proportion to their weights."""

    name: str
    classes: tuple[RequestClass, ...]


CHAT = Mix("chat", (RequestClass("chat", LengthDist(512, 0.6, 16, 4096), LengthDist(256, 0.6, 8, 1024)),))
RAG = Mix("rag", (RequestClass("rag", LengthDist(4096, 0.3, 1024, 7680), LengthDist(128, 0.5, 16, 512)),))
CODE = Mix("code", (RequestClass("code", LengthDist(1500, 0.6, 64, 6144), LengthDist(400, 0.7, 16, 2048)),))
SUMMARIZATION = Mix(
    "summarization",
    (RequestClass("summarization", LengthDist(3000, 0.4, 512, 7168), LengthDist(300, 0.4, 64, 1024)),),
)
SHAREGPT = Mix(
    "sharegpt",
    (RequestClass("sharegpt", LengthDist(231, 1.3, 4, 1024), LengthDist(206, 1.2, 4, 1024)),),
)
MIXES = {m.name: m for m in (CHAT, RAG, CODE, SUMMARIZATION, SHAREGPT)}


class ArrivalProcess(Protocol):
    """Arrival times of one stream."""

    def sample(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        """Sorted arrival times in ``[start, end)``."""
        ...


def _uniform_arrivals(rng: np.random.Generator, rate: float, start: float, end: float) -> np.ndarray:
    """A homogeneous Poisson process: a Poisson count, uniformly placed."""
    if rate <= 0 or end <= start:
        return np.empty(0)
    return np.sort(rng.uniform(start, end, rng.poisson(rate * (end - start))))


@dataclass(frozen=True, slots=True)
class Poisson:
    """Constant-rate Poisson arrivals (requests per second)."""

    rate: float

    def sample(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        return _uniform_arrivals(rng, self.rate, start, end)


@dataclass(frozen=True, slots=True)
class Piecewise:
    """Step changes: ``rate`` holds from its ``time`` (seconds from the
    stream's start) until the next step."""

    steps: tuple[tuple[float, float], ...]
    """(time, rate) pairs in time order; the first time is 0."""

    def sample(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        edges = [start + t for t, _ in self.steps] + [end]
        parts = [
            _uniform_arrivals(rng, rate, max(lo, start), min(hi, end))
            for (_, rate), lo, hi in zip(self.steps, edges, edges[1:], strict=False)
        ]
        return np.concatenate(parts) if parts else np.empty(0)


@dataclass(frozen=True, slots=True)
class OnOff:
    """Bursty traffic: exponentially distributed on and off periods with
    Poisson arrivals at ``rate_on`` / ``rate_off`` within them."""

    rate_on: float
    rate_off: float
    mean_on_s: float
    mean_off_s: float

    def sample(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        parts = []
        t, on = start, bool(rng.random() < self.mean_on_s / (self.mean_on_s + self.mean_off_s))
        while t < end:
            length = rng.exponential(self.mean_on_s if on else self.mean_off_s)
            parts.append(_uniform_arrivals(rng, self.rate_on if on else self.rate_off, t, min(t + length, end)))
            t, on = t + length, not on
        return np.concatenate(parts) if parts else np.empty(0)


@dataclass(frozen=True, slots=True)
class Diurnal:
    """A 24-hour cosine curve between ``trough`` and ``peak`` requests per
    second, highest at ``peak_hour`` (hours from midnight; the scenario
    starts at midnight). Drawn by thinning a ``peak``-rate Poisson process."""

    peak: float
    trough: float
    peak_hour: float = 14.0

    def rate(self, t: np.ndarray) -> np.ndarray:
        phase = 2 * math.pi * (t / HOUR - self.peak_hour) / 24
        return self.trough + (self.peak - self.trough) * (1 + np.cos(phase)) / 2

    def sample(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        candidates = _uniform_arrivals(rng, self.peak, start, end)
        keep = rng.random(len(candidates)) * self.peak < self.rate(candidates)
        return candidates[keep]


@dataclass(frozen=True, slots=True)
class Stream:
    """Traffic of one kind over ``[start, end)``, from clients that give up on a request without a first token
    after ``first_token_timeout`` seconds (the engine then aborts it)."""

    arrivals: ArrivalProcess
    mix: Mix
    start: float = 0.0
    end: float = DAY
    first_token_timeout: float = CLIENT_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class Phase:
    """A named time window a benchmark scores on its own."""

    name: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Workload:
    """Generated requests, sorted by arrival, as parallel numpy arrays."""

    arrival: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_id: np.ndarray
    """-1 for no shared prefix."""
    prefix_tokens: np.ndarray
    first_token_timeout: np.ndarray
    """Seconds each request's client waits for a first token (its stream's)."""
    stream: np.ndarray
    """Index of the :class:`Stream` each request came from."""
    request_class: np.ndarray
    """Name of each request's :class:`RequestClass`."""

    def __len__(self) -> int:
        return len(self.arrival)

    def requests(self, start: float = -math.inf, end: float = math.inf) -> Iterator[Request]:
        """The requests arriving in ``[start, end)`` as engine requests."""
        lo, hi = np.searchsorted(self.arrival, [start, end], side="left")
        for index in range(int(lo), int(hi)):
            yield self.request(index)

    def request(self, index: int, arrival: float | None = None) -> Request:
        """Request ``index`` as an engine request (its shared prefix, if any, included), arriving at ``arrival``
        (default: its own arrival time)."""
        prefix = int(self.prefix_id[index])
        return Request(float(self.arrival[index]) if arrival is None else arrival, int(self.prompt_tokens[index]),
                       int(self.output_tokens[index]), prefix if prefix >= 0 else None,
                       int(self.prefix_tokens[index]) if prefix >= 0 else 0, float(self.first_token_timeout[index]))


@dataclass(frozen=True, slots=True)
class Scenario:
    """Streams of traffic and the phases they are scored by."""

    name: str
    streams: tuple[Stream, ...]
    phases: tuple[Phase, ...]
    duration: float = DAY

    def __post_init__(self) -> None:
        bounds = [(p.start, p.end) for p in self.phases]
        if bounds != sorted(bounds) or any(a[1] > b[0] for a, b in zip(bounds, bounds[1:], strict=False)):
            raise ValueError(f"phases of {self.name} overlap or are out of order")

    def phase_at(self, t: float) -> str | None:
        """The phase containing time ``t``, if any."""
        for phase in self.phases:
            if phase.start <= t < phase.end:
                return phase.name
        return None

    def generate(self, seed: int, max_model_len: int = 8192) -> Workload:
        """Draw every stream (one independent random stream each, from
        ``seed``) and merge them by arrival time. Prompts and then outputs are
        shortened where prompt + output would exceed ``max_model_len`` (a
        client sizes its requests to the server it talks to)."""
        children = np.random.SeedSequence(seed).spawn(len(self.streams))
        parts = [_draw(stream, np.random.default_rng(child), i) for i, (stream, child) in
                 enumerate(zip(self.streams, children, strict=True))]  # fmt: skip
        merged = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
        order = np.argsort(merged["arrival"], kind="stable")
        merged = {key: value[order] for key, value in merged.items()}
        merged["prompt_tokens"] = np.minimum(merged["prompt_tokens"], max_model_len - 1)
        merged["prefix_tokens"] = np.minimum(merged["prefix_tokens"], merged["prompt_tokens"] - 1)  # shorter still
        merged["output_tokens"] = np.minimum(merged["output_tokens"], max_model_len - merged["prompt_tokens"])
        return Workload(**merged)


def _draw(stream: Stream, rng: np.random.Generator, index: int) -> dict[str, np.ndarray]:
    """One stream's requests, unsorted across classes."""
    arrival = stream.arrivals.sample(rng, stream.start, stream.end)
    n = len(arrival)
    classes = stream.mix.classes
    weights = np.array([c.weight for c in classes], dtype=float)
    which = rng.choice(len(classes), size=n, p=weights / weights.sum())
    prompt = np.empty(n, dtype=np.int64)
    output = np.empty(n, dtype=np.int64)
    prefix_id = np.full(n, -1, dtype=np.int64)
    prefix_tokens = np.zeros(n, dtype=np.int64)
    for k, cls in enumerate(classes):
        mask = which == k
        m = int(mask.sum())
        prompt[mask] = cls.prompt.sample(rng, m)
        output[mask] = cls.output.sample(rng, m)
        if cls.prefix_variants:
            # prefix ids are unique per (stream, class, variant)
            prefix_id[mask] = (index * 1000 + k) * 1000 + rng.integers(0, cls.prefix_variants, m)
            prefix_tokens[mask] = cls.prefix_tokens
            prompt[mask] = np.maximum(prompt[mask], cls.prefix_tokens + 1)
    return {
        "arrival": arrival,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "prefix_id": prefix_id,
        "prefix_tokens": prefix_tokens,
        "first_token_timeout": np.full(n, stream.first_token_timeout),
        "stream": np.full(n, index, dtype=np.int64),
        "request_class": np.array([c.name for c in classes], dtype=object)[which],
    }


def _phases(*bounds: tuple[str, float, float]) -> tuple[Phase, ...]:
    """Phases from (name, start hour, end hour)."""
    return tuple(Phase(name, start * HOUR, end * HOUR) for name, start, end in bounds)


def steady(rate: float, mix: Mix = CHAT, hours: float = 24) -> Scenario:
    """Constant Poisson traffic of one mix."""
    return Scenario(
        f"steady-{mix.name}",
        (Stream(Poisson(rate), mix, 0, hours * HOUR),),
        _phases(("steady", 0, hours)),
        hours * HOUR,
    )


def diurnal_with_batch_window(peak: float, batch_rate: float, trough_fraction: float = 0.15) -> Scenario:
    """Chat following a day curve (peak at 14:00), plus a batch
    summarisation job from 01:00 to 05:00 on top of the night's chat."""
    return Scenario(
        "diurnal-chat-batch-window",
        (
            Stream(Diurnal(peak, peak * trough_fraction), CHAT),
            Stream(Poisson(batch_rate), SUMMARIZATION, 1 * HOUR, 5 * HOUR),
        ),
        _phases(("night", 0, 1), ("batch-window", 1, 5), ("morning", 5, 10), ("day-peak", 10, 18),
                ("evening", 18, 24)),  # fmt: skip
    )


def bursty(rate_on: float, rate_off: float, mean_on_s: float = 120, mean_off_s: float = 300) -> Scenario:
    """Chat in bursts: minutes of high traffic between quieter stretches."""
    return Scenario(
        "bursty-chat",
        (Stream(OnOff(rate_on, rate_off, mean_on_s, mean_off_s), CHAT),),
        _phases(("bursty", 0, 24)),
    )


def chat_rag_shift(chat_rate: float, rag_rate: float, shift_start: float = 10, shift_end: float = 16) -> Scenario:
    """Chat, then long-prompt RAG from ``shift_start`` to ``shift_end`` hours,
    then chat again: the length mix changes under the tuner's feet."""
    return Scenario(
        "chat-rag-shift",
        (
            Stream(Poisson(chat_rate), CHAT, 0, shift_start * HOUR),
            Stream(Poisson(rag_rate), RAG, shift_start * HOUR, shift_end * HOUR),
            Stream(Poisson(chat_rate), CHAT, shift_end * HOUR, DAY),
        ),
        _phases(("chat-morning", 0, shift_start), ("rag", shift_start, shift_end), ("chat-evening", shift_end, 24)),
    )


def step_change(rates: Sequence[tuple[float, float]], mix: Mix = CHAT) -> Scenario:
    """Rate steps at given hours: ``[(0, 5.0), (8, 20.0), (20, 8.0)]``; one
    phase per step."""
    hours = [h for h, _ in rates] + [24.0]
    return Scenario(
        f"step-{mix.name}",
        (Stream(Piecewise(tuple((h * HOUR, r) for h, r in rates)), mix),),
        _phases(*((f"step-{i}", lo, hi) for i, (lo, hi) in enumerate(zip(hours, hours[1:], strict=False)))),
    )
