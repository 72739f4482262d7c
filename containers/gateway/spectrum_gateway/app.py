"""The HTTP face: OpenAI's routes, each request walked through the path in order.

authenticate → tenant → read the body (413, 400) → model (404 unknown, 403 not allowed) →
quota (429) → route → call the upstream (falling back on failure) → meter.
The model is checked before the quota so a request that could never be served does not
use up the tenant's allowance.
"""
from __future__ import annotations

import itertools
import json
import logging
import math
import os
import time
import uuid
from contextlib import asynccontextmanager

import anyio
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from options.core.heap import freeze_start_up_heap

from . import meter
from .asgi import (Answer, Relay, read_body, request_headers, to_the_end,
                   unless_client_leaves)
from .auth import Authenticator, load_secret
from .config import GatewayConfig, Model, TenantLimits, load_config
from .errors import GatewayError, error_body
from .routing import Replicas, attempts
from .store import open_store
from .upstream import (OpenAIUpstreams, StreamBroken, StreamRefused, StreamTimeout,
                       UpstreamFailure, carries_usage, event_json, split_events)

CONFIG_ENV = "SPECTRUM_GATEWAY_CONFIG"
# An upstream's body ends right after its [DONE]; one that does not is not waited on for the
# whole read timeout, since the client's [DONE] is held until it does.
END_AFTER_DONE_S = 2.0
log = logging.getLogger("spectrum_gateway")


# The request headers the completion path reads: the credential (auth.presented_credential)
# and the session (session_of).
READ_HEADERS = frozenset({b"authorization", b"x-api-key", b"x-session-id"})


def _header_safe(text: str) -> str:
    return "".join(c if 32 <= ord(c) < 127 else " " for c in text)[:300]


async def close_upstream(response) -> None:
    """Close an upstream's answer. Where closing waits (a Bedrock stream closed in a thread) it
    is shielded, so a second cancellation cannot leave it open; an HTTP upstream's closes at
    once, and a shield costs ~12 µs a request."""
    if response.waits_to_close:
        with anyio.CancelScope(shield=True):
            await response.aclose()
    else:
        await response.aclose()


class Call:
    """One request's facts as the path learns them; becomes its ledger entry."""

    def __init__(self, request_id: str, tenant: str, key_id: str) -> None:
        self.started = time.perf_counter()
        self.request_id, self.tenant, self.key_id = request_id, tenant, key_id
        self.model: str | None = None
        self.upstream = None
        self.failures: list[UpstreamFailure] = []
        self.limits: TenantLimits | None = None      # set once tokens are reserved
        self.reserved_tokens = 0
        self.reserved_cost = 0.0
        self.prompt_estimate = 0
        self.stream = False
        self.session: str | None = None        # x-session-id, or the body's "user"
        self.replica: str | None = None        # which of the upstream's replicas answered
        self.routing: str | None = None        # how that replica was chosen

    def entry_and_deltas(self, status: int, usage: dict | None, streamed_chunks: int = 0):
        if usage:
            input_tokens = int(usage.get("prompt_tokens") or 0)
            output_tokens = int(usage.get("completion_tokens") or 0)
            source = "upstream"
        elif self.upstream is not None and (status < 400 or streamed_chunks):
            # No usage from the upstream (none sent, or the stream broke off before it): the
            # prompt estimate and one token per chunk the client received.
            input_tokens, output_tokens, source = self.prompt_estimate, streamed_chunks, "estimate"
        else:
            input_tokens = output_tokens = 0
            source = "none"
        cost = self.upstream.cost_usd(input_tokens, output_tokens) if self.upstream else 0.0
        entry = meter.ledger_entry(
            request_id=self.request_id, tenant=self.tenant, key_id=self.key_id, model=self.model,
            upstream=self.upstream.name if self.upstream else None,
            fallback_from=[f.upstream for f in self.failures], input_tokens=input_tokens,
            output_tokens=output_tokens, usage_source=source, status=status,
            latency_s=time.perf_counter() - self.started, stream=self.stream, cost_usd=cost,
            replica=self.replica, routing=self.routing)
        return entry, input_tokens + output_tokens - self.reserved_tokens, cost - self.reserved_cost


