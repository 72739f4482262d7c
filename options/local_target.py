"""The ``local`` target: start the bring-your-own server with a rung's configuration and send it
one sample request, or, for a rung that cannot serve here, show its plan and cost and say why."""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from options.core import rung
from options.output import Console, format_answer, print_log_tail, print_plan
from options.plan import Plan

DEFAULT_PROMPT = "Explain in one sentence what a GPU does."


def sample_request(args):
    from options.contract import Request

    return Request(prompt=args.invoke or DEFAULT_PROMPT, max_tokens=args.max_tokens,
                   temperature=args.temperature, stream=args.stream)


def print_local_only(plan: Plan, args: argparse.Namespace, why: str) -> int:
    """Levels that can't serve on this machine: show their plan and cost, and say so."""
    say = Console(args.json)
    if args.json:
        print(json.dumps({**plan.to_json(), "runs_locally": False, "why": why}, indent=2, default=str))
        return 0
    say(f"Level {plan.level} needs the cloud: {why}")
    say("Here is what --target aws would create, and what it costs:")
    print_plan(plan, say, rung(plan.level).name)
    return 0


def announce_model(source, say: Console) -> None:
    if source.tiny:
        say("model: the built-in tiny model. Its weights are RANDOM: it exercises the serving path "
            "(engine, batching, streaming), not answer quality. Use --model for a real one.")
    else:
        say(f"model: {source.label}")


def send_sample(url: str, args: argparse.Namespace, level: int, source, say: Console,
                summary: dict[str, Any]) -> None:
    """One sample request in the rung's dialect to ``url``/invocations, streamed; its answer
    goes into ``summary``."""
    from options.contract import Request, collect, invoke_http

    dialect = rung(level).can.dialect
    request = sample_request(args)
    # Streaming measures TTFT; random weights often stop at once, so the tiny model's sample
    # ignores end-of-sequence and generates --max-tokens, exercising batching and streaming.
    streamed = Request(**{**request.__dict__, "stream": True, "ignore_eos": source.tiny})
    say(f"sample request ({dialect} dialect, POST /invocations): {request.prompt!r}")
    t0 = time.perf_counter()
    events = []
    for event in invoke_http(url, streamed, dialect, path="/invocations"):
        events.append(event)
        if args.stream and event.kind == "text" and not args.json:
            print(event.text, end="", flush=True)
    if args.stream and not args.json:
        print()
    summary["answer"] = format_answer(collect(events, t0), say, "random weights" if source.tiny
                                       else source.label)


def wait_for_ctrl_c(say: Console, alive=lambda: True) -> None:
    """Returns on Ctrl-C (or SIGTERM), or once ``alive()`` is false. Both signals are set to
    stop it here: a command started in the background by a non-interactive shell inherits
    SIGINT ignored, and would otherwise serve on through the Ctrl-C it says stops it."""
    import signal

    def stop(*_):
        raise KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, stop)
    try:
        while alive():
            time.sleep(1)
    except KeyboardInterrupt:
        say("\nstopping (Ctrl-C)")


def serve_rung_locally(level: int, local_server, args: argparse.Namespace, source) -> int:
    """``run_local`` of a rung that serves here: its ``local_server(spec)`` gives the server's
    environment (held for as long as the server runs) and what it runs."""
    with local_server as (env, what):
        return serve_locally(env, args, level=level, what=what, source=source)


def serve_locally(env: dict[str, str], args: argparse.Namespace, *, level: int, what: str,
                  source) -> int:
    """Start the bring-your-own server with ``env``, send one sample in the rung's dialect, then
    serve until Ctrl-C."""
    from options.local_server import LocalServer

    say = Console(args.json)
    say(f"Level {level} — {rung(level).name}, on this machine: {what}")
    announce_model(source, say)
    log_dir = os.path.join(os.environ.get("SPECTRUM_CACHE", os.path.expanduser("~/.cache/spectrum")), "logs")
    os.makedirs(log_dir, exist_ok=True)
    log_path = os.path.join(log_dir, f"deploy-level{level}-{int(time.time())}.log")
    summary: dict[str, Any] = {"level": level, "target": "local", "model": source.label}
    server = LocalServer(env, port=args.port, log_path=log_path)
    try:
        server.start()
        say(f"starting the server on {server.url} (log: {log_path})")
        last = {"state": None, "t": -10.0}

        def progress(elapsed: float, state: str) -> None:
            if state != last["state"] or elapsed - last["t"] >= 10:
                say(f"  waiting for /ping: {state} ({elapsed:.0f} s)")
                last.update(state=state, t=elapsed)
        started = time.monotonic()
        server.wait_ready(600, on_progress=progress)
        summary["ready_s"] = round(time.monotonic() - started, 1)
        say(f"ready after {summary['ready_s']} s: GET {server.url}/ping → 200")

        send_sample(server.url, args, level, source, say, summary)
        if args.once:
            summary["stopped"] = "after the sample (--once)"
        else:
            say(f"serving on {server.url}: POST /invocations (also /v1/completions and "
                f"/v1/chat/completions); Ctrl-C to stop")
            say(f"  try: curl -s {server.url}/invocations -H 'Content-Type: application/json' "
                f"-d '{{\"inputs\": \"Hello\", \"parameters\": {{\"max_new_tokens\": 32}}}}'")
            wait_for_ctrl_c(say, lambda: server.process.poll() is None)
            if server.process.poll() is not None:
                raise RuntimeError(f"the server exited with code {server.process.returncode}")
    except Exception as exc:
        say(f"error: the local server failed: {exc}")
        if "server log" not in str(exc):
            print_log_tail(log_path, say)
        return 1
    finally:
        server.stop()
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    return 0
