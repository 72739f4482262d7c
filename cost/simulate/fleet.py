"""The event loop of a self-hosted rung: a trace's arrivals, a router, replicas that start and stop.

Three parts kept apart, as Vidur keeps them: how long a step takes is the capacity model's
(``capacity.py``), how one server batches is ``replica.py``, and who decides the replica count is
a scaling policy (``scaling.py``). This loop only moves time: arrivals in trace order, the
policy's evaluations on its own period, instances that finish starting, instances that drain.

Replicas are advanced lazily: one that gets no request is not touched until the policy looks at
every replica (its evaluation period) or a least-outstanding router needs its count. Their
completions are exact whenever they are computed, since each replica's steps depend only on it.

A rung's front door (``timeouts.FrontDoor``) fails a request whose first or last token comes
past its limits as TIMED_OUT. Where the platform cancels it, the replica drops it
(``replica.Cancellation``); where it does not (SageMaker), the engine finishes it and only its
status changes: the capacity stays spent.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from cost.simulate.prefix import PrefixBlocks, check_one_source, hit_summary, session_keys
from cost.simulate.replica import BatchingReplica, Cancellation
from options.core.affinity import DEFAULT_LOAD_BOUND, DEFAULT_LOAD_FLOOR, bounded_order

if TYPE_CHECKING:
    from cost.simulate.timeouts import FrontDoor

# A request's outcome, in the fleet's status array.
SERVED, NO_CAPACITY, TIMED_OUT, UNFINISHED = 0, 1, 2, 3
INTERRUPTED = 5      # on a spot node EC2 reclaimed (4 is Bedrock's THROTTLED)
STATUS_NAMES = {SERVED: "served", NO_CAPACITY: "no_capacity", TIMED_OUT: "timed_out", UNFINISHED: "unfinished",
                INTERRUPTED: "interrupted"}
# How a request picks a serving replica: uniformly at random (SageMaker's default, kube-proxy's
# Service), the one with the fewest outstanding requests (SageMaker's LEAST_OUTSTANDING_REQUESTS),
# the fewer of two drawn at random (Ray Serve's default router, "power of two choices"), or the
# session's own replica under bounded loads (the gateway's affinity, options.core.affinity).
ROUTINGS = ("random", "least_outstanding", "power_of_two", "affinity")


@dataclass(eq=False)
class Instance:
    """One instance's life: billed from launch to termination, serving once started. Compared by
    identity: instances launched together have equal fields, and the fleet's lists must find
    (``in``, ``remove``, ``index``) the one meant, not its twin."""
    launched_s: float
    ready_s: float
    replica: BatchingReplica | None = None
    ended_s: float | None = None     # termination (set when it is removed and drained)
    draining: bool = False


@dataclass
class FleetState:
    """What a scaling policy sees at an evaluation."""
    now: float
    in_service: int                  # instances serving
    starting: int                    # launched, not serving yet
    arrivals: int                    # requests that arrived since the previous evaluation
    period_s: float                  # time since the previous evaluation
    outstanding: int                 # requests queued or running over the serving replicas
    waiting: int                     # requests queued, not yet running
    no_capacity: int                 # requests refused since the previous evaluation for want of a replica


@dataclass
class FleetRun:
    """What happened to every request and instance."""
    first_token_s: np.ndarray        # absolute time of each request's first token (nan if none)
    finish_s: np.ndarray             # absolute time of its last token (nan if none)
    status: np.ndarray               # SERVED, NO_CAPACITY, TIMED_OUT, UNFINISHED
    instances: list[Instance]
    timeline: list[tuple[float, int, int]]   # (time, serving, starting) at every change
    decisions: list[dict[str, Any]] = field(default_factory=list)   # the policy's actions
    interruptions: list[dict[str, Any]] = field(default_factory=list)   # spot notices: node, notice, reclaim
    prefix_cache: dict[str, Any] | None = None   # hit counts over every replica, where the trace names its blocks

    def instance_seconds(self, end_s: float, minimum_s: float = 0.0) -> float:
        """Billed instance-seconds up to ``end_s``: each instance from launch to termination (or
        ``end_s``), at least ``minimum_s`` each (EC2's 60 s)."""
        total = 0.0
        for inst in self.instances:
            # Instances serving at time 0 were launched before the window: it bills only its own part.
            life = min(inst.ended_s if inst.ended_s is not None else end_s, end_s) - max(inst.launched_s, 0.0)
            total += max(life, minimum_s if inst.launched_s >= 0 else 0.0) if life > 0 else 0.0
        return total


def run_fleet(arrival_s: np.ndarray, input_tokens: np.ndarray, output_tokens: np.ndarray,
              capacity, policy, *, span_s: float, routing: str = "random", seed: int = 0,
              front_door: FrontDoor | None = None, interruption_notice: Callable[[int, float], float] | None = None,
              notice_s: float = 120.0, on_progress: Callable[[int], None] | None = None,
              prefix: PrefixBlocks | None = None) -> FleetRun:
    """Serve the arrivals on a fleet that ``policy`` sizes; every request's times and status.

    ``policy`` has ``initial`` (instances serving at time 0), ``period_s``, ``start_s`` (launch to
    serving), ``evaluate(FleetState) -> desired count``, and ``accepts_when_empty`` (False where a
    request finding no serving replica fails at once, as with inference components at zero copies;
    True where it waits for the first one to start).

    ``interruption_notice(node, launched_s)`` (spot nodes) gives each node's interruption notice
    time (inf: none). At the notice the node takes no more requests and a replacement launches;
    ``notice_s`` later it is reclaimed, and what it still holds fails as INTERRUPTED
    (``spot.py`` says why they are not re-queued).

    ``front_door`` (a ``timeouts.FrontDoor``, None: no limits) times requests out; one held for
    a first replica past its deadline is dropped there (its client left before any engine saw it).
    ``prefix`` (the trace's prompt blocks, ``cost.simulate.prefix``) gives each replica its own
    prefix cache of them; a capacity model's flat ``prefix_cache_hit_rate`` cannot be given too.
    Routing ``affinity`` places each request as the gateway does (``options.core.affinity``:
    its session's replica, under bounded loads), its session the first of its prompt blocks;
    a request without blocks goes to the replica with the fewest outstanding, as the gateway
    sends a request naming no session.
    """
    if routing not in ROUTINGS:
        raise ValueError(f"routing {routing!r}: one of {ROUTINGS}")
    check_one_source(prefix, capacity.prefix_cache_hit_rate)
    sessions = session_keys(prefix, len(arrival_s)) if routing == "affinity" else None
    n = len(arrival_s)
    arrivals = arrival_s.tolist()
    inputs = input_tokens.tolist()
    outputs = output_tokens.tolist()
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    status = np.full(n, UNFINISHED, dtype=np.int8)
    first_list = [math.nan] * n
    finish_list = [math.nan] * n

    def on_finish(request: int, t_first: float, t_last: float) -> None:
        first_list[request] = t_first
        finish_list[request] = t_last

    # What the client sees besides the replica's own time (HTTP, tokenising) is added to both times.
    overhead = capacity.outside_replica_s
    aborted_at: dict[int, float] = {}       # request -> when its engine (or the hold) dropped it
    cancel, held_limit = None, math.inf
    if front_door is not None:
        limits = [v for v in (front_door.ttft_s, front_door.e2e_s) if v is not None]
        held_limit = min(limits) if limits else math.inf
        if front_door.engine_stops != "no" and limits:
            engine_time = lambda v: None if v is None else v - overhead  # noqa: E731
            cancel = Cancellation(arrivals, engine_time(front_door.ttft_s), engine_time(front_door.e2e_s),
                                  front_door.engine_stops == "at_next_step", aborted_at.__setitem__)

    instances: list[Instance] = []
    serving: list[BatchingReplica] = []
    held: list[int] = []            # requests waiting for a first replica (accepts_when_empty)
    timeline: list[tuple[float, int, int]] = []
    decisions: list[dict[str, Any]] = []
    starting: list[Instance] = []   # launched, ordered by ready time
    rng = np.random.default_rng(seed)
    picks = rng.random(n).tolist()
    # the second candidate of power of two, drawn after the first so the others' draws are unchanged
    seconds = rng.random(n).tolist() if routing == "power_of_two" else None
    node_of: list[int] = [-1] * n           # the node each request was sent to
    node_index: dict[int, int] = {}         # id(replica) -> its node's index in instances
    notices: list[tuple[float, int]] = []   # (notice time, node): a heap
    reclaimed_at: dict[int, float] = {}     # node -> when EC2 reclaims it
    interruptions: list[dict[str, Any]] = []

    def add_instance(inst: Instance) -> None:
        instances.append(inst)
        starting.append(inst)
        if interruption_notice is not None:
            notice = interruption_notice(len(instances) - 1, max(0.0, inst.launched_s))
            if math.isfinite(notice):
                heapq.heappush(notices, (notice, len(instances) - 1))

    def launch(now: float, count: int) -> None:
        for _ in range(count):
            add_instance(Instance(now, now + policy.start_s))
        starting.sort(key=lambda i: i.ready_s)

    def interrupt(notice: float, node: int) -> None:
        inst = instances[node]
        if inst.ended_s is not None and inst.ended_s <= notice:
            return                                   # already gone
        bring_up(notice)
        reclaim = notice + notice_s
        reclaimed_at[node] = reclaim
        replaced = not inst.draining
        if inst in starting:                         # not serving yet: it never will
            starting.remove(inst)
            inst.ended_s = reclaim
        elif not inst.draining:                      # drained: no new requests, it finishes what it can
            inst.draining = True
            serving.remove(inst.replica)
            inst.replica.advance_to(math.inf)
            inst.ended_s = min(reclaim, max(notice, inst.replica.clock))
        else:                                        # already draining for a scale-in: cut short
            inst.ended_s = min(inst.ended_s, reclaim)
        if replaced:
            launch(notice, 1)
        interruptions.append({"node": node, "notice_s": round(notice, 3), "reclaimed_s": round(reclaim, 3),
                              "replaced": replaced})
        record(notice)

    def record(now: float) -> None:
        timeline.append((now, len(serving), len(starting)))

    def bring_up(upto: float) -> None:
        while starting and starting[0].ready_s <= upto:
            inst = starting.pop(0)
            inst.replica = BatchingReplica(capacity, inputs, outputs, on_finish, inst.ready_s, cancel, prefix)
            node_index[id(inst.replica)] = instances.index(inst)
            serving.append(inst.replica)
            record(inst.ready_s)
            drop_held(inst.ready_s)
            while held:             # requests that waited for a first replica go to it
                r = held.pop(0)
                node_of[r] = node_index[id(inst.replica)]
                inst.replica.advance_to(inst.ready_s)
                inst.replica.arrive(r, inst.ready_s)

    def drop_held(now: float) -> None:
        if held and held_limit < math.inf:
            keep = [r for r in held if arrivals[r] + held_limit >= now]
            for r in held:
                if arrivals[r] + held_limit < now:
                    aborted_at[r] = arrivals[r] + held_limit
            held[:] = keep

    def remove(now: float, count: int) -> None:
        # Newest first, as SageMaker and Kubernetes both prefer; still-starting ones go first.
        while count and starting:
            inst = starting.pop()
            inst.ended_s = now
            count -= 1
        for inst in reversed(instances):
            if not count:
                break
            if inst.replica is not None and not inst.draining and inst.ended_s is None:
                inst.draining = True
                serving.remove(inst.replica)
                inst.replica.advance_to(math.inf)     # in-flight and queued requests finish (draining)
                inst.ended_s = max(now, inst.replica.clock)
                count -= 1
        record(now)

    for _ in range(policy.initial):
        add_instance(Instance(-policy.start_s, 0.0))
    bring_up(0.0)
    record(0.0)

    period = policy.period_s
    next_eval = period
    last_eval = 0.0
    arrived = refused = 0
    progress_every = max(1, n // 100)

    def evaluate(now: float) -> None:
        nonlocal arrived, refused, last_eval
        bring_up(now)
        drop_held(now)
        for rep in serving:
            rep.advance_to(now)
        state = FleetState(now, len(serving), len(starting), arrived, now - last_eval,
                           sum(r.outstanding for r in serving) + len(held),
                           sum(r.waiting for r in serving) + len(held), refused)
        arrived = refused = 0
        last_eval = now
        desired = policy.evaluate(state)
        current = len(serving) + len(starting)
        if desired > current:
            launch(now, desired - current)
            decisions.append({"t": round(now, 3), "from": current, "to": desired})
            record(now)
        elif desired < current:
            remove(now, current - desired)
            decisions.append({"t": round(now, 3), "from": current, "to": desired})

    def events_until(t: float) -> None:
        """The policy's evaluations and the spot notices up to ``t``, in time order."""
        nonlocal next_eval
        while next_eval <= t or (notices and notices[0][0] <= t):
            if notices and notices[0][0] < next_eval:
                interrupt(*heapq.heappop(notices))
            else:
                evaluate(next_eval)
                next_eval += period

    for i, t in enumerate(arrivals):
        events_until(t)
        bring_up(t)
        arrived += 1
        if not serving:
            if policy.accepts_when_empty:
                held.append(i)
            else:
                status[i] = NO_CAPACITY
                refused += 1
            continue
        if routing == "random" or len(serving) == 1:
            rep = serving[int(picks[i] * len(serving))]
            rep.advance_to(t)
        elif sessions is not None and sessions[i] is not None:     # the gateway's session affinity
            for r in serving:
                r.advance_to(t)
            order, _ = bounded_order(sessions[i], [f"node-{node_index[id(r)]}" for r in serving],
                                     [r.outstanding for r in serving], DEFAULT_LOAD_BOUND, DEFAULT_LOAD_FLOOR)
            rep = serving[order[0]]
        elif seconds is not None:       # two distinct replicas, the first kept on a tie
            first_pick = int(picks[i] * len(serving))
            other = int(seconds[i] * (len(serving) - 1))
            pair = (serving[first_pick], serving[other + (other >= first_pick)])
            for r in pair:
                r.advance_to(t)
            rep = min(pair, key=lambda r: r.outstanding)
        else:
            for r in serving:
                r.advance_to(t)
            rep = min(serving, key=lambda r: r.outstanding)
        rep.arrive(i, t)
        node_of[i] = node_index[id(rep)]
        if on_progress is not None and i % progress_every == 0:
            on_progress(i)
    # After the last arrival: the policy keeps running until the window ends, then everything drains.
    events_until(span_s)
    bring_up(span_s)
    for rep in serving:
        rep.advance_to(math.inf)
    if held and starting:
        bring_up(math.inf)
        for rep in serving:
            rep.advance_to(math.inf)
    record(span_s)

    first[:] = first_list
    finish[:] = finish_list
    first += overhead
    finish += overhead
    done = ~np.isnan(finish)
    status[done] = SERVED
    if front_door is not None:
        status[done & front_door.late(arrival_s, first, finish)] = TIMED_OUT
    if aborted_at:
        status[np.fromiter(aborted_at, dtype=np.int64, count=len(aborted_at))] = TIMED_OUT
    for i, node in (enumerate(node_of) if reclaimed_at else ()):
        if i in aborted_at and aborted_at[i] <= reclaimed_at.get(node, -math.inf):
            continue                         # its client had gone before EC2 took the node
        if node in reclaimed_at and not finish_list[i] <= reclaimed_at[node]:
            status[i] = INTERRUPTED          # still queued or running when EC2 took the node back
            first[i] = finish[i] = math.nan
    if on_progress is not None:
        on_progress(n)
    caches = [inst.replica.prefix_cache for inst in instances if inst.replica is not None]
    return FleetRun(first, finish, status, instances, timeline, decisions, interruptions,
                    hit_summary(caches) if prefix is not None else None)
