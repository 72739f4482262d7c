"""One agent task: plan → chained actions → answer, every model call timed, counted and priced.

The model is reached through ``options.contract`` only (``Model.send`` is an
``invoke_http``, ``invoke_sagemaker`` or Bedrock ``converse_stream``), so the same task runs on
every rung and its trace compares them. Retrieval embeds with the rung's embeddings
(``Model.embedder``) when they answer; otherwise with the local fallback, and the trace says
which and why.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from options.agent.actions import (ACTIONS, DEFAULT_PLAN, PLAN_MAX_TOKENS, SYSTEM_PROMPT, model_prompt,
                                   plan_tools, planner_prompt, read_plan, read_tool_plan)
from options.agent.retrieval import Embedded, Embedder, EmbeddingsNotServed, HashedBagOfWords, Index, Passage
from options.contract import InvokeError, Request, Result, StreamEvent, Usage, collect
from options.core import BadInput

TRACE_SCHEMA = "spectrum.agent-trace/1"
# A tool-call plan is a JSON list of calls with no arguments: a few tokens each.
PLAN_TOOL_TOKENS = 96


class AgentFailed(RuntimeError):
    """The task ran but gave no answer (exit 1); the message says what to do."""


@dataclass
class Model:
    """How the agent reaches the rung, and how a call is priced."""
    send: Callable[[Request], Iterator[StreamEvent] | Result]
    endpoint: str                       # where calls go, for the trace
    model: str | None = None            # the model name requests carry (Bedrock, OpenAI servers)
    hourly_usd: float | None = None     # self-hosted: the instance's price, for instance time per call
    cost_basis: str = ""                # how cost_usd is reckoned, in words
    streams: bool = True                # False: one answer per call (no TTFT), e.g. on moto's SageMaker
    embedder: Embedder | None = None    # the rung's embeddings, tried before the local fallback
    no_embeddings: str = "the rung serves no embeddings route"    # why there is none to try
    # The target's dialect carries OpenAI tools (openai-chat): the planner then plans by tool
    # calls, and falls back to a text plan, saying why, where the server refuses them.
    tool_calls: bool = False

    def cost(self, usage: Usage, e2e_s: float | None) -> float | None:
        if usage.cost_usd is not None:                 # Bedrock: tokens × the price table
            return usage.cost_usd
        if self.hourly_usd is None or e2e_s is None:
            return None
        return self.hourly_usd * e2e_s / 3600


@dataclass
class Call:
    endpoint: str
    role: str
    input_tokens: int | None
    output_tokens: int | None
    ttft_ms: float | None
    e2e_ms: float | None
    cost_usd: float | None
    text: str = ""
    tool_calls: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "role": self.role, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens, "ttft_ms": self.ttft_ms, "e2e_ms": self.e2e_ms,
                "cost_usd": self.cost_usd, "text": self.text,
                **({"tool_calls": self.tool_calls} if self.tool_calls else {})}


def call_model(model: Model, role: str, prompt: str, max_tokens: int,
               tools: list[dict] | None = None) -> Call:
    """One streamed call; its TTFT and E2E measured from just before it is sent. With
    ``tools``, the model must answer by calling them (``tool_choice: required``)."""
    req = Request(prompt=prompt, system=SYSTEM_PROMPT, max_tokens=max_tokens, stream=model.streams,
                  model=model.model, tools=tools, tool_choice="required" if tools else None)
    started = time.perf_counter()
    answer = model.send(req)
    res = answer if isinstance(answer, Result) else collect(answer, started)
    # An answer with no text has no last token to time: its end-to-end is when the answer ended.
    e2e_s = res.timings.e2e_s if res.timings.e2e_s is not None else time.perf_counter() - started
    ttft_ms = None if res.timings.ttft_s is None else res.timings.ttft_s * 1000
    return Call(model.endpoint, role, res.usage.input_tokens, res.usage.output_tokens, ttft_ms, e2e_s * 1000,
                model.cost(res.usage, e2e_s), res.text, [dict(c) for c in res.tool_calls])


def embed_call(model: Model, index: Index, role: str, embedded: Embedded) -> Call:
    """A call to the rung's embeddings route: its input tokens, no output, no first token."""
    e2e_ms = None if embedded.e2e_s is None else embedded.e2e_s * 1000
    return Call(index.embedder.endpoint, role, embedded.input_tokens, 0, None, e2e_ms,
                model.cost(Usage(embedded.input_tokens, 0), embedded.e2e_s))


def open_index(passages: list[Passage], model: Model) -> Index:
    """Embed the passages with the rung's route if it serves one, else with the local fallback,
    which the index then names (``Index.fallback``) with the reason."""
    if model.embedder is not None:
        try:
            return Index.build(passages, model.embedder)
        except EmbeddingsNotServed as exc:
            why = str(exc)
    else:
        why = model.no_embeddings
    return Index.build(passages, HashedBagOfWords(), fallback=why)


def retrieval_about(index: Index, model: Model, top_k: int) -> dict[str, Any]:
    about: dict[str, Any] = {"method": index.embedder.name, "documents": index.documents,
                             "passages": len(index.passages), "top_k": top_k, "fallback": index.fallback,
                             "hits": []}
    if index.embedder.endpoint:       # indexing is before the task: its call is shown, not in calls
        about["indexing"] = embed_call(model, index, "index", index.indexing).to_json()
    return about


