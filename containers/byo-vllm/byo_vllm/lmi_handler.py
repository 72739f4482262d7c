"""Serve /invocations through an LMI (DJL Serving) ``model.py`` handler instead of vLLM.

Level 4 of the spectrum is "your own code on AWS's LMI container": DJL Serving imports the
handler file and calls ``handle(inputs)``. This module plays DJL Serving's part inside the
bring-your-own server, so the same handler runs locally, unchanged:

- ``load()`` imports the handler (``option.entryPoint``, default ``model.py`` in the model
  folder, which is put on ``sys.path`` as DJL does) and sends the empty warm-up request that
  makes it load its model; ``ready`` turns true when that returns, ``failed`` holds why not.
- ``invoke()`` turns an HTTP request into an ``Input`` (body under ``data``, headers as
  properties), calls ``handle()`` and turns the ``Output`` into the HTTP answer: the code
  becomes the status, a stream becomes an iterator of byte chunks.
- With ``batch_size`` > 1 (serving.properties, as in DJL) concurrent requests are gathered for
  up to ``max_batch_delay`` ms into one batched Input; each request gets its own item of the
  Output (``batch_{i}.`` keys) back. A streaming request is always sent alone, as DJL can
  stream only a batch of one.

Handlers see the properties DJL would give them: ``option.*`` keys without the prefix (from
serving.properties in the model folder, which wins, then from what the server passes, e.g.
``OPTION_*`` environment variables), plus ``model_dir``.
"""
from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import logging
import queue
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Iterator

# Requests are built with the stand-in's Input even if a real djl_python were importable: a
# handler only reads Inputs through the djl_python API, which the stand-in follows.
from byo_vllm.djl_standin import Input

log = logging.getLogger(__name__)

DEFAULT_ENTRY_POINT = "model.py"
DEFAULT_MAX_BATCH_DELAY_MS = 100  # DJL Serving's default
JSON = "application/json"
JSONLINES = "application/jsonlines"

Answer = tuple[int, str, "bytes | Iterator[bytes]"]


# ---------------------------------------------------------------------------------------------
# Properties and the entry point
# ---------------------------------------------------------------------------------------------
def read_serving_properties(path: Path) -> dict[str, str]:
    """``key=value`` lines of a serving.properties file; ``#`` starts a comment."""
    found: dict[str, str] = {}
    if not path.is_file():
        return found
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        found[key.strip()] = value.strip()
    return found


def _normalise(properties: dict[str, str]) -> dict[str, str]:
    """``OPTION_MAX_NEW_TOKENS`` and ``option.max_new_tokens`` both become ``max_new_tokens``
    (DJL hands options to handlers without their prefix); other keys stay as they are."""
    out: dict[str, str] = {}
    for key, value in properties.items():
        if key.startswith("option."):
            key = key[len("option."):]
        elif key.startswith("OPTION_"):
            key = key[len("OPTION_"):].lower()
            key = "entryPoint" if key == "entrypoint" else key
        out[key] = str(value)
    return out


def handler_properties(model_dir: Path, properties: dict[str, str]) -> dict[str, str]:
    """What ``inputs.get_properties()`` returns to the handler; serving.properties wins."""
    merged = _normalise(properties)
    merged.update(_normalise(read_serving_properties(Path(model_dir) / "serving.properties")))
    merged["model_dir"] = str(model_dir)
    return merged


def entry_point_for(model_dir: Path, properties: dict[str, str]) -> Path | None:
    """The handler file a model folder asks for, or None when it is not a level-4 folder:
    ``option.entryPoint`` / ``OPTION_ENTRYPOINT`` naming a .py file, else ``model.py``."""
    named = handler_properties(model_dir, properties).get("entryPoint")
    if named:
        if not named.endswith(".py"):
            return None       # a built-in DJL handler name (e.g. djl_python.vllm): not ours
        path = Path(named)
        return path if path.is_absolute() else Path(model_dir) / path
    default = Path(model_dir) / DEFAULT_ENTRY_POINT
    return default if default.is_file() else None


# ---------------------------------------------------------------------------------------------
# Output → HTTP
# ---------------------------------------------------------------------------------------------
def _json_answer(status: int, message: str, error: str) -> Answer:
    body = {"code": status, "message": message, "error": error}
    return status, JSON, json.dumps(body).encode("utf-8")


