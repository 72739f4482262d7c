"""A scripted rung for the agent's tests: an OpenAI-completions server (stdlib HTTP, streaming
through the contract's own SSE writer) that answers the planner with a plan and every other
call with a fixed text, and keeps the prompts it was sent."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from options.contract import OpenAICompletions, StreamEvent, Usage, sse_stream


class ScriptedRung(BaseHTTPRequestHandler):
    plan = "retrieve, summarize, analyze"
    answer = "The rolling batch size and the tensor parallel degree."
    prompts: list[str] = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        req = OpenAICompletions().from_wire(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        ScriptedRung.prompts.append(req.prompt)
        text = ScriptedRung.plan if req.prompt.rstrip().endswith("Plan:") else ScriptedRung.answer
        words = text.split(" ")
        events = [StreamEvent("text", text=w + (" " if i < len(words) - 1 else "")) for i, w in enumerate(words)]
        events.append(StreamEvent("usage", usage=Usage(len(req.prompt.split()), len(words))))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for chunk in sse_stream(events, "openai-completions"):
            self.wfile.write(chunk)


@pytest.fixture
def scripted_rung():
    ScriptedRung.plan, ScriptedRung.prompts = "retrieve, summarize, analyze", []
    ScriptedRung.answer = "The rolling batch size and the tensor parallel degree."
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedRung)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield ScriptedRung, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture
def docs(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "lmi.md").write_text(
        "# Level 3\n\nLevel 3 configures the LMI container with OPTION variables: the rolling batch size, "
        "the tensor parallel degree and the maximum model length.\n\nIts image comes from AWS.\n")
    (folder / "bedrock.txt").write_text("Bedrock bills per token and creates nothing in your account.\n")
    (folder / "notes.bin").write_text("not a document")
    return folder
