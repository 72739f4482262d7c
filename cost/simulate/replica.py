"""One replica as a continuous-batching server: a FCFS queue in front of an engine that runs steps.

The engine's timing is the capacity model's (``cost.simulate.capacity``, whose docstring states
the step semantics this follows): each step decodes one token for every decoding sequence and
prefills chunks of prompts, at most ``max_num_batched_tokens`` tokens in all (decode tokens
first, then the prompts in arrival order: vLLM's chunked prefill); its length is
``step_s(seqs in the step, KV tokens they hold, prompt tokens it computes)``. Requests are
admitted at step boundaries, first come first served, while fewer than ``max_num_seqs`` are
running, the step's token budget has room and the KV cache can hold the prompt and its whole
answer (reserved up front: vLLM allocates blocks as tokens come and preempts when it runs out,
so this is the cautious side of it). A request's first token comes out of the step that
finishes its prompt; each later token takes one more step.

Why not one event per step: a day of traffic is millions of steps. Between two changes of the
running set (an admission, a prompt finished, a completion) decode steps differ only by the KV
cache, which grows by one token per sequence per step, so k steps take ``k·T₀ + c·n·k(k−1)/2``:
the replica jumps from change to change in closed form, and its cost grows with requests, not
with tokens. Steps that carry prompt chunks are taken one at a time.

A capacity model with ``frontend_request_s`` (one built from specs) has a front end: each request
spends that long on the API server's one event loop, in turn, before the engine sees it.

With a ``prefix_cache_hit_rate`` a prompt's leading tokens come from vLLM's prefix cache: it is
admitted with them already computed, so only the rest takes the step's token budget and prefill
time, while its steps still read them (the KV held) and its reserve is still the whole prompt and
answer (the cautious side: cached blocks shared between requests are counted for each). A trace
that names its prompts' blocks gives each replica its own cache of them instead
(``cost.simulate.prefix``): the hits are those of that replica's history.

With ``async_scheduling`` (vLLM's default since 0.14.0) the engine schedules each step while the
one before it runs, so the step starting at a boundary was fixed at the boundary before: a
request the engine gets during a step joins the step after next, where a synchronous scheduler
would take it into the next one (vllm/v1/engine/core.py, ``step_with_batch_queue``, a batch queue
of two). An engine with nothing scheduled takes it at once, as vLLM's loop schedules as soon as
it has a request and no step in flight.

A request whose client gave up (``Cancellation``: the rung's front-door timeouts) is dropped at
a step boundary, as vLLM aborts a request between steps: its queue place, batch slot, KV cache
and reserve are freed. Each deadline is one more change the replica stops at (the first step
boundary at or after it), so a jump never runs past a request that should have left.
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Callable

from cost.simulate.prefix import PrefixBlocks, PrefixCache

# Outcome of each request, kept in the fleet's arrays: what a finished request reports.
Finished = Callable[[int, float, float], None]       # (request index, first token time, last token time)
TTFT_DEADLINE, E2E_DEADLINE = 0, 1


@dataclass(frozen=True)
class Cancellation:
    """When the engine drops a timed-out request. Limits are engine time from arrival (the
    client's limit less what it sees besides steps). ``drops_waiting``: a request still waiting
    for its first token is dropped at its deadline (Ray Serve cancels it wherever it is); else
    when its first token is ready (the plain server notices the client gone when it writes),
    so its queue wait and prefill are spent first."""
    arrivals: list[float]
    ttft_s: float | None
    e2e_s: float | None
    drops_waiting: bool
    on_abort: Callable[[int, float], None]      # (request, time dropped)

    def first_deadline(self, request: int) -> float:
        """When a request without its first token has timed out (inf: never)."""
        limits = [v for v in (self.ttft_s, self.e2e_s) if v is not None]
        return self.arrivals[request] + min(limits) if limits else math.inf


class BatchingReplica:
    """The queue and running batch of one server; time moves only through ``advance_to``."""

    __slots__ = ("clock", "step", "decoding", "kv", "reserved", "queue", "prefilling", "plan", "plan_s",
                 "finish_heap", "first_token_at", "decode_started", "inputs", "outputs", "on_finish",
                 "base_s", "per_seq_s", "per_kv_s", "per_prefill_s", "max_seqs", "budget", "kv_capacity",
                 "busy_s", "gemm_s", "cancel", "deadlines", "waiting_first", "cancelled",
                 "frontend_s", "frontend_free", "admitting", "flat_cached", "prefix_cache",
                 "async_scheduling", "scheduled_from", "entered")

    def __init__(self, capacity, inputs, outputs, on_finish: Finished, now: float = 0.0,
                 cancel: Cancellation | None = None, prefix: PrefixBlocks | None = None) -> None:
        self.base_s = capacity.step_base_s
        self.per_seq_s = capacity.step_per_seq_s
        self.per_kv_s = capacity.step_per_kv_token_s
        self.per_prefill_s = capacity.prefill_per_token_s
        # The matmul roofline of a model built from specs; None for a bench fit (all linear).
        self.gemm_s = capacity.gemm_s if capacity.gemm_s(1) else None
        self.max_seqs = capacity.max_num_seqs
        self.budget = capacity.max_num_batched_tokens
        self.kv_capacity = capacity.kv_cache_tokens
        self.inputs, self.outputs = inputs, outputs          # per-request sizes (shared lists)
        # A prompt's leading tokens the prefix cache serves: computed already when it is admitted.
        # From the trace's prompt blocks where it names them (this replica's own cache of them),
        # else the capacity model's flat share.
        self.prefix_cache = PrefixCache(prefix) if prefix is not None else None
        self.flat_cached = capacity.cached_prompt_tokens if capacity.prefix_cache_hit_rate else None
        self.on_finish = on_finish
        self.clock = now            # time of the last step boundary (or when it went idle)
        self.step = 0               # steps completed so far
        self.decoding = 0           # sequences past their prompt, one token a step
        self.kv = 0                 # tokens the decoding sequences hold: prompt + tokens so far
        self.reserved = 0           # KV tokens reserved for every running sequence's whole answer
        self.queue: deque[int] = deque()
        self.prefilling: deque[list[int]] = deque()      # [request, prompt tokens computed so far]
        self.plan: list[tuple[list[int], int]] = []      # the next step's prompt chunks, fixed at its start
        self.plan_s = 0.0           # that step's length
        self.finish_heap: list[tuple[int, int]] = []     # (step that ends with its last token, request)
        self.first_token_at: dict[int, float] = {}       # request -> time of its first token
        self.decode_started: dict[int, int] = {}         # request -> step count when its prompt was done
        self.busy_s = 0.0           # time spent running steps (for utilisation)
        self.cancel = cancel
        self.deadlines: list[tuple[float, int, int]] = []    # (time, request, TTFT_/E2E_DEADLINE)
        self.waiting_first: set[int] = set()     # queued or prefilling (kept only with ``cancel``)
        self.cancelled: set[int] = set()         # dropped while decoding: their finish_heap entries are void
        # The front end (vLLM's API server, one event loop) takes each request in turn for
        # ``frontend_request_s`` before the engine sees it; 0 in a bench fit.
        self.frontend_s = capacity.frontend_request_s
        self.frontend_free = now                 # when the front end is next free
        self.admitting: deque[tuple[float, int]] = deque()   # (when the engine gets it, request)
        # Async scheduling: the step starting at a boundary takes only requests the engine had
        # by ``scheduled_from``, the start of the step before it (when it was scheduled).
        self.async_scheduling = capacity.async_scheduling
        self.scheduled_from = now
        self.entered: dict[int, float] = {}      # queued request -> when the engine got it (async only)

    # --- what the fleet asks -------------------------------------------------------------------

    @property
    def running(self) -> int:
        return self.decoding + len(self.prefilling)

    @property
    def outstanding(self) -> int:
        """Requests at the front end, queued or running: what a least-outstanding router and
        concurrency metrics see."""
        return self.decoding + len(self.prefilling) + len(self.queue) + len(self.admitting)

    @property
    def waiting(self) -> int:
        """Requests not yet scheduled (vLLM's ``num_requests_waiting``)."""
        return len(self.queue)

    def arrive(self, request: int, now: float) -> None:
        """A request reaches this replica at ``now`` (the caller has advanced it to ``now``). With
        ``frontend_request_s`` its engine gets it once the front end has spent that long on it,
        after the requests before it, so requests sent together reach the engine spread out."""
        if self.frontend_s:
            self.frontend_free = max(now, self.frontend_free) + self.frontend_s
            self.admitting.append((self.frontend_free, request))
            return
        self._enter(request, now)

    def _enter(self, request: int, now: float) -> None:
        """The engine gets a request at ``now`` (it has run to ``now``)."""
        self.queue.append(request)
        if self.async_scheduling:
            self.entered[request] = now
        if self.cancel is not None:
            self.waiting_first.add(request)
            if self.cancel.drops_waiting:
                first = self.cancel.first_deadline(request)
                if first < math.inf:
                    heapq.heappush(self.deadlines, (first, request, TTFT_DEADLINE))
                if self.cancel.e2e_s is not None:
                    heapq.heappush(self.deadlines, (self.cancel.arrivals[request] + self.cancel.e2e_s, request,
                                                    E2E_DEADLINE))
        if not self.decoding and not self.prefilling:
            # An idle engine starts a step as soon as work arrives.
            self.clock = max(self.clock, now)
            self._schedule()
        elif self.clock == now:
            # Arriving exactly at a boundary: the step starting now takes it, as vLLM's scheduler
            # takes every request already queued when it builds a step.
            self._schedule()

    def advance_to(self, t: float) -> None:
        """Run the replica up to time ``t``: every request the front end hands on by then, and
        every step that ends by then, with its completions and admissions. Afterwards ``clock``
        is the last step boundary at or before ``t``."""
        while self.admitting and self.admitting[0][0] <= t:
            at, request = self.admitting.popleft()
            self._run_until(at)
            self._enter(request, at)
        self._run_until(t)

    def _run_until(self, t: float) -> None:
        """The engine's steps that end by ``t``."""
        while self.decoding or self.prefilling:
            k = self._steps_to_change()
            span = self._steps_s(k)
            if self.deadlines:
                due = self._next_deadline()
                if due < self.clock + span:         # stop at the first boundary at or after it
                    k = self._steps_reaching(due, k)
                    span = self._steps_s(k)
            if self.clock + span > t:
                if not self.plan:
                    k = self._steps_fitting(t - self.clock)
                    if k:
                        self._run_steps(k, self._steps_s(k))
                return
            self._run_steps(k, span)
            self._complete()
            if self.deadlines:
                self._expire()
            self._schedule()

    def next_boundary_s(self) -> float:
        """When the replica next changes: the front end hands a request on, or the running set
        changes (a prompt finishes, a request completes or may be admitted: the time a
        closed-loop client next sees an answer). Infinite when idle."""
        handed = self.admitting[0][0] if self.admitting else math.inf
        if not (self.decoding or self.prefilling):
            return handed
        return min(handed, self.clock + self._steps_s(self._steps_to_change()))

    # --- the engine ----------------------------------------------------------------------------

    def _steps_to_change(self) -> int:
        if self.plan:
            return 1                # a step with prompt chunks changes who decodes
        if self.queue and self._room() > 0 and self._can_admit(self.queue[0]):
            return 1                # the next boundary admits
        return self.finish_heap[0][0] - self.step

    def _room(self) -> int:
        return self.budget - self.decoding

    def _steady_step_s(self) -> float:
        step = self.base_s + self.per_seq_s * self.decoding + self.per_kv_s * self.kv
        return step + self.gemm_s(self.decoding) if self.gemm_s else step

    def _steps_s(self, k: int) -> float:
        """Length of the next ``k`` steps: the KV cache grows by one token a decoding sequence a step."""
        if self.plan:
            return self.plan_s
        return k * self._steady_step_s() + self.per_kv_s * self.decoding * k * (k - 1) / 2

    def _steps_fitting(self, room: float) -> int:
        """How many whole decode steps end within ``room`` seconds."""
        t0 = self._steady_step_s()
        if t0 > room:
            return 0
        c = self.per_kv_s * self.decoding
        if c <= 1e-15:
            k = int(room // t0)
        else:       # k·t0 + c·k(k−1)/2 <= room
            a, b = c / 2, t0 - c / 2
            k = int((-b + math.sqrt(b * b + 4 * a * room)) / (2 * a))
        k = max(1, k)
        while k > 1 and self._steps_s(k) > room:   # floating point: never overshoot
            k -= 1
        return k

    def _steps_reaching(self, due: float, k: int) -> int:
        """Steps (1..k) to the first boundary at or after ``due``."""
        if self.plan:
            return 1
        n = self._steps_fitting(due - self.clock) if due > self.clock else 0
        if n == 0 or self.clock + self._steps_s(n) < due:
            n += 1
        return min(n, k)

    def _run_steps(self, k: int, span: float) -> None:
        end = self.clock + span
        if self.async_scheduling:
            # When the last of these steps started: the step after them was scheduled then.
            self.scheduled_from = self.clock if (self.plan or k == 1) else self.clock + self._steps_s(k - 1)
        self.kv += self.decoding * k
        self.clock = end
        self.busy_s += span
        self.step += k
        if not self.plan:
            return
        for entry, chunk in self.plan:
            entry[1] += chunk
            request = entry[0]
            if entry[1] >= self.inputs[request]:
                # Its prompt is done: the step's end gives its first token, then it decodes.
                self.prefilling.remove(entry)
                if self.prefix_cache is not None:
                    self.prefix_cache.store(request)     # its blocks are computed: later prompts may hit them
                    self.prefix_cache.fit(self.kv_capacity - self.reserved)
                if self.cancel is not None and not self._keeps(request, end):
                    continue
                self.first_token_at[request] = end
                self.decoding += 1
                self.kv += self.inputs[request] + 1
                self.decode_started[request] = self.step
                heapq.heappush(self.finish_heap, (self.step + max(0, self.outputs[request] - 1), request))
        self.plan = []

    def _complete(self) -> None:
        heap = self.finish_heap
        while heap and heap[0][0] <= self.step:
            _, request = heapq.heappop(heap)
            if self.cancelled and request in self.cancelled:
                self.cancelled.discard(request)
                continue
            self.decoding -= 1
            self.kv -= self.inputs[request] + 1 + self.step - self.decode_started.pop(request)
            self._free(request)
            self.on_finish(request, self.first_token_at.pop(request), self.clock)

    def _admit(self, request: int) -> list[int]:
        """A request leaves the queue for the batch: its reserve (whole prompt and answer), and its
        prefilling entry, with what of its prompt the prefix cache serves already computed."""
        self.entered.pop(request, None)
        self.reserved += self.inputs[request] + self.outputs[request]
        cache = self.prefix_cache
        if cache is not None:
            cached = cache.admit(request, self.inputs[request])
            cache.fit(self.kv_capacity - self.reserved)
        else:
            cached = self.flat_cached(self.inputs[request]) if self.flat_cached else 0
        entry = [request, cached]
        self.prefilling.append(entry)
        return entry

    def _free(self, request: int) -> None:
        """A request leaves the batch (finished or dropped): its reserve, and its cached blocks'
        use, go."""
        self.reserved -= self.inputs[request] + self.outputs[request]
        if self.prefix_cache is not None:
            self.prefix_cache.release(request)

    def _can_admit(self, request: int) -> bool:
        running = self.decoding + len(self.prefilling)
        if running >= self.max_seqs:
            return False
        # An empty engine admits any request, so a prompt larger than the cache cannot stall it.
        return running == 0 or self.reserved + self.inputs[request] + self.outputs[request] <= self.kv_capacity

    def _scheduled_in_time(self, request: int) -> bool:
        """Whether the step starting now could take this queued request: always, unless async
        scheduling fixed that step before the engine had it."""
        return not self.async_scheduling or self.entered[request] <= self.scheduled_from

    def _schedule(self) -> None:
        """At a step boundary: the next step's prompt chunks, for the prompts under way first, then
        for requests admitted from the queue while the token budget has room."""
        if not (self.decoding or self.prefilling):
            self.scheduled_from = self.clock     # nothing was scheduled ahead: the engine takes them now
        room = self._room()
        plan = []
        for entry in self.prefilling:
            if room <= 0:
                break
            chunk = min(self.inputs[entry[0]] - entry[1], room)
            plan.append((entry, chunk))
            room -= chunk
        while room > 0 and self.queue and self._can_admit(self.queue[0]) and self._scheduled_in_time(self.queue[0]):
            request = self.queue.popleft()
            entry = self._admit(request)
            chunk = min(self.inputs[request] - entry[1], room)
            plan.append((entry, chunk))
            room -= chunk
        self.plan = plan
        if plan:
            prefill = sum(chunk for _, chunk in plan)
            held = sum(entry[1] + chunk for entry, chunk in plan)
            self.plan_s = (self.base_s + self.per_seq_s * (self.decoding + len(plan))
                           + self.per_kv_s * (self.kv + held) + self.per_prefill_s * prefill)
            if self.gemm_s:
                self.plan_s += self.gemm_s(self.decoding + len(plan) + prefill)

    # --- timed-out requests (only with ``cancel``) ------------------------------------------------

    def _keeps(self, request: int, end: float) -> bool:
        """A prompt done at ``end``: False (dropped, its reserve freed) when its client had gone
        by then; else it decodes, with its E2E deadline watched from now on."""
        cancel = self.cancel
        self.waiting_first.discard(request)
        if end > cancel.first_deadline(request):
            self._free(request)
            cancel.on_abort(request, end)
            return False
        if cancel.e2e_s is not None and not cancel.drops_waiting:
            heapq.heappush(self.deadlines, (cancel.arrivals[request] + cancel.e2e_s, request, E2E_DEADLINE))
        return True

    def _live(self, request: int, kind: int) -> bool:
        """Whether a deadline still applies: a TTFT one while the request has no first token,
        an E2E one while it is anywhere in the engine."""
        return request in self.waiting_first or (kind == E2E_DEADLINE and request in self.decode_started)

    def _next_deadline(self) -> float:
        heap = self.deadlines
        while heap and not self._live(heap[0][1], heap[0][2]):
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def _expire(self) -> None:
        """At a step boundary: drop every request whose deadline has passed."""
        heap = self.deadlines
        while heap and heap[0][0] <= self.clock:
            _, request, kind = heapq.heappop(heap)
            if self._live(request, kind):
                self._drop(request)
        while self.finish_heap and self.finish_heap[0][1] in self.cancelled:
            self.cancelled.discard(heapq.heappop(self.finish_heap)[1])

    def _drop(self, request: int) -> None:
        if request in self.decode_started:
            self.decoding -= 1
            self.kv -= self.inputs[request] + 1 + self.step - self.decode_started.pop(request)
            self._free(request)
            del self.first_token_at[request]
            self.cancelled.add(request)
        else:
            self.waiting_first.discard(request)
            entry = next((e for e in self.prefilling if e[0] == request), None)
            if entry is not None:
                self.prefilling.remove(entry)
                self._free(request)
            elif self.queue[0] == request:
                self.queue.popleft()
            else:
                self.queue.remove(request)
            self.entered.pop(request, None)
        self.cancel.on_abort(request, self.clock)
