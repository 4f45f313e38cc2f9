"""The per-pod vLLM HTTP API: OpenAI shapes, token timing from the engine,
errors as vLLM returns them, and the metrics of what was served.

The app runs on a real loopback socket (aiohttp's test server); the engine's
clock is driven by hand, so the tests decide when tokens exist."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.sim.helpers import noiseless
from vllm_autotuner.sim.engine import Engine, EngineConfig
from vllm_autotuner.sim.serving import (
    QueueLimits,
    ServedEngine,
    app_runner,
    build_app,
    chat_prompt_tokens,
    completion_prompt_tokens,
)

MODEL = "org/served-name"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def serving(max_model_len: int | None = None, limits: QueueLimits = QueueLimits(), sleep_mode: bool = False,
                  adapters: tuple[str, ...] = ()) -> AsyncIterator[tuple[TestClient, ServedEngine, Clock]]:
    clock = Clock()
    config = EngineConfig(max_model_len=max_model_len, max_loras=1 if adapters else None)
    engine = Engine(noiseless("llama3-8b-h100"), config, seed=0)
    served = ServedEngine(engine, MODEL, clock=clock, limits=limits, sleep_mode=sleep_mode, adapters=adapters)
    async with TestClient(TestServer(build_app(served))) as client:
        yield client, served, clock


async def run_until(
    served: ServedEngine, clock: Clock, task: asyncio.Future, step: float = 0.05, limit: float = 60
) -> None:
    """Tick the engine in ``step`` increments until ``task`` is done."""
    while not task.done():
        assert clock.now < limit, "the request never finished"
        clock.now += step
        served.tick()
        await asyncio.sleep(0.001)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


def test_completion_answers_when_the_engine_finished_the_request() -> None:
    async def scenario() -> None:
        async with serving() as (client, served, clock):
            post = asyncio.ensure_future(
                client.post(
                    "/v1/completions",
                    json={"model": MODEL, "prompt": list(range(1000)), "max_tokens": 200, "ignore_eos": True},
                )
            )
            await until(lambda: served.in_flight == 1, "it is in flight")
            served.tick()
            assert not post.done()  # no simulated time has passed
            await run_until(served, clock, post)
            response = await post
            body = await response.json()
            assert response.status == 200
            assert body["object"] == "text_completion" and body["model"] == MODEL
            assert body["usage"] == {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}
            (choice,) = body["choices"]
            assert choice["finish_reason"] == "length" and choice["text"].startswith("the model")
            # 200 tokens at a few ms each on an H100: done in about a second of engine time
            assert 0.3 < clock.now < 3

    run(scenario)


def test_stream_delivers_each_token_as_the_engine_produces_it() -> None:
    async def scenario() -> None:
        async with serving() as (client, served, clock):
            response = await client.post(
                "/v1/completions",
                json={
                    "model": MODEL,
                    "prompt": list(range(500)),
                    "max_tokens": 300,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            )
            assert response.headers["Content-Type"].startswith("text/event-stream")
            events: list[str] = []
            seen_while_running: set[int] = set()

            async def read() -> None:
                async for line in response.content:
                    if line.startswith(b"data: "):
                        events.append(line[6:].decode().strip())

            reader = asyncio.ensure_future(read())
            while not reader.done():
                clock.now += 0.05
                served.tick()
                await asyncio.sleep(0.005)
                seen_while_running.add(len(events))
                assert clock.now < 60
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            tokens = [c for c in chunks if c["choices"]]
            assert len(tokens) == 300
            assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 299 + ["length"]
            assert chunks[-1]["usage"] == {"prompt_tokens": 500, "completion_tokens": 300, "total_tokens": 800}
            # Tokens arrived over many ticks, not all at the end.
            assert len([n for n in seen_while_running if 0 < n < 300]) > 10

    run(scenario)


async def until(predicate: Callable[[], bool], what: str, seconds: float = 10) -> None:
    """Poll ``predicate`` until it holds (the server reacts on its own task), failing after ``seconds``."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.01)