def estimate_prompt_tokens(body: dict) -> int:
    """A generous estimate (3 characters a token, plus each message's framing): reserved
    before the call, corrected by the upstream's own count after it."""
    chars = 0
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(str(part.get("text", ""))) for part in content if isinstance(part, dict))
        chars += 24
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        chars += len(prompt)
    elif isinstance(prompt, list):
        chars += sum(len(p) if isinstance(p, str) else 4 for p in prompt)
    return math.ceil(chars / 3)


def requested_max_tokens(body: dict, model: Model) -> int:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return model.default_max_tokens
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GatewayError(400, f"max_tokens must be a whole number >= 1, got {value!r}",
                           "invalid_max_tokens")
    n = body.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise GatewayError(400, f"n must be a whole number >= 1, got {n!r}", "invalid_n")
    return value * n


def session_of(headers: dict[str, str], body: dict) -> str | None:
    """The program a request belongs to: the ``x-session-id`` header, else OpenAI's ``user``."""
    session = headers.get("x-session-id") or body.get("user")
    if session is None or session == "":
        return None
    if not isinstance(session, str) or len(session) > 256:
        raise GatewayError(400, f"the session id (x-session-id or \"user\") must be a string of "
                                f"at most 256 characters, got {str(session)[:40]!r}",
                           "invalid_session")
    return session


