"""One simulated vLLM server: an engine in wall-clock time behind vLLM's HTTP API.

Each pod the fleet runs gets one :class:`ServedEngine` and one aiohttp app
(:func:`build_app`) on the pod's address: ``/metrics`` (the engine's metrics
exactly as vLLM serves them, from a registry of its own), ``/health``,
``/version``, ``/v1/models``, and OpenAI-compatible ``/v1/completions`` and
``/v1/chat/completions``, streamed (``"stream": true``, server-sent events)
or not. A standard load generator can therefore drive the fleet, and the
operator sees the traffic in the metrics as it would on a real server.

Timing: requests enter the engine at the wall-clock moment they arrive; the
fleet calls :meth:`ServedEngine.tick` periodically, which advances the engine
to now and hands each request the tokens the engine has produced since, so
a client sees its first token and each later one when the engine made them,
quantised to the tick (tens of milliseconds). The engine's own latency
histograms are exact.

A client that goes away (closes the connection, or times out) has its
request aborted in the engine, as vLLM does: the runner (:func:`app_runner`)
cancels the handler of a connection that is lost, as vLLM's
``with_cancellation`` and Starlette's disconnect listener do, and the
handler's cleanup aborts what its client had not received in full.

Token counts: a prompt given as token ids (what ``sim load`` sends, and the
OpenAI API allows) counts exactly; text is estimated at four characters per
token (Llama-3's tokenizer on English), plus the chat template's tokens for
messages. Every request generates ``max_tokens`` tokens (no model here ever
stops early: ``finish_reason`` is ``length``); absent, vLLM's defaults apply
(16 for completions, the rest of the context for chat).

Admission control: vLLM's API server refuses a request with 503 before it
reaches the engine when ``--max-num-queued-reqs`` requests are in flight
(waiting or running) or the prompts of those still in their prefill add up
to ``--max-num-queued-tokens`` (:class:`QueueLimits`), and counts it in
``vllm:admission_rejections_total`` by the limit that refused it. Such a
request never shows in the request counters or latency histograms.

Shutdown: with ``--shutdown-timeout`` (vllm-project/vllm#36666), the pod's
SIGTERM (``shutting_down``) makes the server refuse new requests with 503
while those in flight finish; without it, they are aborted at once
(``sim.podrunner`` does either).

Sleep mode: a server started with ``--enable-sleep-mode`` and
``VLLM_SERVER_DEV_MODE=1`` (vLLM serves these routes only in dev mode) takes
``POST /sleep?level=1|2``, ``POST /wake_up`` and ``GET /is_sleeping``, and its
``vllm:engine_sleep_state`` says the level. ``POST /wake_up?tags=weights``
then ``?tags=kv_cache`` wakes it in two parts, as an RL trainer that loads
new weights first does: as in vLLM's executor, the engine sleeps until both
are back (``awake`` 0 meanwhile; the level's flag only while the weights are
out), and a tag that is not asleep makes the call do nothing. A sleeping
engine processes nothing: here the requests in flight when it falls asleep
fail (level 1 and 2 both discard the KV cache) and those sent while it
sleeps are refused with 503, which is the simulator's choice (vLLM leaves it
to the router not to send them).

Not modelled: prefix sharing between text prompts (no hashing: prefix-cache
hits stay zero), several prompts or choices per request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from vllm_autotuner.sim.engine import Engine, FinishedRequest, Request
from vllm_autotuner.sim.metrics import REJECTION_REASONS, VllmCollector, server_info
from vllm_autotuner.sim.startup import SIMULATED_VLLM_VERSION

CHARS_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 5
"""Llama-3 chat template: header start, role, header end, blank line, end of turn."""
CHAT_TOKENS_PER_PROMPT = 5
"""Begin-of-text and the assistant header that asks for the reply."""
COMPLETION_DEFAULT_MAX_TOKENS = 16
#: What vLLM's sleep mode frees, each taken back by ``POST /wake_up?tags=``.
SLEEP_TAGS = frozenset({"weights", "kv_cache"})
_WORDS = ("the", " model", " answers", " with", " simulated", " tokens", ",", " one", " at", " a", " time", ".")


class RequestError(Exception):
    """What vLLM answers with an OpenAI error object: ``status`` and message."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param

    def response(self) -> web.Response:
        body = {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.status}}
        return web.json_response(body, status=self.status)


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """vLLM's admission limits (``--max-num-queued-reqs``, ``--max-num-queued-tokens``; None: no limit)."""

    max_num_queued_reqs: int | None = None
    """Requests in flight at once, waiting or running: a request arriving when as many are is refused."""
    max_num_queued_tokens: int | None = None
    """Prompt tokens of the requests in flight that have not finished their prefill: a request arriving when they
    reach it is refused (whatever its own prompt)."""


