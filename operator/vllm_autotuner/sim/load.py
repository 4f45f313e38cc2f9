"""``vllm-autotuner sim load``: traffic for a Deployment on the simulated fleet.

Draws a :mod:`~vllm_autotuner.sim.workload` scenario and sends each request
at its arrival time to the Deployment's Ready pods, round-robin as a Service
would spread them, through vLLM's OpenAI ``/v1/completions`` API. Prompts go
as token ids, so the server counts exactly the prompt length the scenario
drew, and ``max_tokens`` with ``ignore_eos`` fixes the output length.

Pods are found the way a Service finds its endpoints: the Deployment's
selector, Ready pods only, at ``status.podIP`` and the port vLLM listens on
(its ``--port``, default 8000). The list is refreshed every two seconds, so a
rolling update moves the traffic to the new pods as it would move a
Service's. Only loopback pod addresses are used: this drives the simulated
fleet, never a real cluster's pods.

Answers come whole, or, with ``--stream``, as server-sent events, as a chat
front end asks for them; then the summary gives what such a client sees
(what vLLM's ``benchmark_serving`` reports): time to the first token, and
time per output token after it (``(e2e - TTFT) / (tokens - 1)``, a mean per
request, since the simulated server hands out tokens per tick of tens of
milliseconds, so single gaps are quantised). Its clients give up after
``--timeout`` seconds without a byte of the answer (by default 600, the
OpenAI Python client's timeout): for a whole answer that bounds the whole
request, for a stream the wait for each next event. The connection closes,
the simulated vLLM aborts the request, and the summary counts it. They do
not send it again (that client would, twice, for a whole answer). A stream
that ends without its ``[DONE]`` event is an error.

Bounded: it stops sending after ``--duration`` seconds or
``--max-requests`` requests, never has more than ``--max-in-flight``
requests open (arrivals beyond are counted as dropped), and gives the open
ones ``--drain`` seconds to finish. It prints progress as it goes and a JSON
summary as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import kubernetes
import numpy as np

from vllm_autotuner.controller.kube import label_selector
from vllm_autotuner.knobs import CommandLineError, find_vllm_container
from vllm_autotuner.sim.cli import SCENARIOS
from vllm_autotuner.sim.podlaunch import serving_port
from vllm_autotuner.sim.workload import (
    CLIENT_TIMEOUT_S,
    HOUR,
    MIXES,
    Scenario,
    bursty,
    chat_rag_shift,
    diurnal_with_batch_window,
    steady,
)

REFRESH_S = 2.0


def build_scenario(name: str, rate: float, mix: str, hours: float) -> Scenario:
    """The scenario ``name`` with ``rate`` as its main request rate (requests/s).

    ``steady``: Poisson at ``rate`` of ``mix``. ``bursty``: chat bursts at
    ``rate`` between stretches at a fifth of it. ``chat-rag-shift``: chat at
    ``rate``, long-prompt RAG at a quarter of it from 10:00 to 16:00.
    ``diurnal``: chat peaking at ``rate`` at 14:00 plus batch summarisation at
    a quarter of it from 01:00 to 05:00.
    """
    if name == "steady":
        return steady(rate, MIXES[mix], hours=hours)
    if name == "bursty":
        return bursty(rate, rate / 5)
    if name == "chat-rag-shift":
        return chat_rag_shift(rate, rate / 4)
    if name == "diurnal":
        return diurnal_with_batch_window(rate, rate / 4)
    raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")


def endpoints(pods: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Base URLs of the Ready pods, and warnings about pods left out."""
    urls, warnings = [], []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        meta, status = pod["metadata"], pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        if meta.get("deletionTimestamp") or not ready or not status.get("podIP"):
            continue
        ip = status["podIP"]
        if not ipaddress.ip_address(ip).is_loopback:
            warnings.append(f"{meta['name']}: podIP {ip} is not a loopback address; sim load drives only the "
                            "simulated fleet's pods")
            continue
        try:
            port = serving_port(find_vllm_container(pod["spec"]))
        except CommandLineError as exc:
            warnings.append(f"{meta['name']}: {exc}")
            continue
        urls.append(f"http://{ip}:{port}")
    return urls, warnings