class Gateway:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.store = open_store(config)
        self.auth = Authenticator(config, self.store, load_secret(config))
        self.upstreams = OpenAIUpstreams(config)
        self._managed = None
        self.inflight = 0
        # Request ids: this process's random half and a counter (uuid4 per request costs a
        # getrandom call); 32 hex digits like a uuid's.
        self._id_prefix, self._ids = uuid.uuid4().hex[:16], itertools.count()
        self._attempts: dict[tuple, tuple] = {}
        # (model, upstream) → its replicas, for upstreams with more than one URL.
        self.replicas = {(m.name, u.name): Replicas(u) for m in config.models.values()
                         for u in m.upstreams if len(u.urls) > 1}

    def attempts(self, model: Model, tenant: str) -> tuple:
        """``routing.attempts``, worked out once per (model, tenant): the config never changes
        in a running process, and the canary's hashing was a few percent of a request."""
        key = (model.name, tenant)
        order = self._attempts.get(key)
        if order is None:
            if len(self._attempts) >= 65536:       # tenants from JWTs are unbounded
                self._attempts.clear()
            order = self._attempts[key] = tuple(attempts(model, tenant))
        return order

    @property
    def managed(self):
        """Bedrock and SageMaker upstreams, built on first use (boto3 is slow to import)."""
        if self._managed is None:
            from .managed import ManagedUpstreams
            self._managed = ManagedUpstreams(self.config)
        return self._managed

    async def warm(self) -> None:
        """Heavy imports and connections at start-up, so the first requests are not slow."""
        await self.store.warm()
        if any(u.kind != "openai" for m in self.config.models.values() for u in m.upstreams):
            await anyio.to_thread.run_sync(self.managed.warm)

    async def close(self) -> None:
        await self.upstreams.close()
        await self.store.close()

    async def read_json(self, receive) -> tuple[dict, bytes]:
        """The body as a dict, and its bytes as sent."""
        raw = await read_body(receive, self.config.max_body_bytes)
        try:
            body = orjson.loads(raw)
        except ValueError as e:
            raise GatewayError(400, f"the request body is not valid JSON: {e}", "invalid_json")
        if not isinstance(body, dict):
            raise GatewayError(400, f"the request body must be a JSON object, got "
                                    f"{type(body).__name__}", "invalid_body")
        return body, raw

    async def finish(self, call: Call, status: int, usage: dict | None = None,
                     streamed_chunks: int = 0) -> None:
        entry, token_delta, cost_delta = call.entry_and_deltas(status, usage, streamed_chunks)
        await self.store.finish(call.limits, call.request_id, token_delta, cost_delta, entry,
                                meter.increments(entry))
        call.limits = None       # settled: never twice

    async def answer(self, scope: dict, receive, path: str) -> Answer | Relay:
        """A completion request's reply, to be called with ``(receive, send)``: the answer, or
        the error it met in OpenAI's shape."""
        try:
            return await self.completions(request_headers(scope, READ_HEADERS), receive, path)
        except GatewayError as e:
            return Answer.of_error(e)
        except Exception as e:
            return Answer.of_json(500, internal_error_body(e))

    async def completions(self, headers: dict[str, str], receive, path: str):
        request_id = f"{self._id_prefix}{next(self._ids):016x}"
        try:
            principal = await self.auth.authenticate(headers)
        except GatewayError as e:
            if e.status == 401:
                try:
                    await self.store.count({meter.sample("spectrum_gateway_auth_failures_total",
                                                         reason=e.code): 1})
                except GatewayError:
                    pass
            raise
        call = Call(request_id, principal.tenant, principal.key_id)
        try:
            return await self._serve(headers, receive, path, principal, call)
        except Exception as e:     # refused or failed: metered, and its reservation given back
            try:
                await self.finish(call, e.status if isinstance(e, GatewayError) else 500)
            except GatewayError:
                pass          # the store is down: the request was refused, nothing to meter
            if isinstance(e, GatewayError):
                e.headers.setdefault("x-request-id", request_id)
            raise

    async def _serve(self, headers: dict[str, str], receive, path: str, principal, call: Call):
        limits = self.config.tenant(principal.tenant)
        if limits is None:
            raise GatewayError(403, f"tenant {principal.tenant!r} is not configured and this "
                                    "gateway has no default tenant", "unknown_tenant")
        body, as_sent = await self.read_json(receive)
        name = body.get("model")
        if not isinstance(name, str) or not name:
            raise GatewayError(400, "the request names no model (\"model\": \"...\")",
                               "missing_model")
        call.model = name
        model = self.config.models.get(name)
        if model is None or not self.may_use(limits, principal, name):
            usable = ", ".join(self.models_allowed(limits, principal)) or "none"
            if model is None:
                raise GatewayError(404, f"model {name!r} does not exist; models you may use: "
                                        f"{usable}", "model_not_found")
            who = (f"API key {principal.key_id}" if principal.models is not None
                   and limits.allows(name) else f"tenant {principal.tenant!r}")
            raise GatewayError(403, f"{who} may not use model {name!r}; models you may use: "
                                    f"{usable}", "model_not_allowed")
        if not isinstance(body.get("stream_options") or {}, dict):
            raise GatewayError(400, f"stream_options must be an object such as "
                                    f"{{\"include_usage\": true}}, got {body['stream_options']!r}",
                               "invalid_stream_options")
        call.stream = bool(body.get("stream"))
        call.session = session_of(headers, body)
        order = self.attempts(model, principal.tenant)

        call.prompt_estimate = estimate_prompt_tokens(body)
        tokens = call.prompt_estimate + requested_max_tokens(body, model)
        cost = order[0].cost_usd(call.prompt_estimate, tokens - call.prompt_estimate)
        decision = await self.store.reserve(limits, call.request_id, tokens, cost)
        answer_headers = decision.headers()
        if not decision.allowed:
            raise GatewayError(429, decision.message(), f"rate_limit_{decision.reason}",
                               answer_headers)
        call.limits, call.reserved_tokens, call.reserved_cost = limits, tokens, cost
        answer_headers["x-request-id"] = call.request_id
        if model.priority.later_steps_first:
            body, as_sent = dict(body, priority=await self.program_priority(call, model)), None

        if call.stream:
            response = await self._open(call, order, body, path, answer_headers)
            if response.status_code < 400:
                want_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return Relay(RelayedStream(self, response, call, want_usage),
                             answer_headers)
            return await self._whole(response, call, answer_headers)

        async def whole():
            response = await self._open(call, order, body, path, answer_headers, as_sent)
            return await self._whole(response, call, answer_headers)
        return await self._whole_unless_client_leaves(receive, call, whole)

    async def program_priority(self, call: Call, model: Model) -> int:
        """vLLM's ``priority`` (lower goes first) from the session's attained count: a new
        program's first request gets 0 (vLLM's default), its k-th -(k-1), so a program
        already running goes before programs still to start. No session: 0."""
        if call.session is None:
            return 0
        earlier = await self.store.attained(call.tenant, call.session,
                                            model.priority.session_ttl_s)
        return -earlier

    async def _open(self, call: Call, order: tuple, body: dict, path: str, headers: dict,
                    as_sent: bytes | None = None):
        """The first upstream in ``order`` that answers; each failure noted in ``headers``.
        ``as_sent``, the client's own bytes of ``body``, goes as it is to an HTTP upstream that
        knows the model by the same name (encoding the body again was ~2 % of a request)."""
        response = None
        for upstream in order:
            if (as_sent is not None and not call.stream and upstream.kind == "openai"
                    and upstream.model in (None, call.model)):
                upstream_body = as_sent
            else:
                upstream_body = dict(body, model=upstream.model or call.model)
            if call.stream:   # ask for usage so the ledger has the upstream's own count
                upstream_body["stream_options"] = {**(body.get("stream_options") or {}),
                                                   "include_usage": True}
            replicas = self.replicas.get((call.model, upstream.name))
            try:
                if replicas is not None:
                    response = await self._open_replica(call, replicas, path, upstream_body)
                elif upstream.kind == "openai":
                    response = await self.upstreams.open(upstream, path, upstream_body)
                else:
                    response = await self.managed.open(upstream, path, upstream_body, call.model,
                                                       call.request_id)
                call.upstream = upstream
                break
            except UpstreamFailure as failure:
                log.warning("upstream %s", failure)
                call.failures.append(failure)
        if call.failures:
            headers["x-spectrum-fallback"] = _header_safe(
                "; ".join(f"{f.upstream} {f.kind}" + (f" {f.status}" if f.status else "")
                          for f in call.failures))
        if response is None:
            last = call.failures[-1]
            status = 429 if all(f.status == 429 for f in call.failures) else last.gateway_status
            raise GatewayError(status, f"every upstream of model {call.model!r} failed: " +
                               "; ".join(map(str, call.failures)),
                               "upstream_timeout" if status == 504 else "upstream_failed", headers)
        headers["x-spectrum-upstream"] = call.upstream.name
        if call.replica is not None:
            headers["x-spectrum-replica"] = call.replica
        return response

    async def _open_replica(self, call: Call, replicas: Replicas, path: str, body: dict):
        """The first of the upstream's replicas, in the session's order, that answers; each
        one that fails is ejected for ``eject_s`` and noted, and the next one tried. Raises
        the last failure when none answers (the model's fallback comes next)."""
        key = None if call.session is None else f"{call.tenant}\0{call.session}"
        order, how = replicas.order(key, time.monotonic())
        failure = None
        for rank, index in enumerate(order):
            replicas.in_flight[index] += 1
            released = False

            def release(index=index):
                nonlocal released
                if not released:
                    released = True
                    replicas.in_flight[index] -= 1
            try:
                response = await self.upstreams.open(replicas.upstream, path, body,
                                                     replicas.names[index], replicas.urls[index])
            except UpstreamFailure as e:
                release()
                # Over its own quota (429), or at the gateway's max_connections: busy, not broken.
                if e.status != 429 and e.kind != "busy":
                    replicas.eject(index, time.monotonic())
                log.warning("replica %s", e)
                if failure is not None:
                    call.failures.append(failure)
                failure = e
                continue
            except BaseException:
                release()
                raise
            replicas.healthy(index)
            response.on_close = release
            if failure is not None:
                call.failures.append(failure)
            call.replica = replicas.names[index]
            call.routing = how if rank == 0 else "failover"
            return response
        raise failure

    async def _whole_unless_client_leaves(self, receive, call: Call, work):
        left, answer = await unless_client_leaves(receive, work)
        if not left:
            return answer                  # (a GatewayError is raised through)
        with anyio.CancelScope(shield=True):
            await self.finish(call, 499)
        return Answer(499, b"")

    async def _whole(self, response, call: Call, headers: dict) -> Answer:
        try:
            raw = await response.aread()
        except StreamTimeout:
            raise GatewayError(504, f"upstream {call.upstream.name} timed out while answering",
                               "upstream_timeout", headers)
        except StreamRefused as e:
            raise GatewayError(502, f"upstream {call.upstream.name}'s answer was refused: {e}",
                               "upstream_failed", headers)
        except StreamBroken as e:
            raise GatewayError(502, f"upstream {call.upstream.name} broke off its answer ({e})",
                               "upstream_failed", headers)
        finally:
            await close_upstream(response)
        usage = None
        if response.status_code < 400:
            try:
                usage = orjson.loads(raw).get("usage")
            except (ValueError, AttributeError):
                usage = None
        # Metered before it is returned: if the store cannot record it, the client gets 503.
        await self.finish(call, response.status_code, usage)
        content_type = response.headers.get("content-type")
        return Answer(response.status_code, raw, headers,
                      content_type.encode("latin-1") if content_type else b"application/json")

    async def models(self, request: Request) -> dict:
        principal = await self.auth.authenticate(request.headers)
        limits = self.config.tenant(principal.tenant)
        if limits is None:
            raise GatewayError(403, f"tenant {principal.tenant!r} is not configured and this "
                                    "gateway has no default tenant", "unknown_tenant")
        return {"object": "list", "data": [{"id": m, "object": "model", "created": 0,
                                             "owned_by": "spectrum"}
                                            for m in self.models_allowed(limits, principal)]}

    @staticmethod
    def may_use(limits: TenantLimits, principal, model: str) -> bool:
        """The tenant's models, narrowed by the key's when it names some."""
        return limits.allows(model) and (principal.models is None or model in principal.models)

    def models_allowed(self, limits: TenantLimits, principal) -> list[str]:
        return [m for m in self.config.models if self.may_use(limits, principal, m)]


