"""A fast, deterministic simulation of one vLLM V1 engine.

What it reproduces (vLLM V1 ``Scheduler.schedule``):

* Each step has a budget of ``max_num_batched_tokens`` tokens. Running
  requests are served first, in admission order: a decode takes one token, a
  partially prefilled prompt takes a chunk of what budget is left. Then
  waiting requests are admitted first-come-first-served while fewer than
  ``max_num_seqs`` run and budget remains; the last admitted may get only a
  chunk (chunked prefill). With chunked prefill off a prompt is admitted only
  whole, and admission stops at the first prompt that does not fit.
* The KV cache is paged in blocks of ``block_size`` tokens; the block count
  comes from the start-up memory model (:mod:`.startup`). When a running
  request needs a block and none is free, the newest running request is
  preempted: its blocks are freed, it goes back to the front of the waiting
  queue and is recomputed (prompt plus what it had generated) when
  readmitted. A step that preempted admits nothing new.
* LoRA (``max_loras``): requests that name an adapter run in a batch of at
  most ``max_loras`` adapters. A waiting request whose adapter would be one
  too many is skipped, and those behind it are considered (V1 defers it:
  ``vllm:num_requests_waiting_by_reason{reason="deferred"}``), so while
  one adapter's requests keep coming another's may wait for ever, as in vLLM.
* Prefix caching (optional): requests that name a ``prefix_id`` share the full
  blocks of that prefix once one request has computed it; unreferenced
  prefixes stay cached until their blocks are needed (LRU eviction).
* Step time is a roofline: weights read once per step (or the GEMM FLOPs of
  all batched tokens, whichever is slower), attention FLOPs and KV bytes in
  proportion to context, the LM head only for sampled tokens, all-reduces for
  tensor parallelism, a fixed per-step and a per-request overhead, all with
  the profile's efficiency factors.
* Clients that go away: :meth:`Engine.abort` removes a request between two
  steps, wherever it is (waiting, prefilling, decoding, preempted), and frees
  its blocks, as vLLM aborts a request whose client closed the connection; a
  request still without a first token when its ``first_token_timeout`` has
  passed is aborted so at the next step boundary. As in V1, an aborted
  request leaves nothing in the metrics.
* Metrics are what vLLM exports (:mod:`.metricstate`), observed at the same
  moments: TTFT at the first token, ITL per token per request, request
  histograms when a request finishes, tokens per step per step.

Why it is fast (one loaded H100 replica runs thousands of times faster than
real time on one core):

* No per-request work per step. With chunked prefill at most one running
  request is mid-prefill (it is always the newest: a later admission only
  happens once it got all its remaining tokens), and ``max_num_batched_tokens
  >= max_num_seqs`` guarantees every decode fits the budget, so all decoding
  requests advance in lock-step, one token per step. Each decoding request is
  therefore described by constants (context = ``base + step``, finish step),
  and the batch by a handful of aggregates: how many decode, the sum of their
  ``base`` (so the context sum of a step is ``sum_base + n * step``), how
  many need a new KV block at each step residue modulo ``block_size``, and a
  heap of finish steps. A step costs O(1) Python work plus O(1) per request
  that starts or finishes.
* Decode-only spans are fast-forwarded. Between events (a completion, an
  admissible arrival, running out of KV blocks, the end of the ``advance``
  window) every step decodes the same requests; step times then grow
  linearly with the context, so the span's duration, its ITL histogram
  counts, tokens and block allocations are closed-form sums.
* Histograms keep per-bucket counts; a linear run of step times is binned in
  O(buckets) (:meth:`.Histogram.observe_linear`).

Numpy draws the seeded random factors and bins buffered histogram
observations in bulk; the per-step work is scalar Python, which beats numpy's
per-call overhead on a handful of numbers.

Determinism: given the same profile, config, seed and submitted requests, the
results are identical. The seed draws the replica's speed factor (GPUs of one
type differ by a few percent) and step-to-step time noise.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vllm_autotuner.sim.metricstate import Gauges, MetricsSnapshot, MetricState, snapshot
from vllm_autotuner.sim.profiles import Profile
from vllm_autotuner.sim.startup import EngineConfig, MemoryPlan, ResolvedConfig, StartupError, check_startup

__all__ = ["Engine", "EngineConfig", "FinishedRequest", "Request", "StepCost"]


@dataclass(frozen=True, slots=True)
class Request:
    """One request as a client sends it.

    ``output_tokens`` is how many tokens it will generate (``max_tokens`` with
    ``ignore_eos``, or the length the model happens to stop at). A request may
    name a shared prompt prefix (a system prompt, a RAG template) of
    ``prefix_tokens`` tokens, which must be shorter than the prompt.

    ``first_token_timeout`` is how long its client waits for a first token:
    a request still without one at ``arrival + first_token_timeout`` is
    aborted, as vLLM aborts a request whose client closed the connection
    (:attr:`Engine.timed_out`).
    """

    arrival: float
    prompt_tokens: int
    output_tokens: int
    prefix_id: int | None = None
    prefix_tokens: int = 0
    first_token_timeout: float = math.inf
    lora: str | None = None
    """The LoRA adapter it names (its ``model``); None: the base model."""


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """A request the engine completed; times are simulated seconds."""

    rid: int
    """The id :meth:`Engine.submit` returned."""
    arrival: float
    queue_time: float
    """From arrival until first scheduled (vLLM's WAITING phase)."""
    first_token_time: float
    finish_time: float
    prompt_tokens: int
    output_tokens: int
    preemptions: int
    mean_itl: float
    """``(finish - first token) / (output_tokens - 1)``; 0 for one token."""
    max_itl: float
    """The longest gap between two of its tokens."""
    slow_gaps: tuple[int, ...] = ()
    """How many of its inter-token gaps were longer than each of the engine's ``slow_gap_seconds``, in order:
    enough to judge it against an ITL target at any quantile (its own q-quantile gap is within ``t`` when at
    most ``(1 - q)`` of its gaps are longer)."""

    @property
    def ttft(self) -> float:
        return self.first_token_time - self.arrival

    @property
    def e2e(self) -> float:
        return self.finish_time - self.arrival


class StepCost:
    """The roofline step-time model of one profile.

    ``seconds`` prices one step; the engine inlines the same coefficients.
    """

    def __init__(self, profile: Profile, speed: float = 1.0) -> None:
        eff = profile.efficiency
        gpu, model, tp = profile.gpu, profile.model, profile.tp
        slow = speed * eff.tp_slowdown
        gemm_rate = gpu.peak_bf16_flops * eff.gemm
        self.per_token = 2 * model.body_params / tp / gemm_rate * slow
        """GEMM time of one batched token."""
        self.per_sample = 2 * model.lm_head_params / tp / gemm_rate * slow
        """LM-head time of one sampled token."""
        self.weights = model.weight_bytes / tp / (gpu.hbm_bandwidth * eff.memory) * slow
        """Reading all weights once."""
        self.per_attention_unit = (
            4 * model.layers * model.heads / tp * model.head_dim / (gpu.peak_bf16_flops * eff.attention) * slow
        )
        """Attention FLOP time of one (query token, context token) pair."""
        self.per_kv_token = model.kv_bytes_per_token / tp / (gpu.hbm_bandwidth * eff.memory) * slow
        """Reading one context token's K and V."""
        if tp > 1:
            self.comm_fixed = 2 * model.layers * gpu.allreduce_latency_s * speed
            self.comm_per_token = (
                2 * model.layers * 2 * (tp - 1) / tp * model.hidden * model.dtype_bytes / gpu.link_bandwidth * speed
            )
        else:
            self.comm_fixed = self.comm_per_token = 0.0
        self.overhead = eff.step_overhead_s * speed
        self.per_seq = eff.per_seq_overhead_s * speed
        self.per_decode_context = max(self.per_attention_unit, self.per_kv_token)
        """A decode reads each context token's KV once and does one attention
        unit with it: the slower of the two rates applies."""
        self.flops_per_token = 2 * model.body_params / tp
        self.flops_per_sample = 2 * model.lm_head_params / tp
        self.flops_per_attention_unit = 4 * model.layers * model.heads / tp * model.head_dim
        self.weight_bytes = model.weight_bytes / tp
        self.kv_bytes_per_token = model.kv_bytes_per_token / tp

    def seconds(self, tokens: int, requests: int, sampled: int, attention_units: float, kv_read: float) -> float:
        """One step: ``tokens`` batched, ``requests`` scheduled, ``sampled``
        of them producing a token, ``attention_units`` = sum over requests of
        new tokens x context, ``kv_read`` = context tokens read."""
        linear = max(self.per_token * tokens + self.per_sample * sampled, self.weights)
        attention = max(self.per_attention_unit * attention_units, self.per_kv_token * kv_read)
        return (
            linear
            + attention
            + self.comm_fixed
            + self.comm_per_token * tokens
            + self.overhead
            + self.per_seq * requests
        )

    def decode_seconds(self, n: int, context_sum: float) -> float:
        """A decode-only step of ``n`` requests holding ``context_sum`` tokens."""
        return self.decode_fixed(n) + self.per_decode_context * context_sum

    def decode_fixed(self, n: int) -> float:
        """The part of a decode-only step that does not grow with context."""
        return (
            max((self.per_token + self.per_sample) * n, self.weights)
            + self.comm_fixed
            + self.comm_per_token * n
            + self.overhead
            + self.per_seq * n
        )


class _Seq:
    """Runtime state of one submitted request."""

    __slots__ = (
        "rid",
        "req",
        "arrival",
        "prompt",
        "output",
        "prefix",
        "pblocks",
        "target",
        "computed",
        "generated",
        "blocks",
        "shared",
        "base",
        "fin",
        "scheduled_at",
        "first_token_at",
        "last_token_at",
        "preemptions",
        "max_gap",
        "seg0",
        "cached",
        "slow",
        "slow0",
        "aborted",
    )

    def __init__(self, rid: int, req: Request, block_size: int, thresholds: int) -> None:
        self.rid = rid
        self.req = req
        self.arrival = req.arrival
        self.prompt = req.prompt_tokens
        self.output = req.output_tokens
        self.prefix = req.prefix_id
        self.pblocks = req.prefix_tokens // block_size if req.prefix_id is not None else 0
        self.target = req.prompt_tokens  # tokens to prefill: prompt + tokens generated before a preemption
        self.computed = 0
        self.generated = 0
        self.blocks = 0  # KV blocks held while prefilling (shared prefix blocks included)
        self.shared = 0  # of those, blocks of a cached prefix
        self.base = 0  # while decoding: context after global step g is base + g
        self.fin = -1  # while decoding: the global step that produces its last token
        self.scheduled_at = -1.0
        self.first_token_at = -1.0
        self.last_token_at = -1.0
        self.preemptions = 0
        self.max_gap = 0.0  # longest inter-token gap seen outside the current decode run
        self.seg0 = 0  # first segment of the current decode run
        self.cached = -1  # prompt tokens served from the prefix cache at first admission
        self.slow = [0] * thresholds  # gaps over each slow-gap threshold, outside the current decode run
        self.slow0 = self.slow  # the engine's slow-step counts when the current decode run began
        self.aborted = False


_JITTER_BATCH = 4096
_MAX_BUFFERED = 500_000  # histogram observations kept unbinned between snapshots


class Engine:
    """One simulated vLLM replica.

    ``Engine(profile, config, seed)`` raises :class:`StartupError` with vLLM's
    message when the config cannot start on the profile. Then:
    :meth:`submit` requests, :meth:`advance` the clock, read
    :meth:`snapshot` for metrics. ``slow_gap_seconds`` are latencies for
    which every finished request counts its inter-token gaps above each
    (``FinishedRequest.slow_gaps``): what judging each request against an
    ITL target takes, without keeping every gap.
    """

    def __init__(
        self, profile: Profile, config: EngineConfig, seed: int = 0, slow_gap_seconds: Sequence[float] = ()
    ) -> None:
        outcome = check_startup(profile, config)
        if outcome.error is not None:
            raise StartupError(outcome.error)
        assert outcome.memory is not None
        self.profile = profile
        self.config: ResolvedConfig = outcome.config
        self.memory: MemoryPlan = outcome.memory
        self.num_gpu_blocks = outcome.memory.num_gpu_blocks
        self.metrics = MetricState(self.config.max_model_len)

        self._rng = np.random.default_rng(seed)
        speed = float(self._rng.lognormal(0.0, profile.speed_variation))
        self.cost = StepCost(profile, speed)
        self._jitter_sigma = profile.step_jitter
        self._jitter: list[float] = []
        self._jitter_at = 0
        self._carried: float | None = None
        """The noise factor of a decode span that ``advance``'s end cut short: the next call goes on with it, so that
        the noise, like the steps, does not depend on how a run is cut into calls."""

        self._bs = self.config.block_size
        self._budget = self.config.max_num_batched_tokens
        self._max_seqs = self.config.max_num_seqs
        self._chunked = self.config.enable_chunked_prefill
        self._prefix_caching = self.config.enable_prefix_caching
        self._max_loras = self.config.max_loras
        self._adapters: dict[str, int] = {}  # running requests by LoRA adapter

        self._now = 0.0
        self._g = 0  # global step counter
        self._seg = 0  # segments (single steps or fast-forwarded spans) run so far
        self._next_rid = 0
        self._pending: deque[_Seq] = deque()  # submitted, arrival in the future
        self._waiting: deque[_Seq] = deque()
        self._running: dict[int, _Seq] = {}  # admission order
        self._partial: _Seq | None = None  # the running request still prefilling
        self._n_dec = 0
        self._sum_base = 0
        self._phase_counts = [0] * self._bs  # decodes needing a new block at step g, by g % block_size
        self._fin_heap: list[tuple[int, int]] = []
        self._used = 0  # KV blocks held (referenced prefix blocks included)
        self._prefixes: dict[int, list[int]] = {}  # prefix id -> [blocks, references]
        self._evictable: OrderedDict[int, int] = OrderedDict()  # unreferenced cached prefixes, LRU first
        self._evictable_blocks = 0
        # Monotonic stack of (segment, longest step in it) for max-ITL queries.
        self._stack_seg: list[int] = []
        self._stack_max: list[float] = []
        # Decode steps (gaps of every decoding request) longer than each slow-gap threshold, so far.
        self._slow_at = tuple(slow_gap_seconds)
        self._slow_steps = [0] * len(self._slow_at)
        self._finished: list[FinishedRequest] = []
        self.timed_out: list[int] = []
        """Ids of the requests the latest :meth:`advance` aborted at their first-token timeout."""
        self._deadlines: list[tuple[float, int, _Seq]] = []  # (first-token deadline, id): a heap
        # Work done so far, for vLLM's estimated FLOPs / bytes counters.
        self._attention_units = 0.0
        self._kv_read = 0.0
        self._first_prompts = 0
        self._scheduled_tokens = 0
        self._steps = 0

    # ------------------------------------------------------------------ API

    @property
    def now(self) -> float:
        """Simulated seconds since the engine became ready."""
        return self._now

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting) + sum(1 for s in self._pending if s.arrival <= self._now)

    @property
    def kv_usage(self) -> float:
        return self._used / self.num_gpu_blocks

    def submit(self, request: Request) -> int:
        """Queue ``request`` (arrival times must not decrease); returns its id.

        Raises ValueError for what vLLM's API server rejects with HTTP 400: a
        prompt plus output longer than ``max_model_len``.
        """
        if request.prompt_tokens < 1 or request.output_tokens < 1:
            raise ValueError("prompt_tokens and output_tokens must be at least 1")
        if request.prompt_tokens + request.output_tokens > self.config.max_model_len:
            raise ValueError(
                f"This model's maximum context length is {self.config.max_model_len} tokens. However, you "
                f"requested {request.prompt_tokens + request.output_tokens} tokens "
                f"({request.prompt_tokens} in the messages, {request.output_tokens} in the completion)."
            )
        if request.prefix_id is not None and not 0 <= request.prefix_tokens < request.prompt_tokens:
            raise ValueError("prefix_tokens must be shorter than the prompt")
        if not request.first_token_timeout > 0:
            raise ValueError("first_token_timeout must be positive")
        if self._pending and request.arrival < self._pending[-1].arrival:
            raise ValueError("requests must be submitted in arrival order")
        rid = self._next_rid
        self._next_rid += 1
        seq = _Seq(rid, request, self._bs, len(self._slow_at))
        self._pending.append(seq)
        if request.first_token_timeout < math.inf:
            heapq.heappush(self._deadlines, (request.arrival + request.first_token_timeout, rid, seq))
        return rid

    def advance(self, until: float) -> list[FinishedRequest]:
        """Run the engine until simulated time ``until``; return the requests
        that finished meanwhile.

        Steps are atomic: the last one may end a little after ``until``
        (``now`` then says where the clock stands); a later call continues
        from there. An idle engine's clock jumps to the next arrival. The
        requests it aborted at their first-token timeout are in
        :attr:`timed_out`.
        """
        finished = self._finished = []
        self.timed_out = []
        pending, waiting, deadlines = self._pending, self._waiting, self._deadlines
        while True:
            now = self._now
            if self._carried is not None and self._event_bound() <= now:
                self._carried = None  # the span cut at the last call's end would have ended at this event
            while pending and pending[0].arrival <= now:
                waiting.append(pending.popleft())
            if deadlines and deadlines[0][0] <= now:
                self._expire(now)
            if not self._running and not waiting:
                if pending and pending[0].arrival < until:
                    self._now = pending[0].arrival
                    continue
                self._now = max(now, until)
                break
            if now >= until:
                break
            span = self._partial is None and self._running and not self._head_admissible()
            jitter = self._carried if span and self._carried is not None else self._draw_jitter()
            self._carried = None
            if span:
                steps, self._carried = self._span_length(until, jitter)
                if steps > 1:
                    self._span(steps, jitter)
                    continue
            self._step(jitter)
        if self.metrics.buffered() > _MAX_BUFFERED:
            self.metrics.flush()
        return finished

    def snapshot(self) -> MetricsSnapshot:
        """All metrics now; cheap enough to take at every scrape."""
        while self._pending and self._pending[0].arrival <= self._now:
            self._waiting.append(self._pending.popleft())
        waiting, loras = self._waiting, bool(self._max_loras)
        gauges = Gauges(
            len(self._running),
            len(waiting),
            self._used / self.num_gpu_blocks,
            num_requests_deferred=sum(1 for s in waiting if self._lora_deferred(s)) if loras else 0,
            running_lora_adapters=tuple(self._adapters),
            waiting_lora_adapters=tuple(dict.fromkeys(s.req.lora for s in waiting if s.req.lora)) if loras else (),
        )
        snap = snapshot(self.metrics, self._now, gauges)
        # vLLM's MFU counters, from the work done (kept as totals, not per step); 0 unless --enable-mfu-metrics
        cost, counters = self.cost, snap.counters
        on = self.config.enable_mfu_metrics
        counters["estimated_flops_per_gpu"] = on * (
            cost.flops_per_token * self._scheduled_tokens
            + cost.flops_per_sample * counters["generation_tokens"]
            + cost.flops_per_attention_unit * self._attention_units
        )
        counters["estimated_read_bytes_per_gpu"] = on * (
            cost.weight_bytes * self._steps + cost.kv_bytes_per_token * self._kv_read
        )
        counters["estimated_write_bytes_per_gpu"] = on * cost.kv_bytes_per_token * self._scheduled_tokens
        return snap

    def tokens_generated(self, rid: int) -> int | None:
        """Output tokens request ``rid`` has produced so far while it runs
        (what a streaming server has sent by now), or ``None`` when it is not
        running: not arrived, waiting (also after a preemption, which keeps the
        tokens already sent) or finished."""
        seq = self._running.get(rid)
        if seq is None:
            return None
        if seq.fin < 0:  # prefilling: its first token, or its recompute after a preemption
            return seq.generated
        # Decoding in lock-step: step ``fin`` produces its last token, and
        # steps up to ``_g - 1`` have run.
        return seq.output - (seq.fin - (self._g - 1))

    def abort(self, rid: int) -> bool:
        """Abort request ``rid`` now, between two steps, as vLLM does when its
        client goes away: it leaves the queue or the batch, its blocks are
        freed and it records nothing. False when it is not here any more
        (finished, or aborted before). Finds it by a scan of the queues: meant
        for the occasional disconnect, not for every request."""
        seq = self._running.get(rid)
        if seq is None:
            seq = next((s for s in (*self._waiting, *self._pending) if s.rid == rid), None)
            if seq is None:
                return False
        self._drop(seq)
        self._carried = None  # another batch: the cut span does not go on
        return True

    def unfinished(self) -> list[Request]:
        """Every submitted request that has not finished (running, waiting or
        not yet arrived), in submission order: what a replica that is shut down
        drops."""
        seqs = [*self._running.values(), *self._waiting, *self._pending]
        return [s.req for s in sorted(seqs, key=lambda s: s.rid)]

    # ------------------------------------------------------------ internals

    def _draw_jitter(self) -> float:
        """The next segment's step-time noise factor (drawn in batches)."""
        if self._jitter_at == len(self._jitter):
            self._jitter = self._rng.lognormal(0.0, self._jitter_sigma, _JITTER_BATCH).tolist()
            self._jitter_at = 0
        self._jitter_at += 1
        return self._jitter[self._jitter_at - 1]

    def _admission(self, seq: _Seq, budget: int) -> tuple[int, int, int, int] | None:
        """What admitting ``seq`` with ``budget`` tokens left would take:
        ``(cached tokens, chunk, blocks it would hold, growth of used
        blocks)``, or ``None`` when the chunked-prefill-off rule forbids it."""
        bs = self._bs
        cached = shared = revive = 0
        if seq.pblocks and self._prefix_caching:
            entry = self._prefixes.get(seq.prefix)  # type: ignore[arg-type]
            if entry is not None:
                shared = seq.pblocks
                cached = shared * bs
                if entry[1] == 0:
                    revive = shared  # an evictable prefix becomes referenced again
        todo = seq.target - cached
        if not self._chunked and todo > budget:
            return None
        chunk = min(todo, budget)
        blocks = -(-(cached + chunk) // bs)
        return cached, chunk, blocks, blocks - shared + revive

    def _lora_deferred(self, seq: _Seq) -> bool:
        """Whether admitting ``seq`` would put one LoRA adapter too many in the batch."""
        lora = seq.req.lora
        adapters = self._adapters
        return lora is not None and lora not in adapters and len(adapters) >= self._max_loras  # type: ignore[operator]

    def _candidate(self) -> _Seq | None:
        """The waiting request the next step tries to admit first: the head of the queue, past those LoRA defers."""
        if not self._max_loras:
            return self._waiting[0] if self._waiting else None
        return next((s for s in self._waiting if not self._lora_deferred(s)), None)

    def _head_admissible(self) -> bool:
        """Would the next step admit the first waiting request it tries? (Decides
        whether a decode-only span may be fast-forwarded.)"""
        seq = self._candidate()
        if seq is None or len(self._running) >= self._max_seqs:
            return False
        budget = self._budget - self._n_dec
        if budget <= 0:
            return False
        cost = self._admission(seq, budget)
        return cost is not None and cost[3] <= self.num_gpu_blocks - self._used

    def _span_length(self, until: float, jitter: float) -> tuple[int, float | None]:
        """How many decode-only steps can run before the next event, and ``jitter`` where ``until`` cut them short
        (else None)."""
        heap, running = self._fin_heap, self._running
        while heap and getattr(running.get(heap[0][1]), "fin", None) != heap[0][0]:
            heapq.heappop(heap)  # stale: preempted (and maybe readmitted with a new finish step)
        g, n = self._g, self._n_dec
        steps = heap[0][0] - g + 1
        free = self.num_gpu_blocks - self._used
        if n * (steps // self._bs + 1) > free:
            steps = min(steps, self._steps_before_block_shortage(free))
        if steps <= 1:
            return steps, None
        event = self._event_bound()
        bound = min(until, event)
        if bound == math.inf:
            return steps, None
        cost = self.cost
        first = (cost.decode_fixed(n) + cost.per_decode_context * (self._sum_base + n * g)) * jitter
        growth = cost.per_decode_context * n * jitter
        before = _steps_starting_before(bound - self._now, first, growth)
        return (steps, None) if before >= steps else (before, jitter if until < event else None)

    def _event_bound(self) -> float:
        """When the next event falls that ends a decode span: a waiting request's first-token deadline (it is
        aborted, and the next in line may be admissible), or an arrival that would be admitted at the next step
        start; inf when none is known."""
        bound = math.inf
        deadlines = self._deadlines
        while deadlines and (deadlines[0][2].generated or deadlines[0][2].aborted):
            heapq.heappop(deadlines)  # it has its first token (its client waits on), or it is gone
        if deadlines:
            bound = deadlines[0][0]
        if (
            self._pending
            and self._candidate() is None
            and len(self._running) < self._max_seqs
            and self._budget > self._n_dec
        ):
            bound = min(bound, self._pending[0].arrival)
        return bound

    def _steps_before_block_shortage(self, free: int) -> int:
        """Decode steps the free blocks cover, starting at the current step."""
        bs, n, g, phases = self._bs, self._n_dec, self._g, self._phase_counts
        cycles = free // n
        left = free - cycles * n
        extra = 0
        while extra < bs:
            need = phases[(g + extra) % bs]
            if need > left:
                break
            left -= need
            extra += 1
        return cycles * bs + extra

    def _blocks_for_steps(self, steps: int) -> int:
        """New KV blocks the decoding batch takes over ``steps`` steps."""
        bs, g, phases = self._bs, self._g, self._phase_counts
        full, rest = divmod(steps, bs)
        total = full * self._n_dec
        for i in range(rest):
            total += phases[(g + i) % bs]
        return total

    def _span(self, steps: int, jitter: float) -> None:
        """Fast-forward ``steps`` identical decode-only steps."""
        n, g, cost, metrics = self._n_dec, self._g, self.cost, self.metrics
        context = self._sum_base + n * g
        first = (cost.decode_fixed(n) + cost.per_decode_context * context) * jitter
        growth = cost.per_decode_context * n * jitter
        self._now += steps * first + growth * steps * (steps - 1) / 2
        metrics.itl.observe_linear(first, growth, steps, n)
        slow = self._slow_steps
        for i, threshold in enumerate(self._slow_at):
            slow[i] += _steps_longer_than(threshold, first, growth, steps)
        metrics.iteration_tokens.observe_weighted(n, steps)
        self._scheduled_tokens += n * steps
        self._steps += steps
        metrics.counters["generation_tokens"] += n * steps
        context_sum = steps * context + n * steps * (steps - 1) / 2
        self._attention_units += context_sum
        self._kv_read += context_sum
        self._used += self._blocks_for_steps(steps)
        self._evict_if_needed()
        self._g = g + steps
        self._end_segment(first + growth * (steps - 1))
        self._finish_decodes(g + steps - 1)

    def _step(self, jitter: float) -> None:
        """One engine step with V1's scheduling, in full."""
        g, bs, now = self._g, self._bs, self._now
        running = self._running
        budget = self._budget - self._n_dec
        need = self._phase_counts[g % bs] if self._n_dec else 0
        part = self._partial
        part_chunk = part_need = 0
        if part is not None and budget > 0:
            part_chunk = min(part.target - part.computed, budget)
            part_need = -(-(part.computed + part_chunk) // bs) - part.blocks
        preempted = False
        while need + part_need > self.num_gpu_blocks - self._used and running:
            preempted = True
            victim = self._preempt_newest(g)
            if victim is part:
                part = None
                part_chunk = part_need = 0
            elif (1 - victim.base) % bs == g % bs:
                need -= 1
        self._used += need + part_need
        items: list[tuple[_Seq, int, int]] = []  # (request, chunk, tokens computed before it)
        if part is not None and part_chunk:
            items.append((part, part_chunk, part.computed))
            part.blocks += part_need
            budget -= part_chunk
        if not preempted:
            waiting = self._waiting
            deferred: list[_Seq] = []  # skipped for their LoRA adapter, back at the head afterwards
            while waiting and budget > 0 and len(running) < self._max_seqs:
                seq = waiting[0]
                if self._max_loras and self._lora_deferred(seq):
                    deferred.append(waiting.popleft())
                    continue
                cost = self._admission(seq, budget)
                if cost is None or cost[3] > self.num_gpu_blocks - self._used:
                    break
                waiting.popleft()
                cached, chunk, blocks, growth = cost
                self._admit(seq, cached, blocks, growth, now)
                items.append((seq, chunk, cached))
                budget -= chunk
            waiting.extendleft(reversed(deferred))
        self._evict_if_needed()

        n = self._n_dec
        context = self._sum_base + n * g
        tokens, units, kv_read, sampled = n, float(context), float(context), n
        for seq, chunk, done in items:
            tokens += chunk
            units += chunk * done + chunk * (chunk + 1) / 2
            kv_read += done + chunk
            if done + chunk == seq.target:
                sampled += 1
        seconds = self.cost.seconds(tokens, n + len(items), sampled, units, kv_read) * jitter
        now += seconds
        self._now = now
        self._attention_units += units
        self._kv_read += kv_read

        metrics = self.metrics
        self._first_prompts = 0
        self._scheduled_tokens += tokens
        self._steps += 1
        if n:
            metrics.itl.weighted_values.append(seconds)
            metrics.itl.weights.append(n)
            slow = self._slow_steps
            for i, threshold in enumerate(self._slow_at):
                if seconds > threshold:
                    slow[i] += 1
        metrics.counters["generation_tokens"] += sampled
        self._end_segment(seconds)

        self._partial = part  # unless it completes below; a new one may start
        for seq, chunk, done in items:
            seq.computed = done + chunk
            if seq.computed < seq.target:
                self._partial = seq
            else:
                if seq is self._partial:
                    self._partial = None
                self._prefill_done(seq, g, now)
        if sampled:  # vLLM observes an output batch: prompts that got their first token plus the tokens sampled
            metrics.iteration_tokens.values.append(self._first_prompts + sampled)
        if self._fin_heap and self._fin_heap[0][0] <= g:
            self._finish_decodes(g)
        self._g = g + 1

    def _expire(self, now: float) -> None:
        """Abort the requests still without a first token whose clients gave up by ``now``."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, rid, seq = heapq.heappop(deadlines)
            if seq.generated or seq.aborted:
                continue  # its first token came in time, or its client went away before
            self._drop(seq)
            self.timed_out.append(rid)

    def _drop(self, seq: _Seq) -> None:
        """Abort ``seq`` at the start of step ``_g``: out of the batch (its
        blocks freed) or out of the queues.

        vLLM V1 records no metrics for an aborted request (the output
        processor drops its state without the finished-request stats), so
        only the running and waiting gauges show it. Its entries in the heaps
        of finish steps and deadlines go stale and are skipped there.
        """
        seq.aborted = True
        if self._running.pop(seq.rid, None) is None:
            (self._waiting if seq in self._waiting else self._pending).remove(seq)
            return
        self._leave_batch(seq, self._g)

    def _admit(self, seq: _Seq, cached: int, blocks: int, growth: int, now: float) -> None:
        """Move ``seq`` from waiting to running."""
        if cached:
            entry = self._prefixes[seq.prefix]  # type: ignore[index]
            if entry[1] == 0:
                self._evictable_blocks -= self._evictable.pop(seq.prefix)  # type: ignore[arg-type]
            entry[1] += 1
            seq.shared = seq.pblocks
        self._used += growth
        seq.blocks = blocks
        seq.computed = cached
        if seq.req.lora is not None:
            self._adapters[seq.req.lora] = self._adapters.get(seq.req.lora, 0) + 1
        first = seq.scheduled_at < 0
        if first:
            seq.scheduled_at = now
            seq.cached = cached
        if self._prefix_caching and first:  # vLLM counts a preempted request's re-admission apart, unexported
            counters = self.metrics.counters
            counters["prefix_cache_queries"] += seq.target
            counters["prefix_cache_hits"] += cached
        self._running[seq.rid] = seq

    def _prefill_done(self, seq: _Seq, g: int, now: float) -> None:
        """``seq`` computed its whole prompt at step ``g`` and sampled a token."""
        metrics = self.metrics
        if seq.generated == 0:
            seq.first_token_at = now
            metrics.ttft.observe(now - seq.arrival)
            counters = metrics.counters
            counters["prompt_tokens"] += seq.prompt
            self._first_prompts += seq.prompt
            counters["prompt_tokens_cached"] += seq.cached
        else:  # readmitted after a preemption: its token gap includes the wait
            gap = now - seq.last_token_at
            metrics.itl.observe(gap)
            if gap > seq.max_gap:
                seq.max_gap = gap
            for i, threshold in enumerate(self._slow_at):
                if gap > threshold:
                    seq.slow[i] += 1
        seq.generated += 1
        seq.last_token_at = now
        if seq.pblocks and not seq.shared and self._prefix_caching and seq.prefix not in self._prefixes:
            self._prefixes[seq.prefix] = [seq.pblocks, 1]  # type: ignore[index]
            seq.shared = seq.pblocks  # its first blocks are now the cached prefix
        if seq.generated >= seq.output:
            self._finish(seq, seq.blocks, now)
            return
        seq.base = seq.target - g
        seq.fin = g + seq.output - seq.generated
        seq.seg0 = self._seg + 1
        seq.slow0 = list(self._slow_steps)
        self._phase_counts[(1 - seq.base) % self._bs] += 1
        self._sum_base += seq.base
        self._n_dec += 1
        heapq.heappush(self._fin_heap, (seq.fin, seq.rid))

    def _finish_decodes(self, g: int) -> None:
        """Complete the decoding requests whose last token came at step ``g``."""
        heap, running, bs, now = self._fin_heap, self._running, self._bs, self._now
        while heap and heap[0][0] <= g:
            fin, rid = heapq.heappop(heap)
            seq = running.get(rid)
            if seq is None or seq.fin != fin:
                continue  # preempted since
            self._leave_decoding(seq)
            seq.last_token_at = now
            seq.max_gap = max(seq.max_gap, self._max_step_since(seq.seg0))
            self._finish(seq, -(-(seq.base + g) // bs), now)

    def _leave_batch(self, seq: _Seq, g: int) -> None:
        """Take running ``seq`` out of the batch at the start of step ``g``
        and free its blocks: a partial prefill's whole allocation, a decoding
        request's blocks of the tokens it has so far."""
        if seq is self._partial:
            self._partial = None
            blocks = seq.blocks
        else:
            self._leave_decoding(seq)
            blocks = -(-(seq.base + g - 1) // self._bs)
        self._release(seq, blocks)

    def _leave_decoding(self, seq: _Seq) -> None:
        """End ``seq``'s decode run after the step that produced its latest token."""
        if self._slow_at:
            seq.slow = [s + now - then for s, now, then in zip(seq.slow, self._slow_steps, seq.slow0, strict=True)]
        self._phase_counts[(1 - seq.base) % self._bs] -= 1
        self._sum_base -= seq.base
        self._n_dec -= 1
        seq.fin = -1

    def _preempt_newest(self, g: int) -> _Seq:
        """vLLM's recompute preemption of the newest running request, at the
        start of step ``g``."""
        _, seq = self._running.popitem()
        if seq is not self._partial:
            seq.generated = seq.output - (seq.fin - (g - 1))
            seq.last_token_at = self._now
            seq.max_gap = max(seq.max_gap, self._max_step_since(seq.seg0))
        self._leave_batch(seq, g)
        seq.target = seq.prompt + seq.generated
        seq.computed = seq.blocks = 0
        seq.preemptions += 1
        self.metrics.counters["num_preemptions"] += 1
        self._waiting.appendleft(seq)
        return seq

    def _release(self, seq: _Seq, blocks: int) -> None:
        """Free the KV blocks ``seq`` holds as it leaves the batch, and its LoRA adapter's place when it was the
        adapter's last request there; a prefix nobody references any more stays cached but becomes evictable."""
        lora = seq.req.lora
        if lora is not None:
            left = self._adapters.pop(lora) - 1
            if left:
                self._adapters[lora] = left
        self._used -= blocks - seq.shared
        if seq.shared:
            entry = self._prefixes[seq.prefix]  # type: ignore[index]
            entry[1] -= 1
            if entry[1] == 0:
                self._used -= entry[0]
                self._evictable[seq.prefix] = entry[0]  # type: ignore[index]
                self._evictable_blocks += entry[0]
            seq.shared = 0

    def _evict_if_needed(self) -> None:
        """Drop least-recently-used unreferenced prefixes whose blocks the
        running requests have taken."""
        while self._evictable_blocks > self.num_gpu_blocks - self._used:
            prefix, blocks = self._evictable.popitem(last=False)
            self._evictable_blocks -= blocks
            del self._prefixes[prefix]

    def _end_segment(self, longest_step: float) -> None:
        """Close a segment (a step or a span) whose longest step took
        ``longest_step`` seconds, for later max-ITL queries."""
        self._seg += 1
        segs, maxes = self._stack_seg, self._stack_max
        while maxes and maxes[-1] <= longest_step:
            segs.pop()
            maxes.pop()
        segs.append(self._seg)
        maxes.append(longest_step)

    def _max_step_since(self, seg: int) -> float:
        """Longest step in segments ``seg`` and later."""
        i = bisect_left(self._stack_seg, seg)
        return self._stack_max[i] if i < len(self._stack_max) else 0.0

    def _finish(self, seq: _Seq, blocks: int, now: float) -> None:
        """Record a completed request and free its blocks."""
        del self._running[seq.rid]
        self._release(seq, blocks)
        decode_time = now - seq.first_token_at
        mean_itl = decode_time / (seq.output - 1) if seq.output > 1 else 0.0
        self.metrics.finished.append(
            (
                now - seq.arrival,
                seq.scheduled_at - seq.arrival,
                seq.first_token_at - seq.scheduled_at,
                decode_time,
                now - seq.scheduled_at,
                mean_itl,
                seq.prompt,
                seq.output,
                seq.preemptions,
                seq.prompt - seq.cached,
            )
        )
        self._finished.append(
            FinishedRequest(
                rid=seq.rid,
                arrival=seq.arrival,
                queue_time=seq.scheduled_at - seq.arrival,
                first_token_time=seq.first_token_at,
                finish_time=now,
                prompt_tokens=seq.prompt,
                output_tokens=seq.output,
                preemptions=seq.preemptions,
                mean_itl=mean_itl,
                max_itl=seq.max_gap,
                slow_gaps=tuple(seq.slow),
            )
        )


def _steps_longer_than(threshold: float, first: float, growth: float, steps: int) -> int:
    """How many of ``steps`` consecutive steps, lasting ``first``, ``first + growth``... exceed ``threshold``."""
    if first > threshold:
        return steps
    if growth <= 0:
        return 0
    return max(0, steps - (math.floor((threshold - first) / growth) + 1))


def _steps_starting_before(window: float, first: float, growth: float) -> int:
    """How many consecutive steps, lasting ``first``, ``first + growth``,
    ``first + 2*growth``... start within ``window`` seconds (at least one)."""
    if window <= 0:
        return 1
    # steps s = 0..k-1 start at first*s + growth*s*(s-1)/2 < window
    b = first - growth / 2
    if growth > 0:
        root = 2 * window / (b + math.sqrt(b * b + 2 * growth * window))
    else:
        root = window / first
    k = max(1, math.ceil(root))

    def start(s: int) -> float:
        return first * s + growth * s * (s - 1) / 2

    while k > 1 and start(k - 1) >= window:
        k -= 1
    while start(k) < window:
        k += 1
    return k