@dataclass(eq=False)
class InFlight:
    """A submitted request as its HTTP handler waits on it."""

    rid: int
    prompt_tokens: int
    output_tokens: int
    produced: int = 0
    """Output tokens the engine has produced so far."""
    finished: FinishedRequest | None = None
    aborted: str | None = None
    """Why the server dropped it unfinished (answered 503)."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class ServedEngine:
    """An :class:`Engine` whose clock is the wall clock since it became ready."""

    def __init__(self, engine: Engine, model_name: str, clock: Callable[[], float] = time.monotonic,
                 limits: QueueLimits = QueueLimits(), sleep_mode: bool = False, adapters: tuple[str, ...] = (),
                 shutdown_timeout: float = 0.0) -> None:
        self.engine = engine
        self.model_name = model_name
        self.adapters = adapters
        """The LoRA adapters served by name (``--lora-modules``)."""
        self.limits = limits
        self.rejections = dict.fromkeys(REJECTION_REASONS, 0)
        """Requests refused at admission, by the limit that refused them."""
        self.sleep_mode = sleep_mode
        """Whether it takes sleep and wake-up calls (:func:`build_app` serves their routes)."""
        self.sleep_level = 0
        """0 awake; 1 asleep with the weights offloaded, 2 with them discarded."""
        self.sleeping: set[str] = set()
        """What sleep mode freed and no wake-up has taken back yet (all of ``SLEEP_TAGS`` after a sleep)."""
        self.shutdown_timeout = shutdown_timeout
        """Seconds it lets the requests in flight finish after SIGTERM (``--shutdown-timeout``); 0: none."""
        self.shutting_down = False
        """SIGTERM came with a shutdown timeout: new requests are refused with 503 while those in flight finish."""
        self.created = time.time()
        self._clock = clock
        self._start = clock()
        self._waiting: dict[int, InFlight] = {}
        self._streaming: dict[int, InFlight] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        info = dataclasses.replace(server_info(engine, self.created), model_name=model_name)
        self.registry.register(VllmCollector(engine.snapshot, info, rejections=self.rejections,
                                             sleep_state=self.sleep_state))

    def elapsed(self) -> float:
        return self._clock() - self._start

    def submit(self, prompt_tokens: int, output_tokens: int, *, stream: bool, lora: str | None = None) -> InFlight:
        """Queue a request arriving now, for the LoRA adapter ``lora`` (None: the base model). Raises
        :class:`RequestError` for what vLLM rejects: 503 beyond a queue limit (:meth:`admit`), 400 for a
        prompt plus output beyond ``max_model_len``, 503 while asleep or shutting down."""
        if self.shutting_down:
            raise RequestError(503, "The server is shutting down.", "ServiceUnavailableError")
        if self.sleeping:
            raise RequestError(503, "The engine is sleeping: wake it with POST /wake_up.", "ServiceUnavailableError")
        self.admit()
        try:
            rid = self.engine.submit(Request(self.elapsed(), prompt_tokens, output_tokens, lora=lora))
        except ValueError as exc:
            raise RequestError(400, f"{exc} Please reduce the length of the messages or completion.") from None
        flight = InFlight(rid, prompt_tokens, output_tokens)
        self._waiting[rid] = flight
        if stream:
            self._streaming[rid] = flight
        return flight

    def admit(self) -> None:
        """Refuse a request arriving now, with 503, when the queue limits are reached; count it by the limit."""
        limits, flights = self.limits, self._waiting.values()
        if limits.max_num_queued_reqs is not None and len(flights) >= limits.max_num_queued_reqs:
            reason, detail = "max_num_queued_reqs", f"{len(flights)} requests in flight"
        elif limits.max_num_queued_tokens is not None and (prefilling := sum(
                f.prompt_tokens for f in flights if not self.engine.tokens_generated(f.rid))) >= (
                limits.max_num_queued_tokens):
            reason, detail = "max_num_queued_tokens", f"{prefilling} prompt tokens waiting for their prefill"
        else:
            return
        self.rejections[reason] += 1
        limit = getattr(limits, reason)
        raise RequestError(503, f"The server is at capacity: {detail} (--{reason.replace('_', '-')} {limit}). "
                                "Retry later.", "ServiceUnavailableError")

    @property
    def in_flight(self) -> int:
        """Requests submitted and not finished yet."""
        return len(self._waiting)

    def forget(self, flight: InFlight) -> None:
        """The handler is done with ``flight``: stop reporting progress to it
        and, when it has not finished (its client went away), abort it in the
        engine."""
        self._waiting.pop(flight.rid, None)
        self._streaming.pop(flight.rid, None)
        if flight.finished is None and flight.aborted is None:
            self.engine.abort(flight.rid)

    def tick(self) -> None:
        """Advance the engine to now and wake the requests that progressed."""
        for done in self.engine.advance(self.elapsed()):
            flight = self._waiting.pop(done.rid, None)
            self._streaming.pop(done.rid, None)
            if flight is not None:
                flight.produced, flight.finished = done.output_tokens, done
                flight.changed.set()
        for rid, flight in self._streaming.items():
            count = self.engine.tokens_generated(rid)
            if count is not None and count > flight.produced:
                flight.produced = count
                flight.changed.set()

    def abort_all(self, why: str = "the server is shutting down") -> None:
        """Every waiting request fails, ``why``."""
        for flight in self._waiting.values():
            flight.aborted = why
            flight.changed.set()
        self._waiting.clear()
        self._streaming.clear()

    def sleep(self, level: int) -> None:
        """vLLM's sleep mode: the engine frees its GPU memory (the KV cache, and at level 1 offloads the weights,
        at 2 discards them) and processes nothing until :meth:`wake_up`."""
        for rid in self._waiting:
            self.engine.abort(rid)
        self.abort_all("the engine fell asleep")
        self.sleep_level = level
        self.sleeping = set(SLEEP_TAGS)

    def wake_up(self, tags: Iterable[str] = ()) -> None:
        """vLLM's wake-up: takes back what ``tags`` name (none: everything); the engine runs again once nothing
        sleeps. A tag that is not asleep (unknown, already back, or an engine awake) makes it do nothing, as vLLM's
        executor does."""
        wanted = set(tags) or set(self.sleeping)
        if not wanted <= self.sleeping:
            return
        self.sleeping -= wanted
        if not self.sleeping:
            self.sleep_level = 0

    def sleep_state(self) -> dict[str, int]:
        """``vllm:engine_sleep_state``: awake only once nothing sleeps; the level's flag while the weights do."""
        weights = "weights" in self.sleeping
        return {"awake": int(not self.sleeping), "weights_offloaded": int(weights and self.sleep_level == 1),
                "discard_all": int(weights and self.sleep_level == 2)}

    @property
    def max_model_len(self) -> int:
        return self.engine.config.max_model_len