class RelayedStream:
    """One stream on its way to the client: the upstream's events passed on as each one
    completes, its usage kept for the ledger, the request metered when it ends, however it
    ends (``Relay`` drives it: ``pump``, then always ``aclose``).

    The upstream's ``[DONE]`` is held back until the request is settled (metered, its
    reservation and concurrent slot given back), as a whole answer is only sent once metered:
    a client that starts its next request on ``[DONE]`` never finds its own last one still
    holding a slot, and its usage is in the ledger by then."""

    __slots__ = ("gateway", "response", "call", "want_usage", "usage", "chunks", "status",
                 "buffer", "done", "settled")

    def __init__(self, gateway: Gateway, response, call: Call, want_usage: bool) -> None:
        self.gateway, self.response, self.call = gateway, response, call
        self.want_usage = want_usage
        # 499 until the upstream's answer is pumped: a client gone before it was is metered so.
        self.usage, self.chunks, self.status, self.buffer = None, 0, 499, b""
        self.done = b""           # the upstream's [DONE] event, held back until settled
        self.settled = False

    def pass_on(self, data: bytes) -> bytes:
        """What of ``data`` goes to the client now: its complete events (an unfinished one is
        kept for the next data), less the usage-only event the client did not ask for and the
        ``[DONE]`` held back for the end."""
        if (not self.buffer and data.endswith(b"\n\n") and not carries_usage(data)
                and b"[DONE]" not in data):
            self.chunks += data.count(b"data: {")       # whole events, nothing to take out:
            return data                                 # passed on as they came
        events, self.buffer = split_events(self.buffer + data)
        kept = []
        for event in events:
            if event.startswith(b"data:") and event[5:].strip() == b"[DONE]":
                self.done = event
                continue
            if carries_usage(event):
                payload = event_json(event)
                if payload and payload.get("usage"):
                    self.usage = payload["usage"]
                    if not self.want_usage and not payload.get("choices"):
                        continue          # the usage-only chunk the client did not ask for
            self.chunks += 1
            kept.append(event)
        return b"".join(kept)

    async def pump(self, write) -> bytes:
        """The upstream's answer through ``pass_on`` into ``write`` (``asgi.writer``), each
        chunk as the upstream connection parses it; a broken upstream ends the stream with an
        error event. Settles the request at the end, and returns what goes last: ``[DONE]``."""
        def sink(data: bytes):
            out = self.pass_on(data)
            if self.done:       # held back until the body ends, which must not be long
                self.response.expect_end(END_AFTER_DONE_S)
            return write(out) if out else None

        self.gateway.inflight += 1
        self.status = 200
        try:
            await self.response.pump(sink)
            if self.buffer:
                await _written(write(self.buffer))
        except StreamBroken as e:
            if not self.done:       # broken after [DONE]: nothing of the answer was lost
                self.status = 504 if isinstance(e, StreamTimeout) else 502
                what = "timed out" if self.status == 504 else f"broke off ({e})"
                await _written(write(b"data: " + json.dumps(error_body(
                    self.status, f"upstream {self.call.upstream.name} {what} mid-stream",
                    "upstream_failed")).encode() + b"\n\n"))
        except BaseException:
            self.status = 499   # the client went away: the upstream call is aborted on close
            raise
        finally:
            self.gateway.inflight -= 1
        await self.aclose()
        return self.done

    async def aclose(self) -> None:
        """Close the upstream's answer and settle the request, once, to the end even when the
        task is cancelled meanwhile."""
        if self.settled:
            return
        self.settled = True
        await to_the_end(self._settle())

    async def _settle(self) -> None:
        await self.response.aclose()
        try:
            await self.gateway.finish(self.call, self.status, self.usage, self.chunks)
        except GatewayError as e:      # kept by the store, settled once it is back
            log.error("request %s not metered yet: %s", self.call.request_id, e.message)