@dataclass
class Stats:
    sent: int = 0
    ok: int = 0
    dropped: int = 0
    cut_off: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    per_pod: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    """Streamed answers only: seconds from sending to the first token's event."""
    tpots: list[float] = field(default_factory=list)
    """Streamed answers of two tokens or more: seconds per output token after the first."""
    output_tokens: int = 0

    def summary(self, elapsed: float) -> dict[str, Any]:
        figures = {"elapsed_s": round(elapsed, 1), "sent": self.sent, "ok": self.ok, "errors": dict(self.errors),
                   "dropped": self.dropped, "cut_off": self.cut_off, "per_pod": dict(self.per_pod),
                   **_quantiles("e2e", self.latencies, (50, 95)),
                   "output_tokens_per_s": round(self.output_tokens / elapsed, 1) if elapsed > 0 else 0.0}
        if self.ttfts:
            figures |= _quantiles("ttft", self.ttfts, (50, 95), mean=True)
            figures |= _quantiles("tpot", self.tpots, (50, 95), mean=True)
        return figures


def _quantiles(name: str, values: list[float], percents: tuple[int, ...], mean: bool = False) -> dict[str, float]:
    """``{name}_p{percent}_s`` (and ``{name}_mean_s``) of ``values``, in seconds to a tenth of a millisecond (a
    time per output token is a few); NaN without any."""
    array = np.array(values) if values else np.array([math.nan])
    figures = {f"{name}_mean_s": round(float(np.mean(array)), 4)} if mean else {}
    return figures | {f"{name}_p{p}_s": round(float(np.nanpercentile(array, p)), 4) for p in percents}


async def _streamed(response: aiohttp.ClientResponse) -> tuple[int | None, float | None]:
    """Reads a streamed answer's server-sent events: the output tokens its usage event counts (None when the stream
    ended without ``[DONE]``), and when the first event carrying a token arrived (None if none did)."""
    tokens, first = None, None
    async for line in response.content:
        if not line.startswith(b"data: "):
            continue
        data = line.removeprefix(b"data: ").strip()
        if data == b"[DONE]":
            return tokens, first
        event = json.loads(data)
        if event["choices"] and first is None:
            first = time.monotonic()
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
    return None, first


