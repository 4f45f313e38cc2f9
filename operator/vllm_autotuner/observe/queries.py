"""PromQL for the vLLM metric families the decision core reads.

Two ways to ask, one vocabulary:

* **batched** (what the operator runs): one query per family for *all*
  tunings that share a Prometheus, label set and window, grouped by
  namespace and pod (and ``le`` for histograms; ``finished_reason`` for the
  requests, whose completed ones are the sample count). Each tuning then keeps the
  rows of its own current pods. The query count is independent of the number
  of tunings; quantiles are computed from the summed bucket rates with
  Prometheus's own algorithm (``observe.quantile``).
* **per target** (the naive baseline the scale benchmark compares against):
  the same query per family per tuning, filtered to that tuning's pods.

Every family names its older vLLM spelling as a fallback (``or``), so a
Prometheus scraping vLLM releases before the V1 renames still answers. Two
families fall back the same way, per pod, inside their one query, so that
neither costs one more query per period:

* the server start, where prometheus-client exports no ``_created`` gauges,
  to the newest reset of a counter (a container kubelet restarted in place:
  same pod, same series, counting from zero) or else to the first sample of
  a series that began late (a new pod);
* the newest sample, where a scrape failed: Prometheus marks a target's
  series stale at its first failed scrape, so the instant query forgets a
  pod at once, though the staleness limit of the decision core is there to
  judge exactly such a pod. While the pod's scrape target is still there and
  failing (``up == 0``), its newest sample in the window answers; a pod
  deleted in a scale-down or a rollout has no target left, so it stays out.

Each of a pod's series counts once. A pod scraped by two jobs (a chart's
kubernetes-pods and kubernetes-service-endpoints, overlapping PodMonitors,
an HA pair of Prometheus servers behind a querier that does not deduplicate
them) has every series twice, differing only in the scrape's labels (job,
instance, endpoint, replica), and a sum by pod would double every rate and
gauge (a KV-cache usage of 0.7 would read 1.4) while the quantiles stay as
they are, so nothing would look amiss. The families that sum count such
copies once first, grouped by the pod and vLLM's own labels, which alone
tell a pod's series apart (``SERVER_LABELS``): a counter's rate and a
histogram's bucket rates take the largest copy, since a copy that missed
scrapes at an end of the window (its job, or one of the HA pair, down for
part of it) has only part of the increase (``rate``'s extrapolation to the
window's ends may add a little to a whole copy's, under a scrape interval's
worth: the largest reads that much high, where the mean of a gap read a
third low), and the largest of cumulative buckets is cumulative still; a gauge's mean over the window
takes the copies' mean, which such a gap leaves unbiased. Those that take a
maximum or a minimum (timestamps, starts) are the same over copies.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from vllm_autotuner.api.types import LABEL_NAME_PATTERN


class Kind(StrEnum):
    RATE = "rate"  # counter: per-second rate over the window
    AVERAGE = "average"  # gauge: mean over the window
    BUCKETS = "buckets"  # histogram: per-second rate of each bucket
    LAST_SEEN = "last_seen"  # gauge: timestamp of the newest sample (freshness)
    FAILING = "failing"  # gauge: timestamp of the newest sample in the window, of a pod whose scrape target fails
    STARTED = "started"  # prometheus-client `_created` gauge: newest value at the window end (server start)
    RESET = "reset"  # counter: time of its newest reset (a restart in place) within the reach (``reach``)
    FIRST_SEEN = "first_seen"  # gauge: timestamp of the first sample, if the series began within the reach


#: The ``finished_reason`` the requests family gives the requests vLLM's API server refused at admission
#: (``vllm:admission_rejections_total``, by a queue limit: ``--max-num-queued-reqs``, ``--max-num-queued-tokens``).
#: They never reach the engine, so no latency histogram has them, but they were load, and missed every target.
REFUSED = "refused"
#: ``finished_reason`` values that are not a completed request: "abort" (one the engine aborted: vLLM V1 counts no
#: request whose client went away, its output processor drops it unrecorded) and "error" (a request-level internal
#: error, answered 500), either of which may have no first token and has a cut e2e, and ``REFUSED``.
NOT_COMPLETED = frozenset({"abort", "error", REFUSED})


def completed_requests(by_reason: Mapping[str, float]) -> float:
    """Of requests counted by ``finished_reason``, those that completed (``stop``, ``length``, ``repetition``):
    the sample count the decision core asks a minimum of. A reason not named (a label dropped by relabelling)
    counts, as every request did before the reasons were told apart."""
    return math.fsum(n for reason, n in by_reason.items() if reason not in NOT_COMPLETED)


def refused_requests(by_reason: Mapping[str, float]) -> float:
    """Of requests counted by ``finished_reason``, those refused at admission (none from a vLLM without queue
    limits, which has no such counter)."""
    return by_reason.get(REFUSED, 0.0)


@dataclass(frozen=True)
class Part:
    """A further answer from one RATE family's query: its rows grouped by ``label`` too, the family's key gets
    their sum over every value of ``label`` and ``key`` what ``of`` makes of a pod's rates by value. A part with
    a ``counter`` of its own (events the family's metrics do not count) has that counter's rate answered in the
    same query, as the rows whose ``label`` is ``key``."""

    key: str
    label: str
    of: Callable[[Mapping[str, float]], float]
    counter: str | None = None


@dataclass(frozen=True)
class Family:
    """One thing to fetch: a key the aggregation uses, how to aggregate, metric names newest first (the newest's
    series those with the labels ``match``, which the older spellings lack), then other ways to the same answer
    for the pods those leave without one, and parts of it with keys of their own (all grouped by one label)."""

    key: str
    kind: Kind
    metrics: tuple[str, ...]
    fallback: tuple[tuple[Kind, str], ...] = ()
    parts: tuple[Part, ...] = ()
    match: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if len({part.label for part in self.parts}) > 1:
            raise ValueError(f"family {self.key}: its parts need one label to group by")

    @property
    def part_label(self) -> str | None:
        """The label the family's rows are grouped by too, for its parts."""
        return self.parts[0].label if self.parts else None


FAMILIES: tuple[Family, ...] = (
    # every request that ended (the load): finished, by finished_reason, or refused at admission; in the same query
    # the completed ones (the sample count) and the refused ones
    Family("requests", Kind.RATE, ("vllm:request_success_total",),
           parts=(Part("completed", "finished_reason", completed_requests),
                  Part(REFUSED, "finished_reason", refused_requests, "vllm:admission_rejections_total"))),
    Family("prompt_tokens", Kind.RATE, ("vllm:prompt_tokens_total",)),
    # of those, the ones not computed: served from the prefix cache or sent by another instance, counted with them
    # (none from a vLLM before that counter: its prefix cache hits are counted at each lookup, a preempted
    # request's and its generated tokens' again, which no prompt token count has)
    Family("cached_prompt_tokens", Kind.RATE, ("vllm:prompt_tokens_cached_total",)),
    Family("generation_tokens", Kind.RATE, ("vllm:generation_tokens_total",)),
    Family("preemptions", Kind.RATE, ("vllm:num_preemptions_total",)),
    Family("prompt_len_sum", Kind.RATE, ("vllm:request_prompt_tokens_sum",)),
    Family("prompt_len_count", Kind.RATE, ("vllm:request_prompt_tokens_count",)),
    Family("output_len_sum", Kind.RATE, ("vllm:request_generation_tokens_sum",)),
    Family("output_len_count", Kind.RATE, ("vllm:request_generation_tokens_count",)),
    Family("step_tokens_sum", Kind.RATE, ("vllm:iteration_tokens_total_sum",)),
    Family("steps", Kind.RATE, ("vllm:iteration_tokens_total_count",)),
    Family("itl_sum", Kind.RATE, ("vllm:inter_token_latency_seconds_sum", "vllm:time_per_output_token_seconds_sum")),
    Family("itl_count", Kind.RATE, ("vllm:inter_token_latency_seconds_count", "vllm:time_per_output_token_seconds_count")),
    Family("running", Kind.AVERAGE, ("vllm:num_requests_running",)),
    # requests waiting for room in the batch, which the knobs govern; not those vLLM defers for a LoRA slot or a KV
    # transfer, which more room would not start (told apart since vllm-project/vllm#38435; before, all waiting)
    Family("waiting", Kind.AVERAGE, ("vllm:num_requests_waiting_by_reason", "vllm:num_requests_waiting"),
           match=(("reason", "capacity"),)),
    Family("kv_usage", Kind.AVERAGE, ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
    # the share of the window a pod's engine was awake (1 but in vLLM's sleep mode); none from a vLLM without the gauge
    Family("awake", Kind.AVERAGE, ("vllm:engine_sleep_state",), match=(("sleep_state", "awake"),)),
    Family("ttft", Kind.BUCKETS, ("vllm:time_to_first_token_seconds_bucket",)),
    Family("itl", Kind.BUCKETS, ("vllm:inter_token_latency_seconds_bucket", "vllm:time_per_output_token_seconds_bucket")),
    Family("e2e", Kind.BUCKETS, ("vllm:e2e_request_latency_seconds_bucket",)),
    Family("queue", Kind.BUCKETS, ("vllm:request_queue_time_seconds_bucket",)),
    Family("step_tokens", Kind.BUCKETS, ("vllm:iteration_tokens_total_bucket",)),
    Family("last_seen", Kind.LAST_SEEN, ("vllm:num_requests_running",),
           fallback=((Kind.FAILING, "vllm:num_requests_running"),)),
    # prometheus-client's multiprocess mode (vLLM's with --api-server-count > 1) and PROMETHEUS_DISABLE_CREATED_SERIES
    # export no `_created` gauges: without them a pod's restart shows as its counters resetting or, for a new pod,
    # as its series beginning late. A reset follows the series' first sample, so the first answer is the newest.
    Family("started", Kind.STARTED, ("vllm:prompt_tokens_created",),
           fallback=((Kind.RESET, "vllm:prompt_tokens_total"), (Kind.FIRST_SEEN, "vllm:num_requests_running"))),
)
FAMILY = {f.key: f for f in FAMILIES}

_LABEL_NAME = re.compile(LABEL_NAME_PATTERN)

#: The labels vLLM tells the series of one metric apart by (vllm-metrics.txt): the engine, the served model, and a
#: count's reason (admission rejections by queue limit), besides ``le`` and the labels a family groups by or matches.
#: Two series of one pod that agree in all of these are copies, the same series scraped twice.
SERVER_LABELS = ("engine", "model_name", "reason")


@dataclass(frozen=True)
class Selector:
    """Which series: exact label matchers, plus the label names that carry namespace and pod."""

    matchers: tuple[tuple[str, str], ...] = ()
    namespace_label: str = "namespace"
    pod_label: str = "pod"

    def __post_init__(self) -> None:
        for name in (self.namespace_label, self.pod_label, *(k for k, _ in self.matchers)):
            if not _LABEL_NAME.match(name):
                raise ValueError(f"invalid Prometheus label name {name!r}")


def quote(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _braces(matchers: list[str]) -> str:
    return "{" + ",".join(matchers) + "}" if matchers else ""


def _window(seconds: float) -> str:
    return f"{int(round(seconds))}s"


def _step(window: float) -> int:
    """The step of the subqueries: a thirtieth of the window, at least a second."""
    return max(1, round(window / 30))


def reach(window: float, settle: float = 0.0) -> int:
    """Seconds back from a window's end over which a server start is looked for where no ``_created`` gauge says
    it: the window and, before it, the settle time (a start less than that before the window holds the window),
    and at least the window before it."""
    return round(window + max(window, settle))


def _summed(expr: str, by: str, copies: str) -> str:
    """The sum by ``by`` of ``expr``, a function of each series, counting the copies of a series (a pod scraped by
    several jobs) once, by the aggregation ``copies``: ``max`` of rates (a copy with a gap has less of the
    increase), ``avg`` of gauges' means (see the module's docstring)."""
    return f"sum by ({by}) ({copies} by ({by}, {', '.join(SERVER_LABELS)}) ({expr}))"


def _expr(kind: Kind, metric: str, labels: str, targets: str, window: float, back: int, by: str) -> str:
    """One term of a family's query; ``labels`` select the metric's series, ``targets`` (the namespace and pod
    matchers among them) the pods' scrape targets' ``up`` series."""
    sel = f"{metric}{labels}"
    w = _window(window)
    step = _step(window)
    match kind:
        case Kind.RATE | Kind.BUCKETS:
            return _summed(f"rate({sel}[{w}])", by, "max")
        case Kind.AVERAGE:
            return _summed(f"avg_over_time({sel}[{w}])", by, "avg")
        case Kind.LAST_SEEN:
            return f"max by ({by}) (timestamp({sel}))"
        case Kind.FAILING:
            # A stale-marked series answers no instant query, but a subquery's steps before the marker still see
            # its real samples: the newest as of the last step before the marker, at most a step older than the
            # newest (an age a step too high errs toward holding). Only pods whose target is there and failing:
            # one deleted has no `up` left.
            return (f"max by ({by}) (max_over_time(timestamp({sel})[{w}:{step}s]))"
                    f" and on ({by}) (up{targets} == 0)")
        case Kind.STARTED:
            # an instant value, not over the window: a pod restarted in the window counts from its newest start
            return f"max by ({by}) ({sel})"
        case Kind.RESET:
            # Over the reach, as FIRST_SEEN: the newest step whose sample is below the series' sample of a step
            # before, with that sample's time (the first after the restart, or one a step later). The sample
            # before is the newest real one over the reach, not `offset` alone: vLLM serves no /metrics while it
            # starts again, and the stale markers of those failed scrapes end the series for an instant selector.
            return (f"max by ({by}) (max_over_time((timestamp({sel})"
                    f" and {sel} < last_over_time({sel}[{back}s] offset {step}s))[{back}s:{step}s]))")
        case Kind.FIRST_SEEN:
            # Over the reach, in steps of a thirtieth of the window. At the first step a series that was already
            # there answers a sample from at or before that step, so only one that began later passes the filter,
            # with its first sample's time; an older pod answers nothing (an unknown start, as without `_created`).
            return (f"min by ({by}) (min_over_time(timestamp({sel})[{back}s:{step}s]))"
                    f" > time() - {back - step}")
    raise AssertionError(kind)


Matcher = tuple[str, str, str]  # (label, operator, value)


@dataclass(frozen=True)
class PodMatch:
    """Which pods are one tuning's: those whose names begin with one of ``prefixes`` (a ReplicaSet's name and '-',
    which its pods' generated names begin with) and those in ``names``, the exact names of the pods of a
    ReplicaSet whose name is too long for that: the apiserver cuts a generateName, and the cut prefix would also
    hold the Deployment's other revisions and other Deployments whose names begin the same."""

    prefixes: tuple[str, ...] = ()
    names: tuple[str, ...] = ()

    def matches(self, pod: str) -> bool:
        return pod in self.names or pod.startswith(self.prefixes)

    def __str__(self) -> str:
        """What was looked for, for the messages: ``name, prefix*``."""
        return ", ".join((*self.names, *(f"{prefix}*" for prefix in self.prefixes))) or "(none listed)"

    @property
    def regex(self) -> str:
        """The same pods as a Prometheus regex (anchored at both ends by Prometheus); in DNS names only '.' is
        special."""
        def escaped(name: str) -> str:
            return name.replace(".", "\\.")

        alternatives = [*map(escaped, self.names), *(f"{escaped(prefix)}.*" for prefix in self.prefixes)]
        return "(" + "|".join(alternatives) + ")"


def pod_matchers(selector: Selector, namespace: str, pods: PodMatch) -> tuple[Matcher, ...]:
    """Matchers for one tuning's ``pods``, in its namespace."""
    return ((selector.namespace_label, "=", namespace), (selector.pod_label, "=~", pods.regex))


def family_query(family: Family, selector: Selector, window_seconds: float, extra: tuple[Matcher, ...] = (),
                 reach_seconds: int | None = None) -> str:
    """One family, grouped by namespace and pod (and ``le`` for histograms, a part's label for a family with one);
    a server start is looked for ``reach_seconds`` back from the window's end (default: two windows, ``reach``).

    Without ``extra`` matchers this is the batched query that serves every
    tuning at once; with a tuning's namespace and pod matchers it is the
    naive per-tuning query the scale benchmark compares against.
    """
    pods = f"{selector.namespace_label}, {selector.pod_label}"
    by = pods
    if family.kind is Kind.BUCKETS:
        by += ", le"
    if family.part_label is not None:
        by += f", {family.part_label}"
    every = [(k, "=", v) for k, v in selector.matchers] + list(extra)
    matchers = [f"{k}{op}{quote(v)}" for k, op, v in every]
    labels = _braces(matchers)
    newest = _braces(matchers + [f"{k}={quote(v)}" for k, v in family.match])  # the first metric's
    # namespace and pod come from the target's relabelling, so `up` has them too; other matchers may name labels
    # of the vLLM series alone (model_name, engine) or that metric relabelling adds, and would match no `up`
    targets = _braces([f"{k}{op}{quote(v)}" for k, op, v in every
                       if k in (selector.namespace_label, selector.pod_label)])
    terms = [(family.kind, m) for m in family.metrics] + list(family.fallback)
    back = reach(window_seconds) if reach_seconds is None else reach_seconds
    exprs = [_expr(kind, m, newest if i == 0 else labels, targets, window_seconds, back, by)
             for i, (kind, m) in enumerate(terms)]
    for part in family.parts:
        if part.counter is not None:
            # the counter has no such label: given one, its rows join the family's (their label sets differ)
            rate = _summed(f"rate({part.counter}{labels}[{_window(window_seconds)}])", pods, "max")
            exprs.append(f"label_replace({rate}, {quote(part.label)}, {quote(part.key)}, \"\", \"\")")
    return " or ".join(f"({expr})" for expr in exprs)
