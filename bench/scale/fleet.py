"""``python -m bench.scale.fleet``: the simulated GPU fleet without engines, for a thousand pods.

It is ``vllm-autotuner sim fleet`` (same flags, same Nodes, leases, pod watch,
loopback pod addresses and Prometheus targets file) with one thing
swapped: a pod is run by :class:`SteadyPodRunner` instead of the simulated
vLLM start-up and engine. Such a pod turns Ready as soon as it is bound,
and its ``podIP:port/metrics`` serves the steady state of its traffic under
its own knobs (:mod:`bench.scale.traffic`), named by the Deployment's
``bench.vllm-autotuner.io/traffic`` pod annotation. What the operator sees
is the same as with the full fleet: Deployments that roll when patched,
ReplicaSets, Ready pods, and vLLM series per pod in Prometheus; what it
costs is a status write per pod and a few milliseconds per scrape.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import datetime, timezone
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.utils import floatToGoString

from bench.scale.traffic import SteadyState, Traffic, served_info, steady_state
from vllm_autotuner.sim import cli as sim_cli
from vllm_autotuner.sim import fleet
from vllm_autotuner.sim.metrics import ServerInfo, VllmCollector
from vllm_autotuner.sim.podlaunch import LaunchError, VllmLaunch
from vllm_autotuner.sim.podrunner import SHUTDOWN_TIMEOUT_S, PodRunner

TRAFFIC_ANNOTATION = "bench.vllm-autotuner.io/traffic"
"""Pod annotation naming the traffic its vLLM serves (``Traffic`` as text, e.g. ``chat@18``)."""
TICK_S = 1.0
"""No engines to advance: the fleet's tick only has to notice that there are none."""


def exported(state: SteadyState, info: ServerInfo, age: float) -> str:
    """What the simulator's vLLM exporter serves for a pod ``age`` seconds into ``state``."""
    registry = CollectorRegistry()
    registry.register(VllmCollector(lambda: state.at(age), info))
    return generate_latest(registry).decode()


class Exposition:
    """A pod's ``/metrics`` text at any age, as the simulator's vLLM exporter renders it, but fast.

    Every sample of :meth:`SteadyState.at` is either constant (gauges,
    ``_created``) or its per-second value times the age, so rendering the
    exporter at two ages tells which is which; a scrape then only multiplies.
    The exporter itself took a few milliseconds a scrape: most of a core's
    fifth for a thousand pods scraped every 15 s.
    """

    def __init__(self, state: SteadyState, info: ServerInfo) -> None:
        once, twice = (exported(state, info, age).splitlines() for age in (1.0, 2.0))
        self._lines: list[tuple[str, float | None]] = []
        for line, later in zip(once, twice, strict=True):
            if line == later:
                self._lines.append((line, None))
            else:
                name, value = line.rsplit(" ", 1)
                self._lines.append((name + " ", float(value)))

    def render(self, age: float) -> bytes:
        """What the exporter would serve for a pod ``age`` seconds old."""
        return "".join(f"{text}{floatToGoString(rate * age)}\n" if rate is not None else f"{text}\n"
                       for text, rate in self._lines).encode()


class SteadyPodRunner(PodRunner):
    """A vLLM pod that is Ready at once and serves the steady state of its traffic."""

    async def _run_vllm(self, spec: dict[str, Any], container: Any, launch: VllmLaunch | LaunchError | None) -> None:
        if not isinstance(launch, VllmLaunch):  # a command line vLLM refuses crash-loops as on the full fleet
            await super()._run_vllm(spec, container, launch)
            return
        container.run(f"bench://{self.uid}", datetime.now(timezone.utc))
        await self._serve(launch)
        container.started = container.ready = True
        await self._write_status()
        await asyncio.Event().wait()  # serves until the pod goes

    async def _serve(self, launch: VllmLaunch) -> None:
        traffic = Traffic.parse((self.pod["metadata"].get("annotations") or {})[TRAFFIC_ANNOTATION])
        state = await asyncio.to_thread(steady_state, traffic, launch.config, self.node.profile.name)
        started = time.time()
        exposition = Exposition(state, served_info(state, launch.served_model_name, started))

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=exposition.render(time.time() - started),
                                headers={"Content-Type": CONTENT_TYPE_LATEST})

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        self._server = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await self._server.setup()
        assert self._sock is not None
        await web.SockSite(self._server, self._sock, shutdown_timeout=SHUTDOWN_TIMEOUT_S).start()


def main(argv: list[str] | None = None) -> int:
    """Parse ``sim fleet``'s flags and run the fleet with :class:`SteadyPodRunner`."""
    parser = argparse.ArgumentParser(prog="python -m bench.scale.fleet")
    sim_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["sim", "fleet", f"--tick={TICK_S:g}", *(sys.argv[1:] if argv is None else argv)])
    return fleet.main(args, runner=SteadyPodRunner)


if __name__ == "__main__":
    sys.exit(main())