async def _written(held) -> None:
    if held is not None:
        await held


class CompletionRoute:
    """A completion route as a plain ASGI app: ``serve`` calls it directly, and FastAPI's
    router knows it too (so a GET there is a 405, not a 404)."""

    def __init__(self, gateway: Gateway, upstream_path: str) -> None:
        self.gateway, self.upstream_path = gateway, upstream_path

    async def __call__(self, scope, receive, send) -> None:
        reply = await self.gateway.answer(scope, receive, self.upstream_path)
        await reply(receive, send)


def internal_error_body(e: Exception) -> dict:
    log.exception("unexpected error", exc_info=e)
    return error_body(500, f"internal error ({type(e).__name__}); the gateway logged it",
                      "internal_error")


def create_app(config: GatewayConfig | None = None):
    """The ASGI app; without a config, the one named by $SPECTRUM_GATEWAY_CONFIG (how
    uvicorn's workers build it)."""
    config = config or load_config(os.environ[CONFIG_ENV])
    gateway = Gateway(config)

    @asynccontextmanager
    async def lifespan(_app):
        await gateway.warm()
        freeze_start_up_heap(log)
        yield
        await gateway.close()

    app = FastAPI(title="Spectrum gateway", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.gateway = gateway

    @app.exception_handler(GatewayError)
    async def gateway_error(_request, e: GatewayError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, e: StarletteHTTPException):
        message = (f"no route {request.method} {request.url.path}; this gateway serves "
                   "/v1/chat/completions, /v1/completions, /v1/models"
                   if e.status_code in (404, 405) else str(e.detail))
        return JSONResponse(error_body(e.status_code, message, "not_found"),
                            status_code=e.status_code)

    @app.exception_handler(Exception)
    async def unexpected(_request, e: Exception):
        return JSONResponse(internal_error_body(e), status_code=500)

    completion_routes = {"/v1/chat/completions": CompletionRoute(gateway, "/chat/completions"),
                         "/v1/completions": CompletionRoute(gateway, "/completions")}
    for path, route in completion_routes.items():
        app.add_route(path, route, methods=["POST"])

    @app.get("/v1/models")
    async def models(request: Request):
        return await gateway.models(request)

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz():
        try:
            await gateway.store.ping()
        except GatewayError as e:
            return JSONResponse({"status": "unavailable", "store": gateway.store.name,
                                 "error": e.message}, status_code=503)
        return {"status": "ready", "store": gateway.store.name}

    @app.get("/metrics")
    async def metrics():
        counters = await gateway.store.metric_counters()
        gauges = {"spectrum_gateway_streams_in_flight": gateway.inflight}
        now = time.monotonic()
        for (model, upstream), replicas in gateway.replicas.items():
            for i, name in enumerate(replicas.names):
                labels = dict(model=model, upstream=upstream, replica=name)
                gauges[meter.sample("spectrum_gateway_replica_in_flight", **labels)] = \
                    replicas.in_flight[i]
                gauges[meter.sample("spectrum_gateway_replica_ejected", **labels)] = \
                    int(replicas.ejected_until[i] > now)
        text = meter.render(counters, gauges)
        return Response(text, media_type="text/plain; version=0.0.4")

    async def serve(scope, receive, send) -> None:
        """The completion routes straight to the gateway: FastAPI's router, dependency solving
        and three exception middlewares (each wrapping every streamed chunk's send) cost more
        CPU per request and per token than the gateway's own checks. Everything else is
        FastAPI's."""
        if scope["type"] == "http" and scope["method"] == "POST":
            route = completion_routes.get(scope["path"])
            if route is not None:
                return await route(scope, receive, send)
        await app(scope, receive, send)

    serve.state = app.state
    return serve
