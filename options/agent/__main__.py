"""python -m options.agent: the knowledge agent on any rung, every call traced.

    python -m options.agent --level 5 --docs examples/agent-docs/ --question "What does level 3 configure?"
    python -m options.agent --level 1 --target aws --docs examples/agent-docs/ --question "..." --trace trace.json
    python -m options.agent --level 3 --target aws --endpoint my-endpoint --instance ml.g5.xlarge --docs examples/agent-docs/ --question "..."
    python -m options.agent --level 5 --url http://127.0.0.1:8080 --actions retrieve,analyse --docs examples/agent-docs/ --question "..."
    python -m options.agent --level 1 --target aws --embeddings-url http://127.0.0.1:8081 --docs examples/agent-docs/ --question "..."

It plans (one call choosing actions from a small registry), retrieves passages of the documents
by embeddings (the server's POST /v1/embeddings when it answers, else a local embedding the
trace names), then runs each action on the previous one's result, and prints the plan, every
call (endpoint, tokens in/out, TTFT, end-to-end, cost) and the task's totals. `--trace FILE`
writes them as JSON, also when the task fails (with the error and the calls made until then);
`python -m cost agent --trace FILE` prices it on every rung.

Exit codes: 0 answered, 2 bad input (no documents, every action skipped, an unknown action),
1 failure (the rung did not answer, or answered nothing).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from options.core import BadInput, exit_code

EXAMPLES = __doc__.split("\n\n")[1]


def build_parser(prog: str = "python -m options.agent") -> argparse.ArgumentParser:
    from options.agent.actions import ACTIONS, DEFAULT_PLAN
    from options.core.wire import DIALECTS

    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0],
                                epilog="examples:\n" + EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--level", type=int, required=True, help="the rung (1-6) the agent's calls go to")
    p.add_argument("--target", choices=("local", "emulator", "aws"), default="local")
    p.add_argument("--docs", required=True, metavar="FOLDER", help="the documents to answer from (.md, .txt, .rst)")
    p.add_argument("--question", required=True)
    p.add_argument("--trace", metavar="FILE", help="write the plan, every call and the totals here as JSON")
    p.add_argument("--json", action="store_true", help="print the trace as JSON instead of tables")
    p.add_argument("--actions", metavar="A,B,...",
                   help=f"run these actions instead of asking the model for a plan; from: "
                        f"{', '.join(f'{a.name} ({a.what})' for a in ACTIONS.values())}; default plan "
                        f"{','.join(DEFAULT_PLAN)}")
    p.add_argument("--max-tokens", type=int, default=128, help="output tokens per action call (128)")
    p.add_argument("--top-k", type=int, default=3, help="passages retrieved (3)")
    where = p.add_argument_group("where the rung is")
    where.add_argument("--url", help="base URL of a running server for this rung (skips starting one)")
    where.add_argument("--embeddings-url", metavar="URL",
                       help="an OpenAI embeddings server for retrieval (POST URL/v1/embeddings), e.g. the "
                            "bring-your-own server with SM_VLLM_RUNNER=pooling; default: the rung's own server "
                            "when it is one (--url, --target local), falling back to a local embedding")
    where.add_argument("--endpoint", help="SageMaker endpoint name (levels 2-5 with --target emulator|aws)")
    where.add_argument("--model", help="Bedrock model id (level 1), the model a started server loads, or the "
                       "model name a --url server expects")
    where.add_argument("--dialect", choices=[d for d in DIALECTS if d != "bedrock"],
                       help="request dialect (default: the rung's own)")
    where.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                       help="with --target local: the rung's engine option, as python -m options.deploy takes it")
    where.add_argument("--instance", metavar="TYPE",
                       help="price each self-hosted call's instance time at this instance's hourly price")
    where.add_argument("--region", default="us-east-1")
    where.add_argument("--endpoint-url", help="AWS endpoint override (an emulator's URL)")
    where.add_argument("--timeout", type=float, default=300, help="per-call timeout in seconds (300)")
    return p


def main(argv: list[str] | None = None, prog: str = "python -m options.agent") -> int:
    args = build_parser(prog).parse_args(argv)
    from rich.console import Console

    console = Console(stderr=args.json, highlight=False)
    try:
        return _run(args, console)
    except BaseException as exc:  # noqa: BLE001 - exit_code re-raises what is not ours
        return exit_code(exc, console.print)


def _run(args: argparse.Namespace, console) -> int:
    from options.agent.actions import parse_actions
    from options.agent.retrieval import ServedEmbeddings, read_passages
    from options.agent.run import Trace, open_index, run_agent
    from options.agent.target import open_model

    for name, value, low in (("--max-tokens", args.max_tokens, 1), ("--top-k", args.top_k, 1)):
        if value < low:
            raise BadInput(f"{name} {value} must be at least {low}")
    actions = parse_actions(args.actions) if args.actions else None
    trace = Trace(args.question)
    about = {"level": args.level, "target": args.target, "model": args.model, "endpoint": None, "cost_basis": ""}
    try:
        passages = read_passages(args.docs)
        with open_model(args, console.print) as model:
            about.update(model=model.model, endpoint=model.endpoint, cost_basis=model.cost_basis)
            if args.embeddings_url:
                model.embedder = ServedEmbeddings(args.embeddings_url, None, args.timeout)
            index = open_index(passages, model)
            console.print(f"indexed {len(passages)} passages from {index.documents} documents in {args.docs} "
                          f"with {index.embedder.name}" + (f" ({index.fallback})" if index.fallback else ""))
            run_agent(args.question, index, model, actions=actions, max_tokens=args.max_tokens, top_k=args.top_k,
                      trace=trace, on_call=lambda c: console.print(
                          f"  call {c.role}: {c.input_tokens} → {c.output_tokens} tokens, "
                          f"TTFT {_ms(c.ttft_ms)}, E2E {_ms(c.e2e_ms)}"))
    except BaseException as exc:
        if args.trace and isinstance(exc, (Exception, KeyboardInterrupt)):
            # The failed task's trace: the calls made until it failed, and why it failed.
            trace.error = {"kind": "bad input" if isinstance(exc, BadInput) else
                           "interrupted" if isinstance(exc, KeyboardInterrupt) else "failure",
                           "type": type(exc).__name__, "message": str(exc)}
            try:
                _write_trace(args.trace, trace.to_json(**about))
            except BadInput as unwritable:
                console.print(f"note: {unwritable}")
            else:
                console.print(f"the trace of the failed task is in {args.trace}")
        raise
    doc = trace.to_json(**about)
    if args.trace:
        _write_trace(args.trace, doc)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        console.print(render(doc))
    return 0


def _write_trace(path: str, doc: dict[str, Any]) -> None:
    try:
        Path(path).write_text(json.dumps(doc, indent=2) + "\n")
    except OSError as exc:
        raise BadInput(f"--trace {path!r} cannot be written: {exc.strerror}") from None


def _ms(x: float | None) -> str:
    return "?" if x is None else f"{x:,.0f} ms"


def _usd(x: float | None) -> str:
    return "—" if x is None else f"${x:.6f}"


def render(doc: dict[str, Any]):
    from rich.console import Group
    from rich.table import Table

    plan = doc["plan"]
    steps = "; ".join(f"{s['action']}: {s['result'] if s['ran'] else 'skipped, ' + s['why']}" for s in doc["steps"])
    hits = ", ".join(f"{h['passage']} ({h['score']:.2f})" for h in doc["retrieval"]["hits"]) or "none"
    head = Table(show_header=False, box=None)
    head.add_row("plan", f"{' → '.join(plan['actions'])}  ({_printable(plan['source'])})")
    head.add_row("steps", steps)
    fallback = doc["retrieval"].get("fallback")
    head.add_row("retrieved", f"{hits}  ({doc['retrieval']['method']}"
                 + (f": the fallback, since {fallback})" if fallback else ")"))
    calls = Table(title=f"level {doc['level']} · {doc['target']} · {doc['endpoint']}")
    for col in ("#", "role", "tokens in", "tokens out", "TTFT", "E2E", "cost"):
        calls.add_column(col, justify="left" if col == "role" else "right")
    for k, c in enumerate(doc["calls"], 1):
        calls.add_row(str(k), c["role"], str(c["input_tokens"]), str(c["output_tokens"]), _ms(c["ttft_ms"]),
                      _ms(c["e2e_ms"]), _usd(c["cost_usd"]))
    t = doc["totals"]
    calls.add_row("", "total", str(t["input_tokens"]), str(t["output_tokens"]), "", _ms(t["e2e_ms"]),
                  _usd(t["cost_usd"]), style="bold")
    tail = Table(show_header=False, box=None)
    tail.add_row("wall time", _ms(t["wall_ms"]))
    tail.add_row("cost", doc["cost_basis"])
    tail.add_row("answer", _printable(doc["answer"][:600]))
    return Group(head, calls, tail)


def _printable(text: str) -> str:
    # A random-weight model's text holds control characters: shown, not sent to the terminal.
    return "".join(ch if ch.isprintable() or ch == "\n" else "�" for ch in text)


if __name__ == "__main__":
    sys.exit(main())
