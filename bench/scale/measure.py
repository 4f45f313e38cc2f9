"""The operator as a real process, measured one evaluation period at a time.

Everything comes from outside the operator, as a platform team would see
it: its own ``/metrics`` (periods and their duration, PromQL queries,
Kubernetes API calls outside the watches and the time they took, decisions)
and the kernel's accounting in ``/proc/<pid>`` (CPU seconds, resident
memory) for the operator and for Prometheus, which answers the queries. A
period is one tick of the evaluator (every tuning that is due, evaluated
together); the sampler looks when a tick should be about to end, waits for
it to end and takes the differences, so every figure of a row belongs to
one period (what the operator does between two ticks, such as handling the
watch events of its own status writes, goes with the tick after).

The sampler scrapes ``/metrics`` itself, a few times per period: about
what a Prometheus scraping the operator costs it, and included in the
operator's CPU figures.
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from vllm_autotuner.sim import localenv

OPERATOR = Path(sys.executable).with_name("vllm-autotuner")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MiB = 1024**2
POLL_S = 0.25


#: The rollouts a platform team lets start at once at this size (``--max-concurrent-rollouts``): the capped mode's.
CAPPED_ROLLOUTS = 20
#: The operator's arguments in each mode: batched queries (its default); the same with at most CAPPED_ROLLOUTS
#: rollouts at once, so that a hundred tunings wanting a change at once start theirs over several periods; one
#: query per metric family per tuning.
MODE_ARGS = {"batched": (), "capped": (f"--max-concurrent-rollouts={CAPPED_ROLLOUTS}",), "naive": ("--naive-queries",)}


@dataclass(frozen=True)
class Sample:
    """Counters read at one moment: the operator's /metrics, and /proc of the operator and Prometheus."""

    taken_at: float
    """Unix time."""
    periods: float
    period_seconds: float
    queries: float
    api_calls: dict[str, float]
    api_seconds: float
    decisions: dict[str, float]
    cpu_seconds: float
    rss_bytes: int
    prometheus_cpu_seconds: float


@dataclass(frozen=True)
class Period:
    """One evaluation period: differences between the samples that end it and the one before."""

    ticks: int
    """Evaluator ticks that ended in the period: 1, unless a tick overran the interval and the next followed at once."""
    evaluated: int
    """Decisions made: one per tuning evaluated."""
    changes: int
    """Decisions that changed the knobs (a patch and a rolling update)."""
    wall_seconds: float
    queries: int
    api_calls: int
    api_seconds: float
    """The calls' durations added up (up to ``evaluator.CONCURRENCY`` run at once): time spent waiting for the
    apiserver."""
    cpu_seconds: float
    rss_mib: float
    prometheus_cpu_seconds: float
    api_calls_by_kind: dict[str, int] = field(default_factory=dict)
    decisions_by_kind: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ModeRun:
    """One operator process: how long until every tuning was evaluated once, then its periods."""

    mode: str
    startup_seconds: float
    periods: list[Period]
    peak_rss_mib: float


@dataclass(frozen=True)
class Machine:
    """What ran the benchmark. Its figures are this machine's: the same work has taken 2.3x the CPU seconds on
    another machine of the same kind, so a report names the CPU, the cores, the memory and the load it started
    under."""

    cores: int
    cpu: str
    memory_gib: float
    kernel: str
    python: str
    load_average: float  # over the minute before the benchmark started

    @classmethod
    def this(cls) -> Machine:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "unknown")
        memory_gib = round(_size(Path("/proc/meminfo"), "MemTotal") / 2**30, 1)
        return cls(cores=os.cpu_count() or 1, cpu=cpu, memory_gib=memory_gib,
                   kernel=platform.release(), python=platform.python_version(), load_average=os.getloadavg()[0])

    def __str__(self) -> str:
        return (f"{self.cores} cores ({self.cpu}), {self.memory_gib:g} GiB memory, Linux {self.kernel}, "
                f"Python {self.python}; load average {self.load_average:.2f} at the start")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime: fields 14 and 15 of stat


def _size(path: Path, key: str) -> int:
    """Bytes of a ``key: N kB`` line of a /proc file."""
    for line in path.read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(f"{key} in {path}")


def memory_bytes(pid: int, key: str) -> int:
    """A size from /proc/<pid>/status (``VmRSS``: resident now, ``VmHWM``: the peak)."""
    return _size(Path(f"/proc/{pid}/status"), key)