def _property(properties: dict[str, str], name: str) -> str | None:
    wanted = name.lower()
    return next((v for k, v in properties.items() if k.lower() == wanted), None)


def _status_of_item(body: bytes, default: int) -> int:
    """A batch item carries its own error as DJL's error body ``{"code", "error", ...}``."""
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return default
    if isinstance(parsed, dict) and "error" in parsed and isinstance(parsed.get("code"), int) \
            and 400 <= parsed["code"] < 600:
        return parsed["code"]
    return default


def _stream_chunks(output: Any) -> Iterator[bytes]:
    """Pull the handler's stream; an error half-way ends it with one JSON error line, since the
    200 status has already been sent."""
    formatter: Callable[[Any], Any] = getattr(output, "stream_output_formatter", None) or (
        lambda item: item)
    stream = output.stream_content
    try:
        if hasattr(stream, "__anext__"):
            stream = _drain_async(stream)
        for item in stream:
            chunk = formatter(item)
            yield chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk)
    except Exception as exc:  # the server must outlive a failing handler
        log.exception("the handler's stream failed")
        yield (json.dumps({"code": 424, "message": "prediction failure", "error": str(exc)})
               + "\n").encode("utf-8")


def _drain_async(agen: Any) -> Iterator[Any]:
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                yield loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
    finally:
        loop.close()


def single_answer(output: Any) -> Answer:
    """The HTTP answer for a request that was sent alone."""
    if output is None:
        return _json_answer(500, "invoke handler failure",
                            "the handler returned None for a request (None is only for warm-up)")
    content_type = _property(output.properties, "content-type")
    if output.stream_content is not None:
        return output.code, content_type or JSONLINES, _stream_chunks(output)
    body = output.content.value_at(0) if output.content.size() else b""
    for i in range(output.content.size()):
        if output.content.key_at(i) in (None, "data"):
            body = output.content.value_at(i)
            break
    return output.code, content_type or JSON, bytes(body)


def batch_answers(output: Any, size: int) -> list[Answer]:
    """One HTTP answer per batch item, from the ``batch_{i}.`` keys of one Output."""
    if output is None:
        return [_json_answer(500, "invoke handler failure",
                             "the handler returned None for a batch")] * size
    if output.code >= 400 or output.stream_content is not None:
        if output.stream_content is not None:
            return [_json_answer(500, "invoke handler failure",
                                 "the handler streamed an answer to a batch of several")] * size
        return [single_answer(output)] * size       # the handler failed the whole batch
    answers = []
    for index in range(size):
        prefix = f"batch_{index}."
        body = next((bytes(output.content.value_at(i)) for i in range(output.content.size())
                     if (output.content.key_at(i) or "").startswith(prefix)), None)
        if body is None:
            answers.append(_json_answer(500, "invoke handler failure",
                                        f"the handler gave no answer for batch item {index}"))
            continue
        content_type = (_property(output.properties, f"batch_{index}_Content-Type")
                        or _property(output.properties, "content-type") or JSON)
        answers.append((_status_of_item(body, output.code), content_type, body))
    return answers


