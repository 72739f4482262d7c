"""A step-by-step engine with the capacity model's rules: the differential reference for
BatchingReplica's closed-form jumps (where KV growth makes every step a little longer) and for
its drops of timed-out requests."""
from __future__ import annotations

import math

import numpy as np


def step_by_step(cap, arrivals, inputs, outputs, ttft=None, e2e=None, drops_waiting=False, async_scheduling=False):
    """(first token times, last token times, dropped) of each request. Each step decodes one
    token for every decoding sequence, then prompt chunks in arrival order within the token
    budget. With limits (seconds from arrival): a prompt done past its first deadline (the
    sooner of TTFT and E2E) is dropped with its first token; at each boundary a decoding request
    past its E2E deadline is dropped, and with ``drops_waiting`` a queued or prefilling one past
    its first deadline too. With ``async_scheduling`` a step takes from the queue only requests
    that arrived by the start of the step before it (when vLLM scheduled it), unless nothing was
    running then."""
    n = len(arrivals)
    limits = [v for v in (ttft, e2e) if v is not None]
    first_due = [a + min(limits) if limits else math.inf for a in arrivals]
    e2e_due = [a + e2e if e2e is not None else math.inf for a in arrivals]
    first, last, dropped = [math.nan] * n, [math.nan] * n, [False] * n
    queue, prefilling, decoding = [], {}, {}      # prefilling: request -> prompt tokens done
    context = {}                                  # decoding request -> tokens it holds
    t, i = 0.0, 0
    started = 0.0                                 # when the last step started
    while i < n or queue or prefilling or decoding:
        if not (queue or prefilling or decoding):
            t = max(t, arrivals[i])
        while i < n and arrivals[i] <= t:
            queue.append(i)
            i += 1
        room = cap.max_num_batched_tokens - len(decoding)
        cutoff = started if async_scheduling and (prefilling or decoding) else t
        chunks = {}
        for r in prefilling:
            if room <= 0:
                break
            chunks[r] = min(inputs[r] - prefilling[r], room)
            room -= chunks[r]
        while (room > 0 and queue and len(decoding) + len(prefilling) < cap.max_num_seqs
               and arrivals[queue[0]] <= cutoff):
            r = queue.pop(0)
            prefilling[r] = 0
            chunks[r] = min(inputs[r], room)
            room -= chunks[r]
        if not chunks and not decoding:
            t = arrivals[i]
            continue
        kv = sum(context.values()) + sum(prefilling[r] + c for r, c in chunks.items())
        started = t
        t += cap.step_s(len(decoding) + len(chunks), kv, sum(chunks.values()))
        for r in list(decoding):
            context[r] += 1
            decoding[r] -= 1
            if decoding[r] == 0:
                last[r] = t
                del decoding[r], context[r]
        for r, c in chunks.items():
            prefilling[r] += c
            if prefilling[r] >= inputs[r]:
                del prefilling[r]
                if t > first_due[r]:
                    dropped[r] = True
                    continue
                first[r] = t
                if outputs[r] <= 1:
                    last[r] = t
                else:
                    decoding[r], context[r] = outputs[r] - 1, inputs[r] + 1
        for r in [r for r in decoding if e2e_due[r] <= t]:
            dropped[r] = True
            del decoding[r], context[r]
        if drops_waiting:
            for r in [r for r in prefilling if first_due[r] <= t]:
                dropped[r] = True
                del prefilling[r]
            for r in [r for r in queue if first_due[r] <= t]:
                dropped[r] = True
                queue.remove(r)
    return np.array(first), np.array(last), np.array(dropped)
