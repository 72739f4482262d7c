"""A scripted rung for the agent's tests: an OpenAI-completions server (stdlib HTTP, streaming
through the contract's own SSE writer) that answers the planner with a plan and every other
call with a fixed text (or HTTP 500 from ``fail_from`` calls on), and keeps the prompts it was sent. Its ``POST /v1/embeddings`` answers
as ``embeddings`` says: 404 (no such route, the default), 400 as the bring-your-own server does
for a model that does not pool, or OpenAI embeddings (a count of a few words per text)."""
from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import pytest
from standin_http import keyword_vector, serving, stream_completion

from options.contract import OpenAICompletions


class ScriptedRung(BaseHTTPRequestHandler):
    plan = "retrieve, summarize, analyze"
    answer = "The rolling batch size and the tensor parallel degree."
    prompts: list[str] = []
    embeddings = "404"                 # "404" | "400" | "served"
    fail_from: int | None = None       # completions from this many on answer HTTP 500
    embedded: list[list[str]] = []     # the inputs of each embeddings request

    def log_message(self, *a):
        pass

    def _json(self, status: int, doc: dict) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _embeddings(self, body: dict) -> None:
        if ScriptedRung.embeddings == "404":
            return self._json(404, {"detail": "Not Found"})
        if ScriptedRung.embeddings == "400":
            return self._json(400, {"error": {"message": "the model does not pool: /v1/embeddings needs "
                                              "SM_VLLM_RUNNER=pooling", "type": "BadRequestError"}})
        texts = body["input"]
        ScriptedRung.embedded.append(texts)
        rows = [{"object": "embedding", "index": i,
                 "embedding": keyword_vector(t)}
                for i, t in enumerate(texts)]
        tokens = sum(len(t.split()) for t in texts)
        self._json(200, {"object": "list", "data": rows[::-1], "model": "scripted",      # any order: by index
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/embeddings":
            return self._embeddings(body)
        req = OpenAICompletions().from_wire(body)
        if ScriptedRung.fail_from is not None and len(ScriptedRung.prompts) >= ScriptedRung.fail_from:
            return self._json(500, {"error": {"message": "the engine died"}})
        ScriptedRung.prompts.append(req.prompt)
        text = ScriptedRung.plan if req.prompt.rstrip().endswith("Plan:") else ScriptedRung.answer
        words = text.split(" ")
        stream_completion(self, [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)],
                          len(req.prompt.split()))


@pytest.fixture
def scripted_rung():
    ScriptedRung.plan, ScriptedRung.prompts = "retrieve, summarize, analyze", []
    ScriptedRung.embeddings, ScriptedRung.embedded, ScriptedRung.fail_from = "404", [], None
    ScriptedRung.answer = "The rolling batch size and the tensor parallel degree."
    with serving(ScriptedRung) as url:
        yield ScriptedRung, url


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
