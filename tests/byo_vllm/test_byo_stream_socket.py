"""Which streams the engine's loop thread writes itself, and the socket option every stream
gets: checked on real TCP sockets, without an engine."""
from __future__ import annotations

import socket
import sys

import pytest
from flask import Flask

from options.local_server import SERVE_SCRIPT

sys.path.insert(0, str(SERVE_SCRIPT.parent))
from byo_vllm.routes import _stream_socket  # noqa: E402


@pytest.fixture
def server_side_socket():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    try:
        yield accepted
    finally:
        for s in (accepted, client, listener):
            s.close()


def _nodelay(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


@pytest.mark.parametrize("protocol,relayed", [("HTTP/1.1", True), ("HTTP/1.0", False)])
def test_http_1_1_streams_are_relayed_and_every_stream_gets_nodelay(server_side_socket,
                                                                    protocol, relayed):
    assert _nodelay(server_side_socket) == 0
    app = Flask(__name__)
    with app.test_request_context("/v1/completions", method="POST", environ_overrides={
            "SERVER_PROTOCOL": protocol, "gunicorn.socket": server_side_socket}):
        chosen = _stream_socket()
    assert (chosen is server_side_socket) is relayed
    assert _nodelay(server_side_socket) != 0


def test_no_relay_outside_gunicorn():
    app = Flask(__name__)
    with app.test_request_context("/v1/completions", method="POST",
                                  environ_overrides={"SERVER_PROTOCOL": "HTTP/1.1"}):
        assert _stream_socket() is None
