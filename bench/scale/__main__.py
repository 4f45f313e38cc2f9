"""``python -m bench.scale`` (``make bench-scale``): the operator at 100 and 1000 VllmTunings.

See the package docstring for what is measured and why. For every size a
fresh local control plane, Prometheus and stand-in fleet are started, the
Deployments created and rolled out, and the operator run once per mode
(batched, capped, then naive) against the same objects: before each mode
after the first the VllmTunings are re-created and every Deployment the mode
before changed is put back, so every mode starts from the same state and has
the same work.
Servers' logs stay under ``.local/bench-scale/`` (git ignores it); the
report goes to ``--out`` as ``scale.md`` and ``scale.json``.

    make bench-scale                 # 100 and 1000 tunings, 5 periods each mode (about 45 minutes)
    make bench-scale QUICK=1         # 4 tunings, 2 short periods: proves it works, measures nothing
    python -m bench.scale --sizes 200 --periods 3
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import kubernetes
from prometheus_api_client import PrometheusConnect

from bench.scale.cluster import GPUS_PER_NODE, PROFILE, WORKERS, BenchCluster, Timing, nodes_for
from bench.scale.measure import CAPPED_ROLLOUTS, Machine, ModeRun, OperatorRun
from bench.scale.report import MODES, SizeRun, as_json, periods_table, summary_table, targets
from vllm_autotuner.api.resource import CRD_NAME
from vllm_autotuner.sim import localenv

FULL = Timing(evaluation_interval=30, window=60, settle=30, scrape_interval=15)
"""The issue's 30 s interval and a production-like 15 s scrape; a 1 min window and 30 s settle time (the
defaults are 5 min and 2 min) so that changes and their rollouts happen within a few periods."""
QUICK = Timing(evaluation_interval=5, window=15, settle=0, scrape_interval=1)
CRD_FILE = localenv.ROOT / "crds" / f"{CRD_NAME}.yaml"
LOGS = localenv.STATE_DIR / "bench-scale"
ROLLOUT_TIMEOUT_S = 1800


class Progress:
    """Progress lines on stderr, with the time since the start."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.prefix = ""

    def __call__(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:6.0f}s] {self.prefix}{message}", file=sys.stderr, flush=True)


def _kube_client(kubeconfig: Path) -> kubernetes.client.ApiClient:
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = WORKERS
    return kubernetes.client.ApiClient(configuration)


def _apply_crd(kubeconfig: Path) -> None:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "KUBERC": "off"}
    for args in (["apply", "--server-side", "-f", str(CRD_FILE)],
                 ["wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD_NAME}"]):
        result = subprocess.run([str(localenv.KUBECTL), *args], env=env, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"kubectl {shlex.join(args)} exited {result.returncode}: {result.stderr}")


def _wait_for_series(prometheus: localenv.Prometheus, pods: int, timing: Timing, say: Progress) -> None:
    """Until Prometheus has scraped every pod, then one window and settle time more (the first window
    the operator looks at must lie wholly after the pods started)."""
    prom = PrometheusConnect(prometheus.url)

    def scraped() -> bool:
        rows = prom.custom_query("count(vllm:num_requests_running)")
        return bool(rows) and int(float(rows[0]["value"][1])) >= pods

    localenv.wait_until(scraped, 10 * timing.scrape_interval + 120, f"Prometheus to scrape all {pods} pods", 1.0)
    wait = timing.window + timing.settle + 2 * timing.scrape_interval
    say(f"Prometheus scrapes all {pods} pods; waiting {wait:g}s for a full window of their series")
    time.sleep(wait)


