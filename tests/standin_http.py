"""Small real HTTP servers that stand in for a rung in tests that are about the client: served
from a thread on 127.0.0.1, answering completions as the server does, in SSE."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

from options.contract import StreamEvent, Usage, sse_stream


# Words the agent tests' documents and questions use: enough for a scripted embedding to rank them.
VOCABULARY = ("level", "lmi", "batch", "tensor", "bedrock", "token", "configure", "image")


def keyword_vector(text: str) -> list[float]:
    """A scripted embedding: how often each vocabulary word occurs in ``text``."""
    return [float(text.lower().count(w)) for w in VOCABULARY]


def stream_completion(handler: BaseHTTPRequestHandler, words: list[str], input_tokens: int) -> None:
    """Answer with ``words`` as an OpenAI completions stream, usage last."""
    events = [StreamEvent("text", text=w) for w in words]
    events.append(StreamEvent("usage", usage=Usage(input_tokens, len(words))))
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.end_headers()
    for chunk in sse_stream(events, "openai-completions"):
        handler.wfile.write(chunk)


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler],
            server_class: type[ThreadingHTTPServer] = ThreadingHTTPServer) -> Iterator[str]:
    """The handler's server on a free port while the block lasts; yields its URL."""
    server = server_class(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
