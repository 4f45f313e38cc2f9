"""/healthz and /metrics answer on every address by default: a single-stack IPv6 cluster probes the pod's IPv6
address, and Prometheus scrapes it there."""

from __future__ import annotations

import asyncio
import socket

from vllm_autotuner.cli import build_parser
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.operator import HttpEndpoints
from vllm_autotuner.sim import localenv


def _ipv6_loopback() -> bool:
    """Whether this machine has an IPv6 loopback to reach (a kernel booted without IPv6 has none)."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_by_default_healthz_answers_on_ipv4_and_ipv6() -> None:
    port = localenv.free_port()

    async def answers(host: str) -> bytes:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
        await writer.drain()
        answer = await reader.read()
        writer.close()
        return answer

    async def scenario() -> list[bytes]:
        http = HttpEndpoints(OperatorMetrics(), build_parser().parse_args(["run"]).http_host, port)
        await http.start()
        try:
            return [await answers(host) for host in ("127.0.0.1", *(("::1",) if _ipv6_loopback() else ()))]
        finally:
            await http.stop()

    found = asyncio.run(scenario())
    assert found and all(answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"ok") for answer in found)
    assert len(found) == 2 or not _ipv6_loopback()
