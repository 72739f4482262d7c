"""The completion routes' ASGI ends, against a server's ``receive`` and ``send`` written here:
the disconnect watch (no task of its own), the body's limits, the answer's head, the writer
that sends a stream's chunks from a callback, and a settle that outlives a cancel."""
from __future__ import annotations

import asyncio

import pytest

from gateway_harness import GATEWAY_DIR  # noqa: F401   puts spectrum_gateway on sys.path
from spectrum_gateway.asgi import (Answer, read_body, request_headers, response_start,
                                   to_the_end, unless_client_leaves, writer)
from spectrum_gateway.errors import GatewayError


class Server:
    """``receive`` as uvicorn's works: it waits on an event for the next message."""

    def __init__(self, messages=()) -> None:
        self.messages = list(messages)
        self.event = asyncio.Event()
        self.bare_yields = 0

    def say(self, message: dict) -> None:
        self.messages.append(message)
        self.event.set()

    async def receive(self) -> dict:
        for _ in range(self.bare_yields):
            await asyncio.sleep(0)          # a bare yield, as some servers' receive has
        while not self.messages:
            self.event.clear()
            await self.event.wait()
        return self.messages.pop(0)


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("bare_yields", [0, 2])
def test_a_disconnect_cancels_the_work_where_it_waits(bare_yields):
    async def main():
        server = Server()
        server.bare_yields = bare_yields
        reached = []

        async def work():
            reached.append("started")
            await asyncio.sleep(30)
            reached.append("never")

        asyncio.get_running_loop().call_later(0.05, server.say, {"type": "http.disconnect"})
        left, result = await unless_client_leaves(server.receive, work)
        assert (left, result, reached) == (True, None, ["started"])
        assert asyncio.current_task().cancelling() == 0     # the task goes on, uncancelled
    run(main())


def test_other_messages_are_read_past_until_the_disconnect():
    async def main():
        server = Server([{"type": "http.request", "body": b"late", "more_body": True}])

        async def work():
            await asyncio.sleep(30)

        loop = asyncio.get_running_loop()
        loop.call_later(0.02, server.say, {"type": "http.request", "body": b"", "more_body": False})
        loop.call_later(0.05, server.say, {"type": "http.disconnect"})
        assert await unless_client_leaves(server.receive, work) == (True, None)
        assert server.messages == []
    run(main())


def test_work_that_ends_first_is_returned_and_the_watch_lets_go():
    async def main():
        server = Server()

        async def work():
            await asyncio.sleep(0.01)
            return "answer"

        assert await unless_client_leaves(server.receive, work) == (False, "answer")
        assert not server.event._waiters        # the watch's pending receive() was closed
        server.say({"type": "http.disconnect"})  # too late to matter: nothing is cancelled
        await asyncio.sleep(0.02)
    run(main())


def test_a_cancel_from_outside_is_not_taken_for_a_disconnect():
    async def main():
        server = Server()

        async def work():
            await asyncio.sleep(30)

        task = asyncio.ensure_future(unless_client_leaves(server.receive, work))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not server.event._waiters
    run(main())


def test_read_body_joins_chunks_and_refuses_past_the_limit():
    async def main():
        chunks = [{"type": "http.request", "body": b"ab", "more_body": True},
                  {"type": "http.request", "body": b"cd", "more_body": False}]
        assert await read_body(Server(chunks).receive, 4) == b"abcd"
        with pytest.raises(GatewayError) as too_big:
            await read_body(Server(chunks).receive, 3)
        assert too_big.value.status == 413 and "at most 3" in too_big.value.message
        with pytest.raises(GatewayError) as gone:
            await read_body(Server([chunks[0], {"type": "http.disconnect"}]).receive, 10)
        assert gone.value.status == 499
    run(main())