def estimate_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def completion_prompt_tokens(prompt: Any) -> int:
    """Tokens of a ``/v1/completions`` prompt: token ids count exactly, text
    is estimated (plus the begin-of-text token the tokenizer adds)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return 1 + estimate_tokens(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    raise RequestError(400, "simulator: send one prompt per request, as text or a list of token ids", param="prompt")


def chat_prompt_tokens(messages: Any) -> int:
    """Tokens of a chat request after the chat template, estimated from the text."""
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages must be a non-empty list", param="messages")
    total = CHAT_TOKENS_PER_PROMPT
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):  # content parts
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        total += CHAT_TOKENS_PER_MESSAGE + estimate_tokens(content or "")
    return total


def token_text(index: int) -> str:
    """The text of output token ``index``: filler words, deterministic."""
    return _WORDS[index % len(_WORDS)]


SERVED = web.AppKey("served", ServedEngine)


def build_app(served: ServedEngine) -> web.Application:
    """vLLM's HTTP API for ``served``."""
    app = web.Application()
    app[SERVED] = served
    app.router.add_get("/health", _health)
    app.router.add_get("/version", _version)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    if served.sleep_mode:
        app.router.add_post("/sleep", _sleep)
        app.router.add_post("/wake_up", _wake_up)
        app.router.add_get("/is_sleeping", _is_sleeping)
    return app


def app_runner(served: ServedEngine, **options: Any) -> web.AppRunner:
    """The runner of :func:`build_app` for ``served``: it cancels the handler
    of a request whose client went away, whose cleanup then aborts the
    request in the engine (aiohttp's default lets the handler run on)."""
    return web.AppRunner(build_app(served), handler_cancellation=True, **options)


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"version": SIMULATED_VLLM_VERSION})