def run_size(count: int, timing: Timing, periods: int, budget: float, workdir: Path, say: Progress) -> SizeRun:
    say.prefix = f"N={count}: "
    started = time.monotonic()
    servers: list[localenv.Server] = []
    try:
        say("starting the control plane and Prometheus")
        control_plane = localenv.start_control_plane(workdir / "testenv")
        servers.append(control_plane)
        prometheus = localenv.start_prometheus(workdir / "prometheus", scrape_interval=timing.scrape_interval)
        servers.append(prometheus)
        _apply_crd(control_plane.kubeconfig)
        nodes = nodes_for(count)
        say(f"starting the stand-in fleet: {nodes} nodes of {GPUS_PER_NODE} GPUs")
        servers.append(localenv.start_fleet(workdir / "fleet", control_plane.kubeconfig,
                                            prometheus.fleet_targets_file, pools=[f"{PROFILE}:{nodes}:{GPUS_PER_NODE}"],
                                            time_scale=1.0, name_prefix="bench", timeout=300,
                                            command=("-m", "bench.scale.fleet")))
        api = _kube_client(control_plane.kubeconfig)
        cluster = BenchCluster(api, count, timing, say)
        cluster.create_deployments()
        cluster.wait_rolled_out(ROLLOUT_TIMEOUT_S)
        _wait_for_series(prometheus, count, timing, say)
        setup = time.monotonic() - started
        runs: dict[str, ModeRun] = {}
        for i, mode in enumerate(MODES):
            if i:
                cluster.delete_tunings()
                if cluster.reset_deployments():
                    cluster.wait_rolled_out(ROLLOUT_TIMEOUT_S)
                    time.sleep(timing.window + timing.settle + 2 * timing.scrape_interval)
            cluster.create_tunings()
            say(f"{mode}: starting the operator")
            operator = OperatorRun(mode, control_plane.kubeconfig, prometheus, workdir,
                                   timing.evaluation_interval, say)
            runs[mode] = operator.measure(count, periods, budget, timeout=ROLLOUT_TIMEOUT_S)
        return SizeRun(count, setup, runs)
    finally:
        for server in reversed(servers):
            server.stop()
        shutil.rmtree(workdir / "prometheus" / "data", ignore_errors=True)  # gigabytes at 1000 pods
        say.prefix = ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000], help="numbers of VllmTunings")
    parser.add_argument("--periods", type=int, default=5, help="evaluation periods measured per mode")
    parser.add_argument("--mode-minutes", type=float, default=12,
                        help="stop measuring a mode after the period that ends past this many minutes (a naive "
                             "period at 1000 tunings takes many)")
    parser.add_argument("--quick", action="store_true",
                        help="4 tunings, 2 periods of 5 s, 1 s scrapes: checks that the benchmark works")
    parser.add_argument("--out", type=Path, default=localenv.ROOT / "bench" / "results",
                        help="directory of scale.md and scale.json")
    args = parser.parse_args(argv)
    timing = QUICK if args.quick else FULL
    sizes, periods = ([4], 2) if args.quick else (args.sizes, args.periods)
    command = "make bench-scale QUICK=1" if args.quick else shlex.join(["python", "-m", "bench.scale", *(argv or sys.argv[1:])])
    # The stand-in fleet runs as `python -m bench.scale.fleet` in a directory of its own.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(localenv.ROOT), os.environ.get("PYTHONPATH")]))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on the way out, as on Ctrl-C
    say = Progress()
    logs = LOGS / time.strftime("%Y%m%d-%H%M%S")
    machine = Machine.this()
    results = [run_size(n, timing, periods, 60 * args.mode_minutes, logs / str(n), say) for n in sizes]
    report = "\n\n".join([
        f"Command: `{command}`. Evaluation interval {timing.evaluation_interval:g} s, window {timing.window:g} s, "
        f"settle time {timing.settle:g} s, Prometheus scrape interval {timing.scrape_interval:g} s. "
        f"Machine: {machine}; the control plane, Prometheus, the stand-in fleet and the operator share it. "
        f"Modes: batched (the operator's default), capped (batched with --max-concurrent-rollouts={CAPPED_ROLLOUTS}), "
        "naive (--naive-queries: one query per metric family per tuning).",
        summary_table(results),
        "\n".join(targets(results, timing)),
        "Every measured period:",
        periods_table(results),
    ])
    print(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale.md").write_text(f"# Operator scale benchmark\n\n{report}\n")
    (args.out / "scale.json").write_text(json.dumps(as_json(results, timing, command, machine), indent=1) + "\n")
    say(f"report written to {args.out / 'scale.md'} and scale.json; server logs under {logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
