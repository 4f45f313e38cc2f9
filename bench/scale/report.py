"""The benchmark's tables: every period, a summary per size and mode with naive/batched ratios, and the targets.

All figures of one report come from one run; nothing here measures. The
summary takes the median over the measured periods (the first period
after start-up included) and the largest resident memory. "API call s" adds
up how long each Kubernetes API call took: up to 16 run at once, so it can
exceed the period's wall time, and beside the operator's CPU seconds it says
whether a slow period waited for the apiserver or computed.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from bench.scale.cluster import Timing
from bench.scale.measure import MODE_ARGS, Machine, ModeRun

MODES = tuple(MODE_ARGS)
TARGET_TUNINGS = 1000
TARGET_RSS_MIB = 300


@dataclass(frozen=True)
class SizeRun:
    """Both modes against one cluster of ``tunings`` Deployments and VllmTunings."""

    tunings: int
    setup_seconds: float
    runs: dict[str, ModeRun]


@dataclass(frozen=True)
class Summary:
    tunings: int
    mode: str
    wall: float
    wall_max: float
    queries: float
    api_calls: float
    api_seconds: float
    cpu: float
    rss: float
    prometheus_cpu: float
    evaluated: float
    changes: int


def summarize(size: SizeRun, mode: str) -> Summary:
    run = size.runs[mode]

    def median(field: str) -> float:
        return statistics.median(getattr(p, field) for p in run.periods)

    return Summary(
        tunings=size.tunings, mode=mode, wall=median("wall_seconds"),
        wall_max=max(p.wall_seconds / p.ticks for p in run.periods), queries=median("queries"),
        api_calls=median("api_calls"), api_seconds=median("api_seconds"), cpu=median("cpu_seconds"),
        rss=max(run.peak_rss_mib, *(p.rss_mib for p in run.periods)),
        prometheus_cpu=median("prometheus_cpu_seconds"), evaluated=median("evaluated"),
        changes=sum(p.changes for p in run.periods),
    )


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}x" if b else "-"


def _markdown(columns: list[str], rows: list[list[str]]) -> str:
    """A table; the second column (the mode) is text, the others numbers."""
    align = ["---:", "---", *["---:"] * (len(columns) - 2)]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in [columns, align, *rows])


def summary_table(sizes: list[SizeRun]) -> str:
    """The headline: per size, the modes side by side, and naive/batched."""
    rows = []
    for size in sizes:
        found = {mode: summarize(size, mode) for mode in MODES if mode in size.runs}
        rows += [[str(s.tunings), s.mode, f"{s.wall:.2f} ({s.wall_max:.2f})", f"{s.queries:.0f}",
                  f"{s.api_calls:.0f}", f"{s.api_seconds:.2f}", f"{s.cpu:.2f}", f"{s.rss:.0f}",
                  f"{s.prometheus_cpu:.2f}", str(s.changes)]
                 for s in found.values()]
        if {"batched", "naive"} <= found.keys():
            b, n = found["batched"], found["naive"]
            rows.append([str(size.tunings), "naive / batched", _ratio(n.wall, b.wall), _ratio(n.queries, b.queries),
                         _ratio(n.api_calls, b.api_calls), _ratio(n.api_seconds, b.api_seconds),
                         _ratio(n.cpu, b.cpu), _ratio(n.rss, b.rss),
                         _ratio(n.prometheus_cpu, b.prometheus_cpu), ""])
    return _markdown(["tunings", "mode", "wall s / period (median, max)", "Prometheus queries / period",
                      "API calls / period", "API call s / period", "operator CPU s / period", "operator RSS MiB (max)",
                      "Prometheus CPU s / period", "changes"], rows)


def periods_table(sizes: list[SizeRun]) -> str:
    """Every measured period, in the order they ran."""
    rows = []
    for size in sizes:
        for mode, run in size.runs.items():
            rows += [[str(size.tunings), mode, f"{i}" + (f" ({p.ticks} ticks)" if p.ticks != 1 else ""),
                      str(p.evaluated), str(p.changes), f"{p.wall_seconds:.2f}", str(p.queries), str(p.api_calls),
                      f"{p.api_seconds:.2f}", f"{p.cpu_seconds:.2f}", f"{p.rss_mib:.0f}",
                      f"{p.prometheus_cpu_seconds:.2f}"]
                     for i, p in enumerate(run.periods, 1)]
    return _markdown(["tunings", "mode", "period", "evaluated", "changes", "wall s", "queries", "API calls",
                      "API call s", "operator CPU s", "RSS MiB", "Prometheus CPU s"], rows)


def targets(sizes: list[SizeRun], timing: Timing) -> list[str]:
    """The issue's targets, each with the figure that meets or misses it."""
    batched = {size.tunings: summarize(size, "batched") for size in sizes if "batched" in size.runs}
    out = []
    largest = batched.get(max(batched, default=0))
    if largest is not None:
        ok = largest.wall_max < timing.evaluation_interval and largest.evaluated >= largest.tunings
        scale = "" if largest.tunings >= TARGET_TUNINGS else f" (largest size run: {largest.tunings})"
        out.append(f"- {'met' if ok else 'MISSED'}: {largest.tunings} tunings on one replica at a "
                   f"{timing.evaluation_interval:g} s interval{scale}: every period took at most "
                   f"{largest.wall_max:.2f} s, median {largest.evaluated:.0f} tunings evaluated per period")
        ok = largest.rss < TARGET_RSS_MIB
        out.append(f"- {'met' if ok else 'MISSED'}: RSS under {TARGET_RSS_MIB} MiB: at most {largest.rss:.0f} MiB "
                   f"with {largest.tunings} tunings")
    queries = {n: s.queries for n, s in sorted(batched.items())}
    if len(queries) > 1:
        ok = len(set(queries.values())) == 1
        shown = ", ".join(f"{q:.0f} at {n}" for n, q in queries.items())
        out.append(f"- {'met' if ok else 'MISSED'}: Prometheus queries per period independent of the number of "
                   f"tunings (batched): {shown}")
    return out


def as_json(sizes: list[SizeRun], timing: Timing, command: str, machine: Machine) -> dict:
    return {"command": command, "machine": asdict(machine), "timing": asdict(timing),
            "sizes": [asdict(size) for size in sizes]}