async def _metrics(request: web.Request) -> web.Response:
    """Always the Prometheus text format. (prometheus-client 0.26's OpenMetrics
    output escapes the ``vllm:`` sample names but not their ``# TYPE`` lines,
    which a scraper cannot parse; in the text format Prometheus also keeps the
    ``_created`` samples as series of their own.)"""
    served: ServedEngine = request.app[SERVED]
    return web.Response(body=generate_latest(served.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _models(request: web.Request) -> web.Response:
    served: ServedEngine = request.app[SERVED]
    def model(name: str, parent: str | None) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": int(served.created), "owned_by": "vllm", "root": name,
                "parent": parent, "max_model_len": served.max_model_len, "permission": []}

    data = [model(served.model_name, None), *(model(name, served.model_name) for name in served.adapters)]
    return web.json_response({"object": "list", "data": data})


async def _sleep(request: web.Request) -> web.Response:
    level = request.query.get("level", "1")
    if level not in ("1", "2"):
        return RequestError(400, f"sleep level must be 1 or 2, not {level!r}", param="level").response()
    request.app[SERVED].sleep(int(level))
    return web.Response(status=200)


async def _wake_up(request: web.Request) -> web.Response:
    request.app[SERVED].wake_up(request.query.getall("tags", []))
    return web.Response(status=200)


async def _is_sleeping(request: web.Request) -> web.Response:
    return web.json_response({"is_sleeping": bool(request.app[SERVED].sleeping)})


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, chat=False)


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, chat=True)


async def _serve(request: web.Request, *, chat: bool) -> web.StreamResponse:
    served: ServedEngine = request.app[SERVED]
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object")
        name = body.get("model", served.model_name)
        if name != served.model_name and name not in served.adapters:
            raise RequestError(404, f"The model `{body['model']}` does not exist.", "NotFoundError", "model")
        if chat:
            prompt = chat_prompt_tokens(body.get("messages"))
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or served.max_model_len - prompt
        else:
            prompt = completion_prompt_tokens(body.get("prompt"))
            max_tokens = body.get("max_tokens") or COMPLETION_DEFAULT_MAX_TOKENS
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise RequestError(400, "max_tokens must be a positive integer", param="max_tokens")
        stream = bool(body.get("stream"))
        flight = served.submit(prompt, max_tokens, stream=stream, lora=None if name == served.model_name else name)
    except json.JSONDecodeError:
        return RequestError(400, "the request body is not valid JSON").response()
    except RequestError as exc:
        return exc.response()
    reply = _Reply(chat, name, flight)
    try:
        if stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await reply.stream(request, include_usage)
        while flight.finished is None and flight.aborted is None:
            await flight.changed.wait()
            flight.changed.clear()
        if flight.aborted is not None:
            return RequestError(503, flight.aborted, "ServiceUnavailableError").response()
        return web.json_response(reply.whole())
    finally:
        served.forget(flight)


class _Reply:
    """The OpenAI response objects of one request."""

    def __init__(self, chat: bool, model: str, flight: InFlight) -> None:
        self.chat, self.model, self.flight = chat, model, flight
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def usage(self) -> dict[str, int]:
        f = self.flight
        return {"prompt_tokens": f.prompt_tokens, "total_tokens": f.prompt_tokens + f.output_tokens,
                "completion_tokens": f.output_tokens}

    def _envelope(self, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def whole(self) -> dict[str, Any]:
        text = "".join(token_text(i) for i in range(self.flight.output_tokens))
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length", "stop_reason": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
        else:
            choice["text"] = text
        return {**self._envelope([choice], chunk=False), "usage": self.usage()}

    def chunk(self, index: int) -> dict[str, Any]:
        """The chunk carrying output token ``index``."""
        last = index == self.flight.output_tokens - 1
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length" if last else None}
        if self.chat:
            choice["delta"] = {"content": token_text(index)}
        else:
            choice["text"] = token_text(index)
            choice["stop_reason"] = None
        return self._envelope([choice], chunk=True)

    def role_chunk(self) -> dict[str, Any]:
        """Chat's first chunk, which opens the assistant's message."""
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return self._envelope([choice], chunk=True)

    async def stream(self, request: web.Request, include_usage: bool) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        flight, sent = self.flight, 0
        while sent < flight.output_tokens:
            while flight.produced <= sent and flight.aborted is None:
                await flight.changed.wait()
                flight.changed.clear()
            if flight.aborted is not None:
                break  # the connection closes without [DONE], as when vLLM goes away
            chunks = [self.role_chunk()] if self.chat and sent == 0 else []
            chunks += [self.chunk(i) for i in range(sent, flight.produced)]
            sent = flight.produced
            await response.write(b"".join(_event(c) for c in chunks))
        else:
            tail = [self._envelope([], chunk=True) | {"usage": self.usage()}] if include_usage else []
            await response.write(b"".join(_event(c) for c in tail) + b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


