"""A literal, slow transcription of vLLM V1's scheduling loop: the oracle the
fast engine is checked against.

Every step walks the running list in order (decodes take one token, a
partial prefill a chunk of the budget left), allocates KV blocks one request
at a time and preempts the newest running request when a block is missing,
then admits waiting requests FCFS unless the step preempted, skipping those
whose LoRA adapter would be one more than ``max_loras`` among the requests
the step runs (put back at the head, in order, after it). Before each
step, a request still without a first token whose client's timeout has
passed is aborted (out of the waiting queue, or out of the running list with
its blocks freed), and so is any request whose client went away (``aborts``:
request id -> when) by then, wherever it is. It prices steps
with the same :class:`StepCost` and no noise, and keeps no aggregates, spans
or heaps: if the engine's shortcuts drift from the plain algorithm, the two
disagree.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from vllm_autotuner.sim.engine import Request, StepCost


@dataclass
class _Req:
    rid: int
    req: Request
    num_tokens: int  # prompt + generated
    computed: int = 0
    generated: int = 0
    blocks: int = 0
    preemptions: int = 0
    first_token: float = -1.0
    last_token: float = -1.0
    max_gap: float = 0.0
    gaps: list[float] = field(default_factory=list)
    finish: float = -1.0


@dataclass
class ReferenceResult:
    first_token: dict[int, float] = field(default_factory=dict)
    finish: dict[int, float] = field(default_factory=dict)
    preemptions: dict[int, int] = field(default_factory=dict)
    max_gap: dict[int, float] = field(default_factory=dict)
    gaps: dict[int, list[float]] = field(default_factory=dict)
    step_tokens: list[int] = field(default_factory=list)
    """The tokens each step computed."""
    iteration_tokens: list[int] = field(default_factory=list)
    """What vLLM observes in ``vllm:iteration_tokens_total``, once per step that outputs a token: the prompts of
    the requests that get their first token in it, plus the tokens sampled. A step that only advances a chunked
    prefill is not observed."""
    preempted: int = 0
    """Preemptions of every request, the aborted included."""
    timed_out: list[int] = field(default_factory=list)
    timed_out_prefilling: int = 0
    """Of those, aborted while their prompt was partly computed."""
    aborted: dict[str, list[int]] = field(default_factory=dict)
    """Requests aborted by their clients going away, by where they were: waiting, preempted (waiting after a
    preemption), prefilling, decoding."""
    deferred: int = 0
    """Times a waiting request was skipped for its LoRA adapter."""


def run_reference(
    cost: StepCost,
    requests: list[Request],
    *,
    budget: int,
    max_seqs: int,
    num_blocks: int,
    chunked: bool,
    block_size: int = 16,
    aborts: dict[int, float] | None = None,
    max_loras: int | None = None,
) -> ReferenceResult:
    pending = deque(_Req(i, r, r.prompt_tokens) for i, r in enumerate(requests))
    waiting: deque[_Req] = deque()
    running: list[_Req] = []
    free = num_blocks
    now = 0.0
    out = ReferenceResult()

    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    while pending or waiting or running:
        while pending and pending[0].req.arrival <= now:
            waiting.append(pending.popleft())
        for r in [r for r in (*waiting, *running) if r.generated == 0]:
            if r.req.arrival + r.req.first_token_timeout <= now:
                if r in running:
                    running.remove(r)
                    free += r.blocks
                    out.timed_out_prefilling += 1
                else:
                    waiting.remove(r)
                out.timed_out.append(r.rid)
        for r in [r for r in (*waiting, *running) if r.rid in (aborts or {}) and aborts[r.rid] <= now]:
            if r in running:
                running.remove(r)
                free += r.blocks
                where = "prefilling" if r.generated == 0 or r.num_tokens - r.computed > 1 else "decoding"
            else:
                waiting.remove(r)
                where = "preempted" if r.generated else "waiting"
            out.aborted.setdefault(where, []).append(r.rid)
        if not waiting and not running:
            if not pending:
                break
            now = pending[0].req.arrival
            continue
        left = budget
        scheduled: list[tuple[_Req, int]] = []
        preempted = False
        i = 0
        while i < len(running):
            r = running[i]
            new = min(r.num_tokens - r.computed, left)
            if new == 0:
                i += 1
                continue
            need = cdiv(r.computed + new, block_size) - r.blocks
            self_preempted = False
            while need > free:
                victim = running.pop()
                free += victim.blocks
                victim.blocks = victim.computed = 0
                victim.preemptions += 1
                out.preempted += 1
                waiting.appendleft(victim)
                preempted = True
                if victim is r:
                    self_preempted = True
                    break
            if self_preempted:
                break
            r.blocks += need
            free -= need
            scheduled.append((r, new))
            left -= new
            i += 1
        if not preempted:
            loras = {r.req.lora for r, _ in scheduled if r.req.lora is not None}  # of the running it scheduled
            skipped: list[_Req] = []
            while waiting and left > 0 and len(running) < max_seqs:
                r = waiting[0]
                if max_loras and r.req.lora is not None and r.req.lora not in loras and len(loras) == max_loras:
                    skipped.append(waiting.popleft())
                    out.deferred += 1
                    continue
                new = r.num_tokens - r.computed
                if not chunked and new > left:
                    break
                new = min(new, left)
                need = cdiv(new, block_size)
                if need > free:
                    break
                waiting.popleft()
                r.blocks = need
                free -= need
                running.append(r)
                scheduled.append((r, new))
                left -= new
                if r.req.lora is not None:
                    loras.add(r.req.lora)
            waiting.extendleft(reversed(skipped))
        tokens = units = kv_read = sampled = 0
        for r, new in scheduled:
            tokens += new
            units += new * r.computed + new * (new + 1) / 2
            kv_read += r.computed + new
            if r.computed + new == r.num_tokens:
                sampled += 1
        now += cost.seconds(tokens, len(scheduled), sampled, units, kv_read)
        out.step_tokens.append(tokens)
        first_prompts = 0
        for r, new in scheduled:
            r.computed += new
            if r.computed < r.num_tokens:
                continue
            if r.generated == 0:
                r.first_token = now
                first_prompts += r.req.prompt_tokens
            else:
                r.max_gap = max(r.max_gap, now - r.last_token)
                r.gaps.append(now - r.last_token)
            r.last_token = now
            r.generated += 1
            if r.generated == r.req.output_tokens:
                running.remove(r)
                free += r.blocks
                out.first_token[r.rid] = r.first_token
                out.finish[r.rid] = now
                out.preemptions[r.rid] = r.preemptions
                out.max_gap[r.rid] = r.max_gap
                out.gaps[r.rid] = r.gaps
            else:
                r.num_tokens += 1
        if sampled:
            out.iteration_tokens.append(first_prompts + sampled)
    return out
