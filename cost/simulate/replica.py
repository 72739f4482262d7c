"""One replica as a continuous-batching server: a FCFS queue in front of an engine that runs steps.

The engine's timing is the capacity model's (``cost.simulate.capacity``): each step decodes one
token for every running sequence and prefills the prompts admitted at the step's start; its
length is ``CapacityModel.step_s(seqs, kv_tokens, prefill_tokens)``. Admission happens at step
boundaries, first come first served, while fewer than ``max_num_seqs`` run, the step's token
budget (``max_num_batched_tokens``) has room and the KV cache can hold the prompt and its whole
answer (reserved up front: vLLM allocates blocks as tokens come and preempts when it runs out,
so this is the cautious side of it). A request's first token comes out of the step that prefills
it; each later token takes one more step.

Why not one event per step: a day of traffic is millions of steps. Between two changes of the
running set (an admission or a completion) the steps differ only by the KV cache, which grows
by one token per sequence per step, so k steps take ``k·T₀ + c·n·k(k−1)/2``: the replica jumps
from change to change in closed form, and its cost grows with requests, not with tokens.
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Callable

# Outcome of each request, kept in the fleet's arrays: what a finished request reports.
Finished = Callable[[int, float, float], None]       # (request index, first token time, last token time)


class BatchingReplica:
    """The queue and running batch of one server; time moves only through ``advance_to``."""

    __slots__ = ("clock", "step", "running", "kv", "reserved", "queue", "prefill_extra_s", "just_admitted",
                 "finish_heap", "first_token_at", "admitted", "inputs", "outputs", "on_finish",
                 "base_s", "per_seq_s", "per_kv_s", "per_prefill_s", "max_seqs", "budget", "kv_capacity",
                 "busy_s", "started_s", "pending_prefill")

    def __init__(self, capacity, inputs, outputs, on_finish: Finished, now: float = 0.0) -> None:
        self.base_s = capacity.step_base_s
        self.per_seq_s = capacity.step_per_seq_s
        self.per_kv_s = capacity.step_per_kv_token_s
        self.per_prefill_s = capacity.prefill_per_token_s
        self.max_seqs = capacity.max_num_seqs
        self.budget = capacity.max_num_batched_tokens
        self.kv_capacity = capacity.kv_cache_tokens
        self.inputs, self.outputs = inputs, outputs          # per-request sizes (shared lists)
        self.on_finish = on_finish
        self.started_s = now
        self.clock = now            # time of the last step boundary (or when it went idle)
        self.step = 0               # steps completed so far
        self.running = 0            # sequences in the batch
        self.kv = 0                 # tokens in the KV cache: each running sequence's prompt + tokens so far
        self.reserved = 0           # KV tokens reserved for the running sequences' whole answers
        self.queue: deque[int] = deque()
        self.prefill_extra_s = 0.0  # what the next step adds for the prompts admitted at its start
        self.pending_prefill = 0    # those prompts' tokens (the step's token budget counts them)
        self.just_admitted: list[int] = []
        self.finish_heap: list[tuple[int, int]] = []          # (step that ends with its last token, request)
        self.first_token_at: dict[int, float] = {}            # request -> time of its first token
        self.admitted: dict[int, int] = {}                    # request -> step count when it was admitted
        self.busy_s = 0.0           # time spent running steps (for utilisation)

    # --- what the fleet asks -------------------------------------------------------------------

    @property
    def outstanding(self) -> int:
        """Requests queued or running: what a least-outstanding router and concurrency metrics see."""
        return self.running + len(self.queue)

    @property
    def waiting(self) -> int:
        return len(self.queue)

    def arrive(self, request: int, now: float) -> None:
        """A request reaches this replica at ``now`` (the caller has advanced it to ``now``)."""
        self.queue.append(request)
        if self.running == 0:
            # An idle engine starts a step as soon as work arrives.
            self.clock = max(self.clock, now)
            self._admit()
        elif self.clock == now:
            # Arriving exactly at a boundary: the step starting now takes it, as vLLM's scheduler
            # takes every request already queued when it builds a step.
            self._admit()

    def next_change_s(self) -> float:
        """When the running set next changes by itself (a completion, or an admission at the next
        boundary when requests wait and could be admitted); inf when idle."""
        if self.running == 0:
            return math.inf
        if self.queue and self._can_admit(self.queue[0]):
            return self.clock + self._steps_s(1)
        return self.clock + self._steps_s(self.finish_heap[0][0] - self.step)

    def advance_to(self, t: float) -> None:
        """Run the engine up to time ``t``: every step that ends by then, with its completions and
        admissions. Afterwards ``clock`` is the last step boundary at or before ``t``."""
        while self.running:
            if self.queue and self._can_admit(self.queue[0]):
                k = 1               # the next boundary admits: the running set changes there
            else:
                k = self.finish_heap[0][0] - self.step
            span = self._steps_s(k)
            if self.clock + span > t:
                k = self._steps_fitting(t - self.clock)
                if k:
                    self._run_steps(k, self._steps_s(k))
                return
            self._run_steps(k, span)
            self._complete()
            self._admit()

    def drain_queue(self) -> list[int]:
        """Take back every request still waiting (the replica is going away)."""
        waiting = list(self.queue)
        self.queue.clear()
        return waiting

    # --- the engine ----------------------------------------------------------------------------

    def _steady_step_s(self) -> float:
        return self.base_s + self.per_seq_s * self.running + self.per_kv_s * self.kv

    def _steps_s(self, k: int) -> float:
        """Length of the next ``k`` steps: the KV cache grows by ``running`` tokens a step."""
        return (k * self._steady_step_s() + self.per_kv_s * self.running * k * (k - 1) / 2
                + self.prefill_extra_s)

    def _steps_fitting(self, room: float) -> int:
        """How many whole steps end within ``room`` seconds."""
        t0 = self._steady_step_s()
        if t0 + self.prefill_extra_s > room:
            return 0
        r = room - self.prefill_extra_s
        c = self.per_kv_s * self.running
        if c <= 1e-15:
            k = int(r // t0)
        else:       # k·t0 + c·k(k−1)/2 <= r
            a, b = c / 2, t0 - c / 2
            k = int((-b + math.sqrt(b * b + 4 * a * r)) / (2 * a))
        k = max(1, k)
        while k > 1 and self._steps_s(k) > room:   # floating point: never overshoot
            k -= 1
        return k

    def _run_steps(self, k: int, span: float) -> None:
        if self.just_admitted:
            # Sequences admitted at the first step's start get their first token at its end.
            first_end = self.clock + self._steady_step_s() + self.prefill_extra_s
            for request in self.just_admitted:
                self.first_token_at[request] = first_end
            self.just_admitted = []
            self.prefill_extra_s = 0.0
            self.pending_prefill = 0
        self.clock += span
        self.busy_s += span
        self.step += k
        self.kv += self.running * k

    def _complete(self) -> None:
        heap = self.finish_heap
        while heap and heap[0][0] <= self.step:
            _, request = heapq.heappop(heap)
            self.running -= 1
            prompt = self.inputs[request]
            self.kv -= prompt + self.step - self.admitted.pop(request)
            self.reserved -= prompt + self.outputs[request]
            self.on_finish(request, self.first_token_at.pop(request), self.clock)

    def _can_admit(self, request: int) -> bool:
        if self.running >= self.max_seqs:
            return False
        # An empty engine admits any request, so a prompt larger than the cache cannot stall it.
        return self.running == 0 or self.reserved + self.inputs[request] + self.outputs[request] <= self.kv_capacity

    def _admit(self) -> None:
        """Admit waiting requests at this step boundary (FCFS, within the step's token budget)."""
        prefill = 0
        admitted = self.just_admitted
        while self.queue and self._can_admit(self.queue[0]):
            request = self.queue[0]
            prompt = self.inputs[request]
            if admitted and self.pending_prefill + prefill + prompt + self.running > self.budget:
                break
            self.queue.popleft()
            admitted.append(request)
            prefill += prompt
            self.running += 1
            self.reserved += prompt + self.outputs[request]
            # First token at the end of the next step, the last one after outputs − 1 more.
            heapq.heappush(self.finish_heap, (self.step + max(1, self.outputs[request]), request))
            self.admitted[request] = self.step
        if prefill:
            self.kv += prefill
            self.pending_prefill += prefill
            self.prefill_extra_s = self.per_prefill_s * self.pending_prefill
