"""The demo report's charts (matplotlib, no display needed).

Both share the demo clock on the x axis, the parts of the day named along
the top, the nightly window shaded and the operator's changes marked, so
that a jump in a latency line can be read against the knob change that
caused or cured it.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first
from matplotlib.axes import Axes  # noqa: E402

from vllm_autotuner.sim.demo.plan import STATIC, TUNED  # noqa: E402
from vllm_autotuner.sim.demo.report import Report, slo_at  # noqa: E402

COLORS = {TUNED: "tab:blue", STATIC: "tab:red"}
LABELS = {TUNED: "tuned", STATIC: "static (vLLM defaults)"}
STREAMS = (("chat", "tab:green"), ("rag", "tab:purple"), ("batch", "tab:brown"))


def _hours(report: Report, times: list[float]) -> list[float]:
    return [report.day.hours(t - report.step / 2) for t in times]


def _frame(report: Report, axes: list[Axes]) -> None:
    """Phase names, the nightly window and the operator's changes on every panel; clock ticks below."""
    day = report.day
    for ax in axes:
        lo, hi = day.hours(max(day.window[0], day.start)), day.hours(min(day.window[1], day.end))
        if hi > lo:
            ax.axvspan(lo, hi, color="0.9", zorder=0)
        for phase in day.phases():
            ax.axvline(day.hours(day.start + phase.start), color="0.7", lw=0.6, zorder=0)
        for decision in report.facts.decisions:
            if decision.action != "Hold":
                ax.axvline(day.hours(decision.time), color=COLORS[TUNED], ls=":", lw=1)
        ax.grid(alpha=0.3)
        ax.set_xlim(day.hours(day.start), day.hours(day.end))
    top = axes[0]
    for phase in day.phases():
        middle = day.hours(day.start + (phase.start + phase.end) / 2)
        top.text(middle, 1.02, phase.name, transform=top.get_xaxis_transform(), ha="center", fontsize=8)
    ticks = list(range(6, 31, 3))
    axes[-1].set_xticks(ticks, [f"{h % 24:02d}:00" for h in ticks])
    axes[-1].set_xlabel("demo clock (24 simulated hours; shaded: the nightly batch window)")


def knobs(report: Report, path: Path) -> None:
    """Offered and served traffic, and each Deployment's knobs, over the day."""
    fig, (traffic, tokens, seqs) = plt.subplots(3, 1, figsize=(11, 8), sharex=True,
                                                gridspec_kw={"height_ratios": [2, 1.3, 1]})
    times = report.steps[TUNED].times
    x = _hours(report, times)
    offered = [report.day.offered(t - report.step / 2) for t in times]
    base = [0.0] * len(times)
    for stream, color in STREAMS:
        top = [b + o[stream] for b, o in zip(base, offered, strict=True)]
        traffic.fill_between(x, base, top, step="mid", color=color, alpha=0.3, label=f"offered: {stream}")
        base = top
    for name, steps in report.steps.items():
        traffic.plot(x, steps.requests, color=COLORS[name], lw=1, label=f"completed: {LABELS[name]}")
    traffic.set_ylabel("requests/s per Deployment")
    traffic.legend(loc="upper right", fontsize=8, ncol=2)
    for ax, attr, label in ((tokens, "max_num_batched_tokens", "--max-num-batched-tokens"),
                            (seqs, "max_num_seqs", "--max-num-seqs")):
        for name, steps in report.steps.items():
            values = [getattr(k, attr) if k else math.nan for k in steps.knobs]
            ax.step(x, values, where="mid", color=COLORS[name], lw=2 if name == TUNED else 1.2,
                    ls="-" if name == TUNED else "--", label=LABELS[name])
        ax.set_yscale("log", base=2)
        ax.set_ylabel(label, fontsize=8)
        ax.legend(loc="upper left", fontsize=8)
    _frame(report, [traffic, tokens, seqs])
    fig.suptitle("Knobs that served the traffic (dotted: the operator's changes)", y=0.995)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency(report: Report, path: Path) -> None:
    """TTFT and ITL p95 against the SLO in force, and SLO goodput, for both Deployments."""
    fig, (ttft, itl, goodput) = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
    times = report.steps[TUNED].times
    x = _hours(report, times)
    spec = report.day.spec()
    slos = [slo_at(spec, t - report.step / 2) for t in times]
    ttft.step(x, [s.ttft.seconds for s in slos], where="mid", color="k", lw=1, label="SLO")
    itl.step(x, [s.itl.seconds * 1000 for s in slos], where="mid", color="k", lw=1, label="SLO")
    for name, steps in report.steps.items():
        style = {"color": COLORS[name], "lw": 1.5 if name == TUNED else 1.2, "label": LABELS[name]}
        ttft.plot(x, steps.ttft_p95, **style)
        itl.plot(x, [v * 1000 for v in steps.itl_p95], **style)
        goodput.plot(x, steps.goodput, **style)
    ttft.set_yscale("log")
    ttft.set_ylabel("TTFT p95 (s)")
    itl.set_yscale("log")
    itl.set_ylabel("ITL p95 (ms)")
    goodput.set_ylabel("SLO goodput (tokens/s)")
    for ax in (ttft, itl, goodput):
        ax.legend(loc="upper left", fontsize=8)
    _frame(report, [ttft, itl, goodput])
    fig.suptitle(f"Latency against the SLO, and SLO goodput (tuned / static over the day: {report.ratio:.2f}x)",
                 y=0.995)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
