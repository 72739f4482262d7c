"""What the deploy CLI and the rungs print: plans as tables, answers with their timings, and
JSON for machines. Human text goes to stdout, or to stderr when ``--json`` owns stdout."""
from __future__ import annotations

import json
import sys
from typing import Any, Callable

from options.core import mask_secrets, mask_secrets_text
from options.plan import Plan
from options.sagemaker.plan import main_param


Progress = Callable[[str], None]
# Progress goes to stdout, or to stderr when --json owns stdout. A flag, not a stream object:
# the stream is looked up at each print, so a replaced sys.stdout/stderr is always honoured.
_progress_to_stderr = False


def progress_to_stderr(on: bool) -> None:
    global _progress_to_stderr
    _progress_to_stderr = on


def say(text: str) -> None:
    print(text, file=sys.stderr if _progress_to_stderr else sys.stdout, flush=True)


class Console:
    """Human output goes to stdout, or to stderr when --json owns stdout."""

    def __init__(self, json_mode: bool):
        self.json_mode = json_mode
        self.stream = sys.stderr if json_mode else sys.stdout

    def __call__(self, text: str = "") -> None:
        print(text, file=self.stream, flush=True)



def print_plan(plan: Plan, say: Console, rung_name: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=say.stream, highlight=False,
                      width=None if say.stream.isatty() else 120)  # pipes: no wrapping at 80
    console.print(f"[bold]Level {plan.level} — {rung_name}[/bold]: what --target aws would send "
                  f"(nothing is sent)")
    table = Table()
    for col in ("#", "request", "resource"):
        table.add_column(col)
    uploads = [s for s in plan.steps if s.operation == "PutObject"]
    for i, step in enumerate(plan.steps, 1):
        if step.operation == "PutObject" and len(uploads) > 3 and step is not uploads[0]:
            continue  # one row stands for a folder's uploads
        resource = main_param(step) or _summary(step.params)
        if step.operation == "PutObject" and len(uploads) > 3:
            resource = f"{len(uploads)} files to s3://{step.params['Bucket']}/{step.params['Key'].rsplit('/', 1)[0]}/"
        table.add_row(str(i), f"{step.service}.{step.operation}", resource)
    console.print(table)
    for step in plan.steps:
        if step.operation == "CreateModel":
            container = mask_secrets(step.params["PrimaryContainer"])
            console.print(f"image: {container['Image']}")
            env = container.get("Environment") or {}
            if env:
                console.print("environment:")
                for k, v in env.items():
                    console.print(f"  {k}={v}")
            if "ModelDataSource" in container or "ModelDataUrl" in container:
                console.print(f"artifacts: {container.get('ModelDataUrl') or container['ModelDataSource']['S3DataSource']['S3Uri']}")
        if step.operation == "CreateEndpointConfig":
            v = step.params["ProductionVariants"][0]
            timeout = v.get("ContainerStartupHealthCheckTimeoutInSeconds")
            console.print(f"instances: {v['InitialInstanceCount']} × {v['InstanceType']}"
                          + (f"; start-up health check timeout {timeout} s" if timeout else ""))
    if plan.extra.get("serving_properties"):
        console.print("equivalent serving.properties:")
        for line in mask_secrets_text(plan.extra["serving_properties"]).splitlines():
            console.print(f"  {line}")
    if plan.cost:
        c = plan.cost
        console.print(f"cost: ${c.get('hourly_usd', 0):,.3f}/hour, ${c.get('monthly_usd', 0):,.0f}/month "
                      f"({c.get('count', 1)} × {c.get('instance_type')}, {c.get('platform')}; "
                      f"prices as of {c.get('price_as_of')})" if "hourly_usd" in c else f"cost: {c}")
    for note in plan.notes:
        console.print(f"note: {note}")
    console.print("(--plan --json prints every request in full)")


def _summary(params: dict[str, Any]) -> str:
    text = json.dumps(mask_secrets(params), default=str)
    return text if len(text) < 90 else text[:87] + "..."


def emit(data: Any, say: Console, title: str) -> None:
    if say.json_mode:
        print(json.dumps(mask_secrets(data), indent=2, default=str))
        return
    say(title)
    for key, value in (data.items() if isinstance(data, dict) else enumerate(data)):
        say(f"  {key}: {value}" if isinstance(data, dict) else f"  {value}")


def format_answer(result, say: Console, where: str) -> dict[str, Any]:
    t = result.timings
    ttft = f"{t.ttft_s * 1000:.0f} ms" if t.ttft_s is not None else "n/a (not streamed)"
    e2e = f"{t.e2e_s * 1000:.0f} ms" if t.e2e_s is not None else "n/a"
    say(f"answer ({where}): {result.text!r}")
    say(f"  TTFT {ttft} · end to end {e2e} · {result.usage.output_tokens or '?'} output tokens"
        f" · finish: {result.finish_reason}")
    return {"text": result.text, "finish_reason": result.finish_reason,
            "usage": result.usage.to_json(), "timings": t.to_json()}


def print_log_tail(path: str, say: Console, lines: int = 30) -> None:
    try:
        with open(path, errors="replace") as f:
            tail = f.readlines()[-lines:]
    except OSError:
        return
    say(f"last lines of {path}:")
    for line in tail:
        say("  " + line.rstrip())
