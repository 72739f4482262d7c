"""A small stand-in for DJL Serving's ``djl_python.Input`` / ``djl_python.Output``.

``djl_python`` exists only inside AWS's LMI images (it is not on PyPI), yet a level-4 handler
(``model.py``) has to run outside them too: in this server, and in tests. A handler imports
this module only when ``from djl_python import Input, Output`` fails, so inside LMI the real
classes are always used.

It lives here, in the server package, because the server is the one host that runs handlers
outside LMI, and the image must not depend on the ``options`` package: one home, importable
both in the image and (with ``containers/byo-vllm`` on ``sys.path``) from the project.

Behaviour follows djl_python's inputs.py / outputs.py, where a handler can observe it:
- a dynamic batch arrives as ONE Input whose property ``batch_size`` is N and whose keys are
  prefixed ``batch_NNN_`` (three digits); ``get_batches()`` splits it into N Inputs;
- ``get_property`` is case-insensitive; ``get_data`` picks the decoder from ``content-type``;
- ``is_empty()`` is true for the warm-up request (no content);
- ``Output.add(..., batch_index=i)`` stores the value under ``batch_{i}.<key>``;
  ``Output.error(msg, code)`` sets the code and a JSON body ``{"code", "message", "error"}``;
- ``add_stream_content(iterator, output_formatter)`` defers the body: the host pulls items
  from the iterator and sends ``output_formatter(item)`` bytes for each, in order.
What the real module does with sockets (``read``/``send``) is the host's job here: see
``byo_vllm.lmi_handler``, which builds Inputs with ``Input.for_request`` / ``Input.batch_of``.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Iterator, Optional

BATCH_SIZE_PROPERTY = "batch_size"


class PairList:
    """An ordered list of (key, value) pairs; keys may repeat or be None."""

    def __init__(self) -> None:
        self._keys: list[Optional[str]] = []
        self._values: list[Any] = []

    def add(self, key: Optional[str] = None, value: Any = None) -> None:
        self._keys.append(key)
        self._values.append(value)

    def size(self) -> int:
        return len(self._keys)

    def is_empty(self) -> bool:
        return not self._keys

    def key_at(self, index: int) -> Optional[str]:
        return self._keys[index]

    def value_at(self, index: int) -> Any:
        return self._values[index]

    def get_keys(self) -> list[Optional[str]]:
        return list(self._keys)

    def get(self, key: str) -> Any:
        for k, v in zip(self._keys, self._values):
            if k == key:
                return v
        return None


def _batch_prefix(index: int) -> str:
    return f"batch_{index:03d}_"


class Input:
    def __init__(self) -> None:
        self.function_name: Optional[str] = None
        self.properties: dict[str, str] = {}
        self.content = PairList()

    # --- built by the host (the real frontend does this in Java) -------------------------
    @classmethod
    def for_request(cls, body: bytes, content_type: str | None,
                    properties: dict[str, str] | None = None) -> "Input":
        """One HTTP request: its body under key ``data``, its headers as properties."""
        item = cls()
        item.properties.update(properties or {})
        if content_type:
            item.properties["Content-Type"] = content_type
        if body:
            item.content.add("data", bytes(body))
        return item

    @classmethod
    def batch_of(cls, items: list["Input"], properties: dict[str, str] | None = None) -> "Input":
        """Several requests as the single batched Input a handler receives."""
        batch = cls()
        batch.properties.update(properties or {})
        batch.properties[BATCH_SIZE_PROPERTY] = str(len(items))
        for index, item in enumerate(items):
            prefix = _batch_prefix(index)
            for key, value in item.properties.items():
                batch.properties[prefix + key] = value
            for i in range(item.content.size()):
                batch.content.add(prefix + (item.content.key_at(i) or "data"), item.content.value_at(i))
        return batch

    # --- what a handler uses ---------------------------------------------------------------
    def is_batch(self) -> bool:
        return BATCH_SIZE_PROPERTY in self.properties

    def get_batch_size(self) -> int:
        return int(self.properties.get(BATCH_SIZE_PROPERTY, "1"))

    def get_batches(self) -> list["Input"]:
        if not self.is_batch():
            return [self]
        batch = [Input() for _ in range(self.get_batch_size())]
        for key, value in self.properties.items():
            if key.startswith("batch_") and key != BATCH_SIZE_PROPERTY:
                batch[int(key[6:9])].properties[key[10:]] = value
        for i in range(self.content.size()):
            key = self.content.key_at(i) or ""
            batch[int(key[6:9])].content.add(key[10:], self.content.value_at(i))
        return batch

    def get_function_name(self) -> Optional[str]:
        return self.function_name

    def get_properties(self) -> dict[str, str]:
        return self.properties

    def get_content(self) -> PairList:
        return self.content

    def get_property(self, key: str) -> Optional[str]:
        wanted = key.lower()
        return next((v for k, v in self.properties.items() if k.lower() == wanted), None)

    def contains_key(self, key: str) -> bool:
        return self.content.get(key) is not None

    def is_empty(self) -> bool:
        return self.content.is_empty()

    def get_data(self, key: str | None = None) -> Any:
        content_type = self.get_property("content-type")
        if content_type is not None and content_type.startswith("application/json"):
            return self.get_as_json(key)
        if content_type is not None and content_type.startswith("text/"):
            return self.get_as_string(key)
        if self.content.is_empty():
            return None
        return self.get_as_bytes(key)

    def get_as_bytes(self, key: str | None = None) -> Optional[bytes]:
        if self.content.is_empty():
            return None
        if key:
            value = self.content.get(key)
            if value is None:
                raise KeyError(f"requested data for key:{key} is not found!")
            return value
        value = self.content.get("data")
        return self.content.value_at(0) if value is None else value

    def get_as_string(self, key: str | None = None) -> str:
        return bytes(self.get_as_bytes(key) or b"").decode("utf-8")

    def get_as_json(self, key: str | None = None) -> Any:
        return json.loads(self.get_as_string(key))


def _default_stream_output_formatter(item: Any) -> bytes:
    """DJL's default for a custom handler's stream: one JSON line ``{"outputs": item}``."""
    return (json.dumps({"outputs": item}) + "\n").encode("utf-8")


class Output:
    def __init__(self, code: int = 200, message: str = "OK") -> None:
        self.code = code
        self.message = message
        self.properties: dict[str, str] = {}
        self.content = PairList()
        self.stream_content: Optional[Iterator[Any]] = None
        self.stream_output_formatter: Callable[[Any], bytes] = _default_stream_output_formatter

    def set_code(self, code: int) -> "Output":
        self.code = code
        return self

    def set_message(self, message: str) -> "Output":
        self.message = message
        return self

    def error(self, error: str, code: int = 424, message: str = "prediction failure") -> "Output":
        self.code = code
        self.message = message
        self.add_property("content-type", "application/json")
        return self.add_as_json({"code": code, "message": message, "error": error})

    def add_property(self, key: str, val: str) -> "Output":
        self.properties[key] = val
        return self

    def add(self, value: Any, key: str | None = None, batch_index: int | None = None) -> "Output":
        if key is not None and not isinstance(key, str):
            key = str(key)
        if batch_index is not None:
            key = f"batch_{batch_index}.{key or ''}"
        if isinstance(value, str):
            value = value.encode("utf-8")
        elif isinstance(value, (bytes, bytearray)):
            value = bytes(value)
        else:
            value = self._encode_json(value)
        self.content.add(key, value)
        return self

    def add_as_json(self, val: Any, key: str | None = None, batch_index: int | None = None) -> "Output":
        return self.add(self._encode_json(val), key=key, batch_index=batch_index)

    def add_stream_content(self, stream_content: Iterator[Any],
                           output_formatter: Callable[[Any], bytes] | None = None) -> "Output":
        self.stream_content = iter(stream_content)
        self.stream_output_formatter = output_formatter or _default_stream_output_formatter
        return self

    @staticmethod
    def _encode_json(val: Any) -> bytes:
        # Same settings as djl_python: UTF-8 kept as is, NaN refused.
        return json.dumps(val, ensure_ascii=False, allow_nan=False, indent=2,
                          separators=(",", ":")).encode("utf-8")