class Load:
    """One run of ``sim load``."""

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str, deployment: str,
                 timeout: float = CLIENT_TIMEOUT_S, models: tuple[str, ...] = (), stream: bool = False) -> None:
        self.core = kubernetes.client.CoreV1Api(api)
        self.apps = kubernetes.client.AppsV1Api(api)
        self.namespace, self.deployment, self.timeout = namespace, deployment, timeout
        self.models = models
        """The ``model`` of the requests in turn (LoRA adapters' names, the served model's); none: unnamed."""
        self.stream = stream
        self._sent = 0
        self.urls: list[str] = []
        self.stats = Stats()
        self._next = 0
        self._warned: set[str] = set()
        self.elapsed = 0.0

    def _list(self) -> list[str]:
        dep = self.apps.read_namespaced_deployment(self.deployment, self.namespace)
        selector = label_selector(self.apps.api_client.sanitize_for_serialization(dep.spec.selector))
        listing = json.loads(self.core.list_namespaced_pod(self.namespace, label_selector=selector,
                                                           _preload_content=False).data)
        urls, warnings = endpoints(listing["items"])
        for warning in set(warnings) - self._warned:
            print(f"warning: {warning}", file=sys.stderr)
        self._warned |= set(warnings)
        return urls

    async def _refresh(self) -> None:
        while True:
            try:
                self.urls = await asyncio.to_thread(self._list)
            except Exception as exc:  # noqa: BLE001 - keep the last list; say why
                print(f"warning: listing pods failed: {exc}", file=sys.stderr)
            await asyncio.sleep(REFRESH_S)

    def _pick(self) -> str | None:
        if not self.urls:
            return None
        url = self.urls[self._next % len(self.urls)]
        self._next += 1
        return url

    async def _send(self, session: aiohttp.ClientSession, prompt: int, output: int) -> None:
        url = self._pick()
        if url is None:
            self.stats.errors["no Ready pod"] += 1
            return
        body: dict[str, Any] = {"prompt": [1 + i % 30000 for i in range(prompt)], "max_tokens": output,
                                "ignore_eos": True}
        if self.models:
            body["model"] = self.models[self._sent % len(self.models)]
            self._sent += 1
        if self.stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        started = time.monotonic()
        try:
            async with session.post(url + "/v1/completions", json=body) as response:
                if response.status != 200:
                    await response.read()
                    self.stats.errors[f"HTTP {response.status}"] += 1
                    return
                if self.stream:
                    tokens, first = await _streamed(response)
                else:
                    tokens, first = (await response.json(content_type=None))["usage"]["completion_tokens"], None
        except TimeoutError:
            self.stats.errors[f"gave up after {self.timeout:g}s"] += 1
            return
        except (aiohttp.ClientError, json.JSONDecodeError) as exc:
            self.stats.errors[type(exc).__name__] += 1
            return
        finished = time.monotonic()
        if tokens is None:
            self.stats.errors["stream ended without [DONE]"] += 1
            return
        self.stats.ok += 1
        self.stats.per_pod[url] += 1
        self.stats.latencies.append(finished - started)
        self.stats.output_tokens += tokens
        if first is not None:
            self.stats.ttfts.append(first - started)
            if tokens > 1:
                self.stats.tpots.append((finished - first) / (tokens - 1))

    async def run(self, scenario: Scenario, *, start_s: float, duration: float, max_requests: int,
                  max_in_flight: int, drain: float, progress: float, seed: int, wait: float) -> Stats:
        workload = scenario.generate(seed)
        lo, hi = np.searchsorted(workload.arrival, [start_s, start_s + duration])
        hi = min(hi, lo + max_requests)
        arrivals = (workload.arrival[lo:hi] - start_s).tolist()
        prompts, outputs = workload.prompt_tokens[lo:hi].tolist(), workload.output_tokens[lo:hi].tolist()
        refresher = asyncio.ensure_future(self._refresh())
        deadline = time.monotonic() + wait
        while not self.urls and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        if not self.urls:
            refresher.cancel()
            raise RuntimeError(f"no Ready pod of deployment {self.namespace}/{self.deployment} within {wait:g}s; "
                               "check `kubectl get pods` and that `vllm-autotuner sim fleet` runs")
        print(f"sending {len(arrivals)} requests over {duration:g}s to {len(self.urls)} pod(s) of "
              f"{self.namespace}/{self.deployment}", flush=True)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=self.timeout)
        open_requests: set[asyncio.Task[None]] = set()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
            begin = time.monotonic()
            next_report = begin + progress
            for arrival, prompt, output in zip(arrivals, prompts, outputs, strict=True):
                while (now := time.monotonic()) < begin + arrival:
                    if now >= next_report:
                        self._report(now - begin, len(open_requests))
                        next_report += progress
                    await asyncio.sleep(min(begin + arrival, next_report) - now)
                if len(open_requests) >= max_in_flight:
                    self.stats.dropped += 1
                    continue
                self.stats.sent += 1
                task = asyncio.ensure_future(self._send(session, prompt, output))
                open_requests.add(task)
                task.add_done_callback(open_requests.discard)
            if open_requests:
                _, pending = await asyncio.wait(set(open_requests), timeout=drain)
                for task in pending:
                    task.cancel()
                self.stats.cut_off = len(pending)
                await asyncio.gather(*pending, return_exceptions=True)
            self.elapsed = time.monotonic() - begin
        refresher.cancel()
        return self.stats

    def _report(self, elapsed: float, in_flight: int) -> None:
        s = self.stats
        print(f"{elapsed:6.0f}s sent {s.sent} ok {s.ok} errors {sum(s.errors.values())} in flight {in_flight} "
              f"pods {len(self.urls)}", flush=True)


def main(args: argparse.Namespace) -> int:
    if not args.kubeconfig:
        print("sim load: no kubeconfig: pass --kubeconfig or set KUBECONFIG", file=sys.stderr)
        return 2
    timeout = CLIENT_TIMEOUT_S if args.timeout is None else args.timeout
    if not (args.rate > 0 and args.duration > 0 and timeout > 0):
        print("sim load: --rate, --duration and --timeout must be positive", file=sys.stderr)
        return 2
    if args.mix not in MIXES:
        print(f"sim load: unknown --mix {args.mix!r}; known: {', '.join(sorted(MIXES))}", file=sys.stderr)
        return 2
    hours = math.ceil((args.start_hour * HOUR + args.duration) / HOUR)
    scenario = build_scenario(args.scenario, args.rate, args.mix, hours)
    load = Load(kubernetes.config.new_client_from_config(config_file=args.kubeconfig), args.namespace,
                args.deployment, timeout, tuple(args.models or ()), args.stream)
    try:
        stats = asyncio.run(load.run(scenario, start_s=args.start_hour * HOUR, duration=args.duration,
                                     max_requests=args.max_requests, max_in_flight=args.max_in_flight,
                                     drain=args.drain, progress=args.progress, seed=args.seed, wait=args.wait))
    except kubernetes.client.ApiException as exc:
        print(f"sim load: {exc.status} {exc.reason}: is deployment {args.namespace}/{args.deployment} there?",
              file=sys.stderr)
        return 1
    except RuntimeError as exc:
        print(f"sim load: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(stats.summary(load.elapsed)), flush=True)
    return 0 if stats.ok else 1
