"""A client that hangs up mid-stream, and the check that the server then stops the request in
the engine and counts it (``byo_requests_aborted_total``): shared by the plain server's tests and
the Ray Serve application's (tests/ray_serve), which serve the same App."""
from __future__ import annotations

import json
import socket
from typing import Callable
from urllib.parse import urlsplit


def start_stream_and_hang_up(url: str, body: bytes, path: str = "/v1/completions") -> None:
    """Sends a streaming request on a raw socket, reads three events, then closes."""
    where = urlsplit(url)
    client = socket.create_connection((where.hostname, where.port), timeout=10)
    client.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
    received = b""
    while received.count(b"data: ") < 3:
        received += client.recv(4096)
    assert received.startswith(b"HTTP/1.1 200"), received[:200]   # streaming: it is running
    client.close()                                   # the client goes away mid-stream


def assert_hang_up_is_aborted(url: str, metric: Callable[[str], float], max_tokens: int,
                              wait_for, path: str = "/v1/completions") -> float:
    """A hung-up stream of ``max_tokens`` stops short in the engine, and the server counts the
    abort; the tokens the engine generated for it. ``metric(name)`` reads the server's
    /metrics.

    The server can only notice a client that left while the engine is still generating. If
    this process is descheduled for the whole answer (seconds, on a loaded shared machine) the
    engine finishes first and the attempt proves nothing either way: it is tried again. A
    server that never aborts fails every attempt. How far the engine got is no measure of the
    server: the hang-up itself can come seconds late here."""
    body = json.dumps({"prompt": "A long answer", "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": True}).encode()
    for _attempt in range(3):
        generated_before = metric("vllm:generation_tokens_total")
        aborted_before = metric("byo_requests_aborted_total")
        start_stream_and_hang_up(url, body, path)
        # Generous limits: the waits end as soon as they hold, and a loaded CI machine is slow.
        wait_for(lambda: metric("vllm:num_requests_running") == 0, 60,
                 "the engine to drop or finish the request")
        generated = metric("vllm:generation_tokens_total") - generated_before
        if generated < max_tokens:
            break
    assert generated < max_tokens, f"the engine generated the whole answer ({generated} tokens)"
    wait_for(lambda: metric("byo_requests_aborted_total") == aborted_before + 1, 60,
             "the server to count the abort")
    return generated