def test_headers_in_and_out():
    scope = {"headers": [(b"authorization", b"Bearer one"), (b"authorization", b"Bearer two"),
                         (b"x-stainless-os", b"Linux"), (b"x-session-id", b"s\xe9")]}
    assert request_headers(scope, frozenset({b"authorization", b"x-session-id"})) == {
        "authorization": "Bearer one", "x-session-id": "s\xe9"}
    start = response_start(429, {"Retry-After": "2", "x-request-id": "r1"}, b"application/json",
                           17)
    assert start == {"type": "http.response.start", "status": 429, "headers": [
        (b"content-type", b"application/json"), (b"content-length", b"17"),
        (b"retry-after", b"2"), (b"x-request-id", b"r1")]}

    sent = []

    async def send(message):
        sent.append(message)
    run(Answer(404, b'{"error":{}}', {"x-request-id": "r2"})(None, send))
    assert sent == [{"type": "http.response.start", "status": 404, "headers": [
        (b"content-type", b"application/json"), (b"content-length", b"12"),
        (b"x-request-id", b"r2")]}, {"type": "http.response.body", "body": b'{"error":{}}'}]


class FlowControlledSend:
    """``send`` as uvicorn's works: it waits for the client's buffer to drain while paused,
    after ``bare_yields`` bare yields; ``fail`` makes it raise."""

    def __init__(self, bare_yields: int = 0) -> None:
        self.writable = asyncio.Event()
        self.writable.set()
        self.sent: list[bytes] = []
        self.bare_yields = bare_yields
        self.fail: Exception | None = None
        self.closed_midway = 0

    async def __call__(self, message: dict) -> None:
        try:
            if not self.writable.is_set():
                for _ in range(self.bare_yields):
                    await asyncio.sleep(0)
                await self.writable.wait()
        except GeneratorExit:
            self.closed_midway += 1
            raise
        if self.fail is not None:
            raise self.fail
        self.sent.append(message["body"])


@pytest.mark.parametrize("bare_yields", [0, 2])
def test_writer_sends_at_once_or_hands_back_what_to_wait_on(bare_yields):
    async def main():
        send = FlowControlledSend(bare_yields)
        write = writer(send)
        assert write(b"one") is None and send.sent == [b"one"]      # sent inside the call
        send.writable.clear()                                       # the client stops reading
        held = write(b"two")
        assert held is not None and send.sent == [b"one"]
        asyncio.get_running_loop().call_later(0.05, send.writable.set)
        await held
        assert send.sent == [b"one", b"two"]
        send.fail = OSError("the client's socket broke")
        failed = write(b"three")
        with pytest.raises(OSError, match="socket broke"):
            await failed
        send.fail = None
        send.writable.clear()                                       # left waiting, then cancelled
        waiting = asyncio.ensure_future(write(b"four"))
        await asyncio.sleep(0.02)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return send
    send = run(main())
    assert send.sent == [b"one", b"two"] and send.closed_midway == 1


def test_to_the_end_runs_a_step_that_never_waits_in_place():
    async def settle():
        return "settled"

    async def main():
        before = len(asyncio.all_tasks())
        tasks_during = []

        async def step():
            tasks_during.append(len(asyncio.all_tasks()))
            return await settle()
        assert await to_the_end(step()) == "settled"
        return before, tasks_during
    before, during = run(main())
    assert during == [before]                  # no task was made for it


@pytest.mark.parametrize("waits_on", ["future", "bare yield"])
def test_to_the_end_finishes_a_step_that_waits_though_its_caller_is_cancelled(waits_on):
    async def main():
        steps = []
        gate = asyncio.get_running_loop().create_future()

        async def settle():
            steps.append("begun")
            if waits_on == "future":
                await gate                     # e.g. Redis's answer
            else:
                await asyncio.sleep(0)
                await asyncio.sleep(0.05)
            steps.append("ended")
            return "settled"

        caller = asyncio.ensure_future(to_the_end(settle()))
        await asyncio.sleep(0.01)
        caller.cancel()                        # the client hung up while it settles
        await asyncio.sleep(0.01)
        assert steps == ["begun"] and not caller.done()
        gate.set_result(None)
        with pytest.raises(asyncio.CancelledError):
            await caller                       # the cancel comes through once it has settled
        return steps
    assert run(main()) == ["begun", "ended"]