def test_a_client_that_goes_away_has_its_request_aborted() -> None:
    """vLLM aborts a request whose client closed the connection: mid-stream, or while waiting for a whole answer;
    the engine frees its slot and blocks and counts no finished request. Served by the runner the fleet's pods
    use (aiohttp's test server would cancel handlers whatever the runner's setting)."""

    async def scenario() -> None:
        clock = Clock()
        served = ServedEngine(Engine(noiseless("llama3-8b-h100"), EngineConfig(), seed=0), MODEL, clock=clock)
        engine, runner = served.engine, app_runner(served)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/completions"
        try:
            async with aiohttp.ClientSession() as session:
                response = await session.post(url, json={"prompt": list(range(500)), "max_tokens": 2000,
                                                         "stream": True})  # fmt: skip
                whole = asyncio.ensure_future(session.post(url, json={"prompt": [1, 2], "max_tokens": 2000}))
                await until(lambda: engine.num_running + engine.num_waiting == 2, "both requests are in the engine")
                first = asyncio.ensure_future(response.content.readline())
                await run_until(served, clock, first)
                assert (await first).startswith(b"data: ")  # the stream has begun
                assert engine.num_running == 2 and engine.kv_usage > 0
                response.close()  # the streaming client goes away mid-stream
                whole.cancel()  # and the other gives up on its whole answer
                await until(lambda: engine.num_running + engine.num_waiting == 0, "both requests are aborted")
        finally:
            await runner.cleanup()
        assert engine.kv_usage == 0
        clock.now += 60
        served.tick()
        assert engine.snapshot().counters["request_success"] == 0

    run(scenario)


def test_chat_completion_shapes_streamed_and_whole() -> None:
    messages = [{"role": "system", "content": "x" * 400}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]

    async def scenario() -> None:
        async with serving() as (client, served, clock):
            whole = asyncio.ensure_future(
                client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 5})
            )
            await run_until(served, clock, whole)
            body = await (await whole).json()
            assert body["object"] == "chat.completion"
            assert body["choices"][0]["message"]["role"] == "assistant"
            assert body["usage"]["prompt_tokens"] == chat_prompt_tokens(messages) == 5 + 2 * 5 + 100 + 1

            streamed = await client.post(
                "/v1/chat/completions", json={"messages": messages, "max_tokens": 3, "stream": True}
            )
            reader = asyncio.ensure_future(streamed.text())
            await run_until(served, clock, reader)
            events = [e[6:] for e in (await reader).split("\n\n") if e.startswith("data: ")]
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            assert all(c["object"] == "chat.completion.chunk" for c in chunks)
            assert len(chunks) == 1 + 3 and "usage" not in chunks[-1]

    run(scenario)


def test_errors_are_vllms() -> None:
    async def scenario() -> None:
        async with serving(max_model_len=2048) as (client, _, _clock):
            unknown = await client.post("/v1/completions", json={"model": "other", "prompt": "hi"})
            assert unknown.status == 404
            assert (await unknown.json())["error"]["message"] == "The model `other` does not exist."
            too_long = await client.post("/v1/completions", json={"prompt": list(range(2000)), "max_tokens": 100})
            assert too_long.status == 400
            error = (await too_long.json())["error"]
            assert error["type"] == "BadRequestError" and error["code"] == 400
            assert "maximum context length is 2048 tokens" in error["message"]
            assert (await client.post("/v1/completions", data=b"{nope")).status == 400
            assert (await client.post("/v1/completions", json={"prompt": ["a", "b"]})).status == 400

    run(scenario)