# ---------------------------------------------------------------------------------------------
# The backend the server calls
# ---------------------------------------------------------------------------------------------
class LmiHandlerBackend:
    def __init__(self, model_dir: Path, properties: dict[str, str]) -> None:
        self.model_dir = Path(model_dir)
        self.properties = handler_properties(self.model_dir, properties)
        self.entry_point = entry_point_for(self.model_dir, properties) or (
            self.model_dir / DEFAULT_ENTRY_POINT)
        self._handle: Callable[[Any], Any] | None = None
        self._failed: str | None = None
        self.batch_size, self.max_batch_delay_s = 1, DEFAULT_MAX_BATCH_DELAY_MS / 1000.0
        try:
            self.batch_size = _whole_number(self.properties.get("batch_size"), "batch_size", 1)
            self.max_batch_delay_s = _whole_number(self.properties.get("max_batch_delay"),
                                                   "max_batch_delay",
                                                   DEFAULT_MAX_BATCH_DELAY_MS) / 1000.0
        except ValueError as exc:   # reported through `failed`, like any start-up problem
            self._failed = str(exc)
        self._ready = threading.Event()
        # One handle() call at a time, as in one DJL Python worker.
        self._handle_lock = threading.Lock()
        self._pending: "queue.Queue[tuple[Input, Future]]" = queue.Queue()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def failed(self) -> str | None:
        return self._failed

    # --- start-up ----------------------------------------------------------------------------
    def load(self) -> None:
        """Import the handler and send the warm-up request. Blocking; never raises (the cause
        lands in ``failed``, and /ping stays 503)."""
        if self._failed:
            log.error("not loading the handler: %s", self._failed)
            return
        started = time.monotonic()
        try:
            handle = self._import_handle()
            warm_up = Input()
            warm_up.properties.update(self.properties)
            result = self._call(handle, warm_up)
            if result is not None and getattr(result, "code", 200) >= 400:
                raise RuntimeError(f"the warm-up request answered {result.code}: "
                                   f"{single_answer(result)[2]!r}")
            self._handle = handle
            if self.batch_size > 1:
                threading.Thread(target=self._batch_loop, name="lmi-batcher", daemon=True).start()
            self._ready.set()
            log.info("handler %s ready in %.1f s (batch_size %d)", self.entry_point,
                     time.monotonic() - started, self.batch_size)
        except (Exception, SystemExit) as exc:  # any failure means "not serving"
            self._failed = f"{self.entry_point.name} failed to load: {type(exc).__name__}: {exc}"
            log.exception("handler failed to load")

    def _import_handle(self) -> Callable[[Any], Any]:
        if not self.entry_point.is_file():
            raise FileNotFoundError(f"no handler file at {self.entry_point} (set "
                                    f"option.entryPoint to a .py file in {self.model_dir})")
        # Like DJL: the model folder is importable, so the handler can import its neighbours.
        folder = str(self.entry_point.parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        name = f"lmi_handler_{self.entry_point.stem}"
        spec = importlib.util.spec_from_file_location(name, self.entry_point)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module           # dataclasses and pickling look modules up here
        spec.loader.exec_module(module)
        handle = getattr(module, self.properties.get("handler", "handle"), None)
        if not callable(handle):
            raise AttributeError(f"{self.entry_point} defines no handle(inputs) function")
        return handle

    def _call(self, handle: Callable[[Any], Any], inputs: Input) -> Any:
        with self._handle_lock:
            result = handle(inputs)
            if inspect.isawaitable(result):
                result = asyncio.run(_awaited(result))
        return result

    # --- requests ----------------------------------------------------------------------------
    def invoke(self, body: bytes, content_type: str, accept: str) -> Answer:
        if not self.ready:
            return _json_answer(503, "not ready", self._failed or "the model is still loading")
        request = Input.for_request(body, content_type, {"Accept": accept} if accept else None)
        try:
            if self.batch_size > 1 and not _asks_to_stream(body):
                waiting: Future = Future()
                self._pending.put((request, waiting))
                return waiting.result()
            return single_answer(self._call(self._handle, request))
        except Exception as exc:  # the server must outlive a failing handler
            log.exception("handler failed")
            return _json_answer(424, "invoke handler failure", f"{type(exc).__name__}: {exc}")

    def _batch_loop(self) -> None:
        while True:
            batch = [self._pending.get()]
            deadline = time.monotonic() + self.max_batch_delay_s
            while len(batch) < self.batch_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    batch.append(self._pending.get(timeout=remaining))
                except queue.Empty:
                    break
            self._run_batch(batch)

    def _run_batch(self, batch: list[tuple[Input, Future]]) -> None:
        try:
            batched = Input.batch_of([item for item, _ in batch])
            answers = batch_answers(self._call(self._handle, batched), len(batch))
        except Exception as exc:  # the batcher thread must not die
            log.exception("handler failed on a batch of %d", len(batch))
            answers = [_json_answer(424, "invoke handler failure",
                                    f"{type(exc).__name__}: {exc}")] * len(batch)
        for (_, waiting), answer in zip(batch, answers):
            waiting.set_result(answer)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _asks_to_stream(body: bytes) -> bool:
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(parsed, dict) and parsed.get("stream") is True


def _whole_number(value: str | None, name: str, default: int) -> int:
    if value in (None, ""):
        return default
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < (1 if name == "batch_size" else 0):
        raise ValueError(f"{name}={value!r} in serving.properties is not a valid whole number "
                         f"(e.g. {name}={default})")
    return number