@dataclass
class Trace:
    question: str
    plan: list[str] = field(default_factory=list)
    plan_source: str = ""
    retrieval: dict[str, Any] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)     # each action: ran or skipped, why
    answer: str = ""
    wall_ms: float = 0.0
    error: dict[str, Any] | None = None     # why the task failed; the calls made until then stay

    def totals(self) -> dict[str, Any]:
        def total(key: str):
            values = [getattr(c, key) for c in self.calls]
            return None if not values or None in values else sum(values)
        return {"calls": len(self.calls), "input_tokens": total("input_tokens"),
                "output_tokens": total("output_tokens"), "e2e_ms": total("e2e_ms"),
                "cost_usd": total("cost_usd"), "wall_ms": self.wall_ms}

    def to_json(self, **about: Any) -> dict[str, Any]:
        return {"schema": TRACE_SCHEMA, **about, "question": self.question,
                "plan": {"actions": self.plan, "source": self.plan_source}, "retrieval": self.retrieval,
                "steps": self.steps, "calls": [c.to_json() for c in self.calls], "answer": self.answer,
                "totals": self.totals(), **({"error": self.error} if self.error else {})}


def run_agent(question: str, index: Index, model: Model, *, actions: list[str] | None = None,
              max_tokens: int = 128, top_k: int = 3, on_call: Callable[[Call], None] | None = None,
              trace: Trace | None = None) -> Trace:
    """Plan (unless ``actions`` is given), then run each action on the previous one's result.

    Pass ``trace`` to keep what was done when this raises: the calls made until then.
    """
    if not question.strip():
        raise BadInput("--question is empty: ask what the agent should answer from the documents")
    trace = trace if trace is not None else Trace(question)
    started = time.perf_counter()
    try:
        return _run(trace, index, model, actions, max_tokens, top_k, on_call)
    finally:
        trace.wall_ms = (time.perf_counter() - started) * 1000


def _run(trace: Trace, index: Index, model: Model, actions: list[str] | None, max_tokens: int, top_k: int,
         on_call: Callable[[Call], None] | None) -> Trace:
    question = trace.question

    def record(call: Call) -> Call:
        trace.calls.append(call)
        if on_call:
            on_call(call)
        return call

    if actions is not None:
        trace.plan, trace.plan_source = list(actions), "--actions"
    else:
        refused = None
        if model.tool_calls:
            try:
                planned = record(call_model(model, "plan", planner_prompt(question), PLAN_TOOL_TOKENS,
                                            tools=plan_tools()))
            except InvokeError as exc:
                if exc.status != 400:
                    raise
                refused = str(exc)[:200]
            else:
                trace.plan = read_tool_plan(planned.tool_calls)
                trace.plan_source = "the model's plan (tool calls)"
        if not model.tool_calls or refused is not None:
            planned = record(call_model(model, "plan", planner_prompt(question), PLAN_MAX_TOKENS))
            trace.plan = read_plan(planned.text)
            trace.plan_source = "the model's plan" + (
                f" (text: the target refused tool calls: {refused})" if refused else "")
        if not trace.plan:
            # A planner that names no known action would leave nothing to run: say so, run the default.
            trace.plan = list(DEFAULT_PLAN)
            trace.plan_source = (f"the default plan: the model's plan named no known action "
                                 f"({(planned.text.strip() or str(planned.tool_calls))[:80]!r})")
    trace.retrieval = retrieval_about(index, model, top_k)
    passages: list[str] = []
    context = ""
    for name in trace.plan:
        action = ACTIONS[name]
        if action.name == "retrieve":
            query = index.embedder.embed([question])
            if index.embedder.endpoint:
                record(embed_call(model, index, "embed", query))
            hits = index.nearest(query.vectors[0], top_k)
            trace.retrieval["hits"] = [{"passage": p.ref, "score": round(s, 4)} for p, s in hits]
            if not hits:
                trace.steps.append({"action": name, "ran": False,
                                    "why": "no passage shares a word with the question"})
                continue
            passages = [f"[{p.ref}] {p.text}" for p, _ in hits]
            context = "\n".join(passages)
            trace.steps.append({"action": name, "ran": True, "result": f"{len(hits)} passages"})
            continue
        given = "\n".join(passages) if action.needs == "passages" else context
        if not given:
            trace.steps.append({"action": name, "ran": False,
                                "why": "nothing retrieved to work on" if action.needs == "passages"
                                else "no earlier result to work from"})
            continue
        try:
            call = record(call_model(model, name, model_prompt(action, question, given), max_tokens))
        except Exception as exc:
            trace.steps.append({"action": name, "ran": False, "why": f"its call failed: {exc}"})
            raise
        context = call.text
        trace.steps.append({"action": name, "ran": True, "result": f"{len(call.text)} characters"})
    ran = [s for s in trace.steps if s["ran"]]
    if not ran:
        why = "; ".join(f"{s['action']}: {s['why']}" for s in trace.steps)
        raise BadInput(f"every action was skipped ({why}): ask about what the documents cover, "
                       "or add documents that cover the question")
    answering = [c for c in trace.calls if c.role != "plan"]
    if not answering:
        raise BadInput(f"the plan {', '.join(trace.plan)} ran no model action, so there is no answer: "
                       f"include summarise or analyse (e.g. --actions {','.join(DEFAULT_PLAN)})")
    trace.answer = answering[-1].text.strip()
    if not trace.answer:
        raise AgentFailed(f"the model's last call ({answering[-1].role}) returned no text, so the task has no "
                          "answer: check the model serves text (a larger --max-tokens, or another --model)")
    return trace