def _labelled(samples: list, key: Callable[[dict[str, str]], str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in samples:
        out[key(s.labels)] = out.get(key(s.labels), 0.0) + s.value
    return out


def read_sample(metrics_url: str, pid: int, prometheus_pid: int) -> Sample:
    with urllib.request.urlopen(metrics_url, timeout=30) as response:
        text = response.read().decode()
    samples: dict[str, list] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name].append(s)

    def total(name: str) -> float:
        return sum(s.value for s in samples[name])

    return Sample(
        taken_at=time.time(),
        periods=total("vllm_autotuner_evaluation_period_duration_seconds_count"),
        period_seconds=total("vllm_autotuner_evaluation_period_duration_seconds_sum"),
        queries=total("vllm_autotuner_prometheus_queries_total"),
        api_calls=_labelled(samples["vllm_autotuner_kubernetes_api_calls_total"],
                            lambda labels: f"{labels['verb']} {labels['resource']}"),
        api_seconds=total("vllm_autotuner_kubernetes_api_call_duration_seconds_sum"),
        decisions=_labelled(samples["vllm_autotuner_decisions_total"],
                            lambda labels: f"{labels['action']} {labels['reason']}".strip()),
        cpu_seconds=cpu_seconds(pid),
        rss_bytes=memory_bytes(pid, "VmRSS"),
        prometheus_cpu_seconds=cpu_seconds(prometheus_pid),
    )


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    return {k: round(v - before.get(k, 0.0)) for k, v in sorted(after.items()) if round(v - before.get(k, 0.0))}


def period_between(before: Sample, after: Sample) -> Period:
    decisions = _delta(after.decisions, before.decisions)
    api_calls = _delta(after.api_calls, before.api_calls)
    return Period(
        ticks=round(after.periods - before.periods),
        evaluated=sum(decisions.values()),
        changes=sum(n for kind, n in decisions.items() if kind.split()[0] in ("Change", "Rollback")),
        wall_seconds=after.period_seconds - before.period_seconds,
        queries=round(after.queries - before.queries),
        api_calls=sum(api_calls.values()),
        api_seconds=after.api_seconds - before.api_seconds,
        cpu_seconds=after.cpu_seconds - before.cpu_seconds,
        rss_mib=after.rss_bytes / MiB,
        prometheus_cpu_seconds=after.prometheus_cpu_seconds - before.prometheus_cpu_seconds,
        api_calls_by_kind=api_calls,
        decisions_by_kind=decisions,
    )


class OperatorRun:
    """``vllm-autotuner run`` against the benchmark's cluster and Prometheus, in one mode."""

    def __init__(self, mode: str, kubeconfig: Path, prometheus: localenv.Prometheus, workdir: Path,
                 interval: float, say: Callable[[str], None]) -> None:
        self.mode = mode
        self.prometheus = prometheus
        self.interval = interval
        self.say = say
        port = localenv.free_port()
        self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        args = [str(OPERATOR), "run", f"--prometheus-url={prometheus.url}", "--http-host=127.0.0.1",
                f"--http-port={port}", "--no-leader-election", *MODE_ARGS[mode]]
        log = workdir / f"operator-{mode}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                       env={**os.environ, "KUBECONFIG": str(kubeconfig)}, start_new_session=True)
        self.server = localenv.Server(f"operator ({mode})", process.pid, log, process=process)
        self.started = time.monotonic()

    def sample(self) -> Sample:
        if not self.server.alive():
            raise RuntimeError(f"the operator exited; end of {self.server.log}:\n{self.server.log_tail()}")
        return read_sample(self.metrics_url, self.server.pid, self.prometheus.pid)

    def _until_all_evaluated(self, tunings: int, timeout: float) -> tuple[Sample, float]:
        """Wait until every tuning has been evaluated once and a tick has ended since:
        the sample at that end, and how long that tick took."""
        def evaluated() -> Sample | None:
            s = self.sample()
            return s if sum(s.decisions.values()) >= tunings else None

        previous = localenv.wait_until(evaluated, timeout, f"the operator to evaluate all {tunings} tunings", 1.0)
        while True:
            time.sleep(1.0)
            s = self.sample()
            if s.periods > previous.periods:
                return s, (s.period_seconds - previous.period_seconds) / (s.periods - previous.periods)
            previous = s

    def _tick_end(self, previous: Sample, last: float) -> Sample:
        """The sample once the tick after the one ``previous`` saw end (which took ``last`` seconds) has ended.

        Ticks start on multiples of the interval, or at once when the one
        before ran past the next multiple. The operator is first looked at
        when the tick should be about to end (if it takes as long as the last
        one), then every :data:`POLL_S` (or 1 % of a long tick), so that a
        tick followed at once by the next is sampled close to its end while
        the operator is scraped only a few times per period.
        """
        started_last = previous.taken_at - last  # or a little later: the sample came after the end
        starts = max(previous.taken_at, (math.floor(started_last / self.interval) + 1) * self.interval)
        time.sleep(max(0.0, starts + 0.9 * last - time.time()))
        while True:
            s = self.sample()
            if s.periods > previous.periods:
                return s
            time.sleep(max(POLL_S, last / 100))

    def measure(self, tunings: int, periods: int, budget: float, timeout: float) -> ModeRun:
        """Start-up, then ``periods`` evaluation periods, fewer if they take more than ``budget``
        seconds in all (at least one); stops the operator in the end."""
        try:
            base, last = self._until_all_evaluated(tunings, timeout)
            startup = time.monotonic() - self.started
            self.say(f"{self.mode}: all {tunings} tunings evaluated {startup:.0f}s after the operator started")
            rows = []
            deadline = time.monotonic() + budget
            for i in range(periods):
                if rows and time.monotonic() > deadline:
                    self.say(f"{self.mode}: {budget:.0f}s of periods measured; stopping after {len(rows)}")
                    break
                after = self._tick_end(base, last)
                row = period_between(base, after)
                last = row.wall_seconds / row.ticks
                rows.append(row)
                self.say(f"{self.mode} period {i + 1}/{periods}: {row.evaluated} evaluated, {row.changes} changes, "
                         f"{row.wall_seconds:.2f}s, {row.queries} queries, "
                         f"{row.api_calls} API calls ({row.api_seconds:.1f}s), "
                         f"CPU {row.cpu_seconds:.2f}s, RSS {row.rss_mib:.0f} MiB")
                base = after
            peak = memory_bytes(self.server.pid, "VmHWM") / MiB
        finally:
            self.server.stop()
        return ModeRun(self.mode, startup, rows, peak)