def test_metrics_models_health_and_shutdown() -> None:
    async def scenario() -> None:
        async with serving() as (client, served, clock):
            assert (await client.get("/health")).status == 200
            models = await (await client.get("/v1/models")).json()
            assert [m["id"] for m in models["data"]] == [MODEL]
            post = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": "hello world"}))
            await run_until(served, clock, post)
            assert (await (await post).json())["usage"] == {
                "prompt_tokens": completion_prompt_tokens("hello world"),
                "completion_tokens": 16,
                "total_tokens": completion_prompt_tokens("hello world") + 16,
            }
            text = await (await client.get("/metrics")).text()
            families = {f.name: f for f in text_string_to_metric_families(text)}
            (success,) = [
                s
                for s in families["vllm:request_success"].samples
                if s.name.endswith("_total") and s.labels["finished_reason"] == "length"
            ]
            assert success.value == 1 and success.labels["model_name"] == MODEL

            pending = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": "x", "max_tokens": 99}))
            await until(lambda: served.in_flight == 1, "it is in flight")
            served.abort_all()
            assert (await pending).status == 503

    run(scenario)


def _waiting_by_reason(text: str) -> dict[str, float]:
    family = next(f for f in text_string_to_metric_families(text) if f.name == "vllm:num_requests_waiting_by_reason")
    return {s.labels["reason"]: s.value for s in family.samples}


def _lora_info(text: str) -> dict[tuple[str, str], tuple[str, float]]:
    """(running adapters, waiting adapters) -> (max_lora, time set) of each ``vllm:lora_requests_info`` series."""
    family = next(f for f in text_string_to_metric_families(text) if f.name == "vllm:lora_requests_info")
    assert family.type == "gauge" and family.documentation == "Running stats on lora requests."
    return {(s.labels["running_lora_adapters"], s.labels["waiting_lora_adapters"]): (s.labels["max_lora"], s.value)
            for s in family.samples}


def test_lora_adapters_are_models_and_a_request_for_one_too_many_waits_deferred() -> None:
    """With --max-loras 1, a request for a second adapter waits until the first adapter's requests have left the
    batch: vLLM counts it waiting for a reason other than the batch's capacity (deferred), and names both adapters
    in vllm:lora_requests_info, whose series of each moment keeps the time it was last seen."""

    async def scenario() -> None:
        async with serving(adapters=("sql", "chat")) as (client, served, clock):
            models = await (await client.get("/v1/models")).json()
            assert [(m["id"], m["parent"]) for m in models["data"]] == [(MODEL, None), ("sql", MODEL), ("chat", MODEL)]
            unknown = await client.post("/v1/completions", json={"model": "code", "prompt": [1], "max_tokens": 5})
            assert unknown.status == 404
            sql = asyncio.ensure_future(client.post("/v1/completions", json={"model": "sql", "prompt": [1] * 100,
                                                                             "max_tokens": 200}))
            await until(lambda: served.engine.num_waiting + served.engine.num_running == 1, "sql's is in flight")
            clock.now += 0.05
            served.tick()  # admitted: sql holds the batch's one adapter place
            chat = asyncio.ensure_future(client.post("/v1/completions", json={"model": "chat", "prompt": [1] * 100,
                                                                              "max_tokens": 5}))
            await until(lambda: served.engine.num_waiting == 1, "chat's waits")
            clock.now += 0.05
            served.tick()
            metrics = await (await client.get("/metrics")).text()
            assert _waiting_by_reason(metrics) == {"capacity": 0, "deferred": 1}
            deferred_at = served.created + clock.now
            assert _lora_info(metrics) == {("sql", "chat"): ("1", pytest.approx(deferred_at))}
            await run_until(served, clock, chat)
            answers = await (await sql).json(), await (await chat).json()
            assert [a["model"] for a in answers] == ["sql", "chat"]
            metrics = await (await client.get("/metrics")).text()
            assert _waiting_by_reason(metrics) == {"capacity": 0, "deferred": 0}
            assert _lora_info(metrics) == {("sql", "chat"): ("1", pytest.approx(deferred_at)),
                                           ("", ""): ("1", pytest.approx(served.created + clock.now))}

    run(scenario)


