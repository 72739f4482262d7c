"""The agent's small registry of actions, the planner's prompt, and how a plan is read.

Each action takes the question and the previous action's result (the chain's context) and
gives its own result; model actions make one call to the rung, ``retrieve`` searches the
documents. An action with nothing to work on is skipped with a reason, never silently.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from options.core import BadInput

SYSTEM_PROMPT = ("You are a knowledge agent. Work only from the context you are given, and say so when it "
                 "does not hold the answer.")


@dataclass(frozen=True)
class Action:
    name: str
    what: str                    # one line, for the planner and --help
    uses_model: bool
    needs: str                   # "question" | "passages" | "context" (the previous result)
    instruction: str = ""        # what a model action asks for
    aliases: tuple[str, ...] = ()


ACTIONS: dict[str, Action] = {a.name: a for a in (
    Action("retrieve", "find the passages of the documents closest to the question (embeddings)",
           uses_model=False, needs="question", aliases=("search", "embed", "lookup")),
    Action("summarise", "summarise what the retrieved passages say about the question", uses_model=True,
           needs="passages", instruction="Summarise what these passages say about the question.\nSummary:",
           aliases=("summarize", "summary")),
    Action("analyse", "answer the question from the previous result", uses_model=True, needs="context",
           instruction="Answer the question from this context, citing the passages you used.\nAnswer:",
           aliases=("analyze", "analysis", "answer")),
)}
DEFAULT_PLAN = ("retrieve", "summarise", "analyse")
PLAN_MAX_TOKENS = 24


def planner_prompt(question: str) -> str:
    listed = "\n".join(f"- {a.name}: {a.what}" for a in ACTIONS.values())
    return (f"Actions:\n{listed}\n\nQuestion: {question}\n"
            "List the actions to run, in order, separated by commas.\nPlan:")


def plan_tools() -> list[dict]:
    """The registry's actions as OpenAI function tools: a planner that can call tools plans by
    calling them, in order (``tool_choice: required`` makes its answer a list of calls)."""
    return [{"type": "function", "function": {
        "name": a.name, "description": a.what,
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}
        for a in ACTIONS.values()]


def read_tool_plan(calls: list[dict]) -> list[str]:
    """The actions a planner's tool calls name, in their order, once each."""
    plan: list[str] = []
    for call in calls:
        name = call.get("name")
        if name in ACTIONS and name not in plan:
            plan.append(name)
    return plan


def read_plan(text: str) -> list[str]:
    """The registry's actions a planner's answer names, in the order it names them, once each."""
    names = {alias: a.name for a in ACTIONS.values() for alias in (a.name, *a.aliases)}
    plan: list[str] = []
    for word in re.findall(r"[a-z]+", text.lower()):
        name = names.get(word)
        if name and name not in plan:
            plan.append(name)
    return plan


def parse_actions(spec: str) -> list[str]:
    """``--actions retrieve,analyse``: every name must be in the registry."""
    plan = [s.strip().lower() for s in spec.split(",") if s.strip()]
    unknown = [s for s in plan if s not in ACTIONS]
    if unknown or not plan:
        raise BadInput(f"--actions {spec!r}: {'unknown action ' + ', '.join(map(repr, unknown)) if unknown else 'empty'}; "
                       f"choose from {', '.join(ACTIONS)} (comma-separated, in order), e.g. "
                       f"--actions {','.join(DEFAULT_PLAN)}")
    return plan


def model_prompt(action: Action, question: str, context: str) -> str:
    label = "Passages" if action.needs == "passages" else "Context (from the previous step)"
    return f"Question: {question}\n\n{label}:\n{context}\n\n{action.instruction}"
