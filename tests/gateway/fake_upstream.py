"""A small OpenAI-compatible server for the gateway's tests: several named upstreams in one
process (``/u/<name>/v1/...``), each streaming tokens at a fixed rate and reporting usage.

It also answers as Bedrock's runtime (``/model/<id>/converse``, ``/converse-stream``) and
SageMaker's (``/endpoints/<name>/invocations``, ``/invocations-response-stream``), with real
AWS event-stream bytes, so botocore signs, sends and parses exactly as against AWS.

``POST /control/<name>`` sets an upstream's behaviour ({"mode": "ok"|"fail500"|"fail429"|
"hang", "interval_s": ..., "stop_after": N, "stall_after": N, "linger_s": ...,
"usage_nulls": bool}: ``linger_s`` holds a stream's body open that long after its ``[DONE]``;
``usage_nulls`` puts ``"usage": null`` in every chunk of a stream that asked for usage, as
OpenAI's API does); ``GET /control/<name>`` returns what it saw (requests, streams completed
and aborted by the client, the last body).

Run: python fake_upstream.py PORT
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bedrock"))
from aws_event_stream import event  # noqa: E402   the same encoder the Bedrock tests use

STATE: dict[str, dict] = {}


def upstream(name: str) -> dict:
    return STATE.setdefault(name, {"mode": "ok", "interval_s": 0.01, "requests": 0,
                                   "completed": 0, "aborted": 0, "last_body": None})


async def control(request: Request):
    u = upstream(request.path_params["name"])
    if request.method == "POST":
        u.update(await request.json())
    return JSONResponse(u)


def count_prompt(body: dict) -> int:
    messages = body.get("messages")
    if body.get("prompt") is None and not (isinstance(messages, list)
                                           and all(isinstance(m, dict) for m in messages)):
        raise ValueError(f"messages must be a list of objects, got {messages!r}")
    text = body.get("prompt") or " ".join(str(m.get("content", "")) for m in messages)
    return max(1, len(str(text).split()))


async def received(request: Request, name: str) -> tuple[dict, dict]:
    """The upstream's state and the request's body, counted and kept for the tests."""
    u = upstream(name)
    body = await request.json()
    u["requests"] += 1
    u["last_body"] = body
    return u, body


async def generate(request: Request):
    name = request.path_params["name"]
    u, body = await received(request, name)
    if u["mode"] == "fail500":
        return JSONResponse({"error": {"message": f"{name} is broken"}}, status_code=500)
    if u["mode"] == "fail429":
        return JSONResponse({"error": {"message": f"{name} is over quota"}}, status_code=429)
    if u["mode"] == "hang":       # never answers; gives up once the caller has hung up
        while not await request.is_disconnected():
            await asyncio.sleep(0.1)
        return JSONResponse({}, status_code=499)
    chat = request.url.path.endswith("/chat/completions")
    try:                          # a bad body gets 400, as from a real server
        prompt_tokens = count_prompt(body)
    except ValueError as e:
        return JSONResponse({"error": {"message": str(e)}}, status_code=400)
    n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    if u.get("stop_after"):        # an answer that ends before max_tokens (unused reservation)
        n = min(n, int(u["stop_after"]))
    tokens = [f"{name}:{i} " for i in range(n)]
    created = int(time.time())
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n,
             "total_tokens": prompt_tokens + n}
    obj = "chat.completion" if chat else "text_completion"
    if not body.get("stream"):
        deadline = time.monotonic() + u.get("delay_s", 0)
        while time.monotonic() < deadline:      # a slow whole answer, abandoned if the caller goes
            if await request.is_disconnected():
                u["aborted"] += 1
                return JSONResponse({}, status_code=499)
            await asyncio.sleep(0.05)
        u["completed"] += 1
        choice = ({"index": 0, "message": {"role": "assistant", "content": "".join(tokens)},
                   "finish_reason": "length"} if chat else
                  {"index": 0, "text": "".join(tokens), "finish_reason": "length"})
        return JSONResponse({"id": "cmpl-1", "object": obj, "created": created,
                             "model": body["model"], "choices": [choice], "usage": usage})

    async def events():
        done = False
        try:
            for i, token in enumerate(tokens):
                if i == u.get("stall_after"):        # goes quiet mid-answer, until hung up on
                    await asyncio.sleep(3600)
                await asyncio.sleep(u["interval_s"])
                delta = ({"index": 0, "delta": {"content": token}, "finish_reason": None} if chat
                         else {"index": 0, "text": token, "finish_reason": None})
                if i == n - 1:
                    delta["finish_reason"] = "length"
                chunk = {"id": "cmpl-1", "object": obj + ".chunk", "created": created,
                         "model": body["model"], "choices": [delta]}
                if u.get("usage_nulls") and (body.get("stream_options") or {}).get("include_usage"):
                    chunk["usage"] = None
                yield f"data: {json.dumps(chunk)}\n\n"
            if (body.get("stream_options") or {}).get("include_usage"):
                yield f"data: {json.dumps({'id': 'cmpl-1', 'object': obj + '.chunk', 'created': created, 'model': body['model'], 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
            if u.get("linger_s"):
                await asyncio.sleep(u["linger_s"])
            done = True           # the body ends here: a caller gone before was an abort
        finally:
            u["completed" if done else "aborted"] += 1

    return StreamingResponse(events(), media_type="text/event-stream")


async def bedrock(request: Request):
    """Converse and ConverseStream for model ``id``: one word per token, usage at the end."""
    model_id = request.path_params["model_id"]
    u, body = await received(request, model_id)
    if u["mode"] == "fail429":
        return JSONResponse({"message": "Too many requests"}, status_code=429,
                            headers={"x-amzn-ErrorType": "ThrottlingException"})
    n = int((body.get("inferenceConfig") or {}).get("maxTokens") or 16)
    words = [f"{model_id}:{i} " for i in range(n)]
    usage = {"inputTokens": count_prompt({"prompt": " ".join(
        b.get("text", "") for m in body["messages"] for b in m["content"])}),
             "outputTokens": n}
    usage["totalTokens"] = usage["inputTokens"] + n
    if not request.url.path.endswith("-stream"):
        return JSONResponse({"output": {"message": {"role": "assistant",
                                                    "content": [{"text": "".join(words)}]}},
                             "stopReason": "max_tokens", "usage": usage,
                             "metrics": {"latencyMs": 5}})

    async def events():
        yield event("messageStart", {"role": "assistant"})
        for w in words:
            await asyncio.sleep(u["interval_s"])
            yield event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": w}})
        yield event("contentBlockStop", {"contentBlockIndex": 0})
        yield event("messageStop", {"stopReason": "max_tokens"})
        yield event("metadata", {"usage": usage, "metrics": {"latencyMs": 5}})
        u["completed"] += 1
    return StreamingResponse(events(), media_type="application/vnd.amazon.eventstream")


async def sagemaker(request: Request):
    """An endpoint serving OpenAI chat bodies (rung 5's server); streams as PayloadParts cut
    every 7 bytes, across lines and events, as SageMaker cuts them."""
    name = request.path_params["endpoint"]
    u, body = await received(request, name)
    n = int(body.get("max_tokens") or 16)
    words = [f"{name}:{i} " for i in range(n)]
    usage = {"prompt_tokens": count_prompt(body), "completion_tokens": n,
             "total_tokens": count_prompt(body) + n}
    if not request.url.path.endswith("-response-stream"):
        return JSONResponse({"id": "x", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "".join(words)},
             "finish_reason": "length"}], "usage": usage})

    async def events():
        sse = b"".join(b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": w},
                                                            "finish_reason": None}]}).encode()
                       + b"\n\n" for w in words)
        sse += b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n"
        for i in range(0, len(sse), 7):
            yield event("PayloadPart", sse[i:i + 7], "application/octet-stream")
        u["completed"] += 1
    return StreamingResponse(events(), media_type="application/vnd.amazon.eventstream")


async def jwks(request: Request):
    """An identity provider's key set, as set through ``POST /control/jwks {"keys": [...]}``."""
    return JSONResponse({"keys": upstream("jwks").get("keys", [])})


app = Starlette(routes=[
    Route("/jwks", jwks, methods=["GET"]),
    Route("/model/{model_id}/converse", bedrock, methods=["POST"]),
    Route("/model/{model_id}/converse-stream", bedrock, methods=["POST"]),
    Route("/endpoints/{endpoint}/invocations", sagemaker, methods=["POST"]),
    Route("/endpoints/{endpoint}/invocations-response-stream", sagemaker, methods=["POST"]),
    Route("/control/{name}", control, methods=["GET", "POST"]),
    Route("/u/{name}/v1/chat/completions", generate, methods=["POST"]),
    Route("/u/{name}/v1/completions", generate, methods=["POST"]),
])

if __name__ == "__main__":
    import uvicorn
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