def _rejections(text: str) -> dict[str, float]:
    family = next(f for f in text_string_to_metric_families(text) if f.name == "vllm:admission_rejections")
    return {s.labels["reason"]: s.value for s in family.samples if s.name.endswith("_total")}


def test_queue_limits_refuse_with_503_and_count_by_limit() -> None:
    """--max-num-queued-reqs counts requests in flight, waiting or running; --max-num-queued-tokens the prompts of
    those not past their prefill. A refused request never reaches the engine; the counter says which limit."""

    async def scenario() -> None:
        async with serving(limits=QueueLimits(max_num_queued_reqs=2)) as (client, served, clock):
            posts = [asyncio.ensure_future(client.post("/v1/completions", json={"prompt": [1] * 100,
                                                                               "max_tokens": 50}))
                     for _ in range(2)]
            await until(lambda: served.engine.num_waiting + served.engine.num_running == 2, "two are in flight")
            refused = await client.post("/v1/completions", json={"prompt": [1] * 100, "max_tokens": 50})
            assert refused.status == 503
            error = (await refused.json())["error"]
            assert error["type"] == "ServiceUnavailableError" and "--max-num-queued-reqs 2" in error["message"]
            assert served.engine.num_waiting + served.engine.num_running == 2
            for post in posts:
                await run_until(served, clock, post)
                assert (await post).status == 200
            again = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": [1], "max_tokens": 5}))
            await run_until(served, clock, again)
            assert (await again).status == 200  # admitted once the others left
            text = await (await client.get("/metrics")).text()
            assert _rejections(text) == {"max_num_queued_reqs": 1, "max_num_queued_tokens": 0}

        async with serving(limits=QueueLimits(max_num_queued_tokens=3000)) as (client, served, clock):
            long = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": [1] * 3000,
                                                                             "max_tokens": 400, "stream": True}))
            await until(lambda: served.engine.num_waiting + served.engine.num_running == 1, "it is in flight")
            refused = await client.post("/v1/completions", json={"prompt": [1], "max_tokens": 5})
            assert refused.status == 503
            assert "--max-num-queued-tokens 3000" in (await refused.json())["error"]["message"]
            response = await long  # the stream's headers: the request is in flight
            first = asyncio.ensure_future(response.content.readline())
            await run_until(served, clock, first)  # its first token: its prefill is done
            short = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": [1], "max_tokens": 5}))
            await run_until(served, clock, short)
            assert (await short).status == 200
            response.close()
            assert _rejections(await (await client.get("/metrics")).text()) == {
                "max_num_queued_reqs": 0, "max_num_queued_tokens": 1}

    run(scenario)


def _sleep_state(text: str) -> dict[str, float]:
    family = next(f for f in text_string_to_metric_families(text) if f.name == "vllm:engine_sleep_state")
    return {s.labels["sleep_state"]: s.value for s in family.samples}


def test_a_sleeping_engine_says_so_fails_what_was_in_flight_and_refuses_requests_until_woken() -> None:
    async def scenario() -> None:
        async with serving() as (client, served, clock):
            assert (await client.post("/sleep")).status == 404  # no sleep mode: vLLM has no such route
            assert _sleep_state(await (await client.get("/metrics")).text()) == {
                "awake": 1, "weights_offloaded": 0, "discard_all": 0}
        async with serving(sleep_mode=True) as (client, served, clock):
            pending = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": [1], "max_tokens": 500}))
            await until(lambda: served.engine.num_waiting + served.engine.num_running == 1, "it is in flight")
            assert (await client.post("/sleep", params={"level": "3"})).status == 400
            assert (await client.post("/sleep", params={"level": "2"})).status == 200
            failed = await pending
            assert failed.status == 503 and "fell asleep" in (await failed.json())["error"]["message"]
            assert served.engine.num_waiting + served.engine.num_running == 0
            assert await (await client.get("/is_sleeping")).json() == {"is_sleeping": True}
            assert _sleep_state(await (await client.get("/metrics")).text()) == {
                "awake": 0, "weights_offloaded": 0, "discard_all": 1}
            refused = await client.post("/v1/completions", json={"prompt": [1], "max_tokens": 5})
            assert refused.status == 503 and "/wake_up" in (await refused.json())["error"]["message"]
            assert (await client.post("/sleep")).status == 200  # level 1 by default
            assert _sleep_state(await (await client.get("/metrics")).text())["weights_offloaded"] == 1
            assert (await client.post("/wake_up")).status == 200
            assert await (await client.get("/is_sleeping")).json() == {"is_sleeping": False}
            served_again = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": [1], "max_tokens": 5}))
            await run_until(served, clock, served_again)
            assert (await served_again).status == 200
            assert _sleep_state(await (await client.get("/metrics")).text())["awake"] == 1

    run(scenario)


def test_a_server_shutting_down_refuses_new_requests_and_finishes_those_in_flight() -> None:
    """SIGTERM to a vLLM started with --shutdown-timeout: what is in flight goes on to its last token, what comes
    after is refused with 503 (the pod runner decides when that starts, and when what is left is aborted)."""

    async def scenario() -> None:
        async with serving() as (client, served, clock):
            pending = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": [1] * 100,
                                                                                 "max_tokens": 50}))
            await until(lambda: served.in_flight == 1, "it is in flight")
            served.shutting_down = True
            refused = await client.post("/v1/completions", json={"prompt": [1], "max_tokens": 5})
            assert refused.status == 503 and "shutting down" in (await refused.json())["error"]["message"]
            await run_until(served, clock, pending)
            answer = await pending
            assert answer.status == 200 and (await answer.json())["usage"]["completion_tokens"] == 50
            assert served.in_flight == 0

    run(scenario)


def test_an_engine_woken_in_parts_sleeps_until_the_kv_cache_is_back_too() -> None:
    """``/wake_up?tags=weights`` then ``?tags=kv_cache``, as an RL trainer wakes vLLM to load new weights: the
    engine runs again only once both are back, and a tag that is not asleep changes nothing, as in vLLM's
    executor."""
    async def scenario() -> None:
        async with serving(sleep_mode=True) as (client, served, clock):
            assert (await client.post("/sleep", params={"level": "1"})).status == 200
            assert (await client.post("/wake_up", params={"tags": "weights"})).status == 200
            assert await (await client.get("/is_sleeping")).json() == {"is_sleeping": True}
            assert _sleep_state(await (await client.get("/metrics")).text()) == {
                "awake": 0, "weights_offloaded": 0, "discard_all": 0}
            refused = await client.post("/v1/completions", json={"prompt": [1], "max_tokens": 5})
            assert refused.status == 503
            for nothing in ({"tags": "weights"}, {"tags": "activations"}, [("tags", "kv_cache"), ("tags", "x")]):
                assert (await client.post("/wake_up", params=nothing)).status == 200
                assert await (await client.get("/is_sleeping")).json() == {"is_sleeping": True}, nothing
            assert (await client.post("/wake_up", params={"tags": "kv_cache"})).status == 200
            assert await (await client.get("/is_sleeping")).json() == {"is_sleeping": False}
            assert _sleep_state(await (await client.get("/metrics")).text())["awake"] == 1
            served_again = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": [1], "max_tokens": 5}))
            await run_until(served, clock, served_again)
            assert (await served_again).status == 200

    run(scenario)


@pytest.mark.parametrize(("prompt", "tokens"), [("abcd" * 10, 11), ([5, 6, 7], 3), (["abcd"], 2), ([[1, 2]], 2)])
def test_prompt_token_counts(prompt, tokens) -> None:
    assert completion_prompt_tokens(prompt) == tokens
