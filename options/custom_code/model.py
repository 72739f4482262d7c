"""Level 4, bring your own code: a text-generation handler for AWS's LMI (DJL Serving) container.

DJL Serving loads this file (``option.entryPoint=model.py`` in serving.properties) and calls
``handle(inputs)`` for every request. The first call is an empty warm-up request: the model
is loaded then, from the properties (``option.*`` in serving.properties, without the prefix,
plus ``model_dir``). Every later call carries one request, or a dynamic batch of requests
(``batch_size`` / ``max_batch_delay`` in serving.properties) that is run as batched
``generate`` calls.

Request (the LMI / TGI dialect), per batch item:
    {"inputs": "text" | ["text", ...],
     "parameters": {"max_new_tokens": 32, "temperature": 0.7, "top_p": 0.9, "top_k": 50,
                    "do_sample": true, "repetition_penalty": 1.1, "seed": 0,
                    "stop_sequences": ["\\n"], "return_full_text": false, "details": true,
                    "ignore_eos_token": false},
     "stream": false}
Answer: ``{"generated_text": "...", "details": {...}}`` (a list of those for a list of inputs);
with ``"stream": true``, JSON lines ``{"token": {"id": 5, "text": " the"}}``, the last of
which also carries ``generated_text`` and ``details``, as LMI streams them. A bad item gets
``{"code": 400, "message": ..., "error": ...}`` and does not spoil the rest of its batch.

Only torch, transformers and the standard library are needed: the LMI image has all three.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer

try:  # inside the LMI container
    from djl_python import Input, Output
except ImportError:  # anywhere else: the stand-in that Spectrum's own server ships (not packaged)
    from byo_vllm.djl_standin import Input, Output

log = logging.getLogger(__name__)

DEFAULT_MAX_NEW_TOKENS = 30      # LMI's default when a request names none
DEFAULT_MAX_BATCH_SIZE = 8       # prompts per generate() call
STREAM_TOKEN_TIMEOUT_S = 600.0   # a generation that stalls this long ends the stream
JSONLINES = "application/jsonlines"

# Parameters a request may carry, and the type each must have.
_PARAMETER_TYPES: dict[str, tuple[type, ...]] = {
    "max_new_tokens": (int,),
    "temperature": (int, float),
    "top_p": (int, float),
    "top_k": (int,),
    "do_sample": (bool,),
    "repetition_penalty": (int, float),
    "seed": (int,),
    "stop_sequences": (list,),
    "stop": (list, str),          # the OpenAI spelling of stop_sequences
    "return_full_text": (bool,),
    "details": (bool,),
    "ignore_eos_token": (bool,),
    "ignore_eos": (bool,),        # vLLM's spelling of ignore_eos_token
}


class RequestError(ValueError):
    """A request the client can fix: answered with its code, never raised out of handle()."""

    def __init__(self, message: str, code: int = 400) -> None:
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------------------------
# Loading (once, on the warm-up request)
# ---------------------------------------------------------------------------------------------
@dataclass
class Settings:
    model: str                    # a folder, or a hub id
    dtype: str
    max_batch_size: int
    max_new_tokens: int
    device: str
    trust_remote_code: bool

    @classmethod
    def from_properties(cls, properties: dict[str, str]) -> "Settings":
        def prop(name: str, default: str | None = None) -> str | None:
            # DJL hands options over without their "option." prefix; accept both spellings.
            return properties.get(name, properties.get(f"option.{name}", default))

        model_id = prop("model_id")
        if not model_id or model_id.startswith("s3://"):
            # With s3:// the container has already downloaded the files into model_dir.
            model_id = prop("model_dir")
        if not model_id:
            raise ValueError("no model to load: set option.model_id (a folder or a hub id) in "
                             "serving.properties, or put the weights next to model.py")
        device = prop("device") or ("cuda" if torch.cuda.is_available() else "cpu")
        return cls(model=model_id,
                   dtype=(prop("dtype", "auto") or "auto").lower(),
                   max_batch_size=_positive_int(prop("max_batch_size"), "option.max_batch_size",
                                                DEFAULT_MAX_BATCH_SIZE),
                   max_new_tokens=_positive_int(prop("max_new_tokens"), "option.max_new_tokens",
                                                DEFAULT_MAX_NEW_TOKENS),
                   device=device,
                   trust_remote_code=str(prop("trust_remote_code", "false")).lower() == "true")


def _positive_int(value: str | None, name: str, default: int) -> int:
    if value in (None, ""):
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"{name}={value!r} is not a positive whole number (e.g. {default})")
    return number


def _torch_dtype(name: str, device: str) -> torch.dtype:
    dtypes = {"fp32": torch.float32, "float32": torch.float32,
              "fp16": torch.float16, "float16": torch.float16,
              "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
    if name == "auto":
        # LMI's default is fp16 on GPUs; CPUs are quicker and exact in fp32.
        return torch.float16 if device.startswith("cuda") else torch.float32
    if name not in dtypes:
        raise ValueError(f"option.dtype={name!r} is not supported: use one of "
                         f"auto, fp32, fp16, bf16")
    if dtypes[name] is torch.float16 and not device.startswith("cuda"):
        log.warning("option.dtype=fp16 on %s: loading in fp32, which CPUs run natively", device)
        return torch.float32
    return dtypes[name]


class TextGenerator:
    """The loaded tokenizer and model, and the batched generation around them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.tokenizer = AutoTokenizer.from_pretrained(
            settings.model, trust_remote_code=settings.trust_remote_code)
        # Left padding: every prompt in a batch then ends at the same column, where
        # generation continues; the attention mask hides the padding.
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        # Several GPUs (ml.g5.12xlarge has 4): spread the layers over all of them.
        spread = settings.device == "cuda" and torch.cuda.device_count() > 1
        self.model = AutoModelForCausalLM.from_pretrained(
            settings.model, dtype=_torch_dtype(settings.dtype, settings.device),
            trust_remote_code=settings.trust_remote_code,
            **({"device_map": "auto"} if spread else {}))
        if not spread:
            self.model.to(settings.device)
        self.model.eval()
        self.device = self.model.device          # where inputs go (the first layer's device)
        self.eos_ids = _eos_ids(self.model, self.tokenizer)
        self.max_positions = getattr(self.model.config, "max_position_embeddings", None)
        log.info("loaded %s on %s (%s)", settings.model, settings.device, self.model.dtype)

    def check_fits(self, request: "Request") -> None:
        """Refuse, before any batch runs, a prompt that would outgrow the model's context."""
        if not self.max_positions:
            return
        for index, prompt in enumerate(request.prompts):
            tokens = len(self.tokenizer(prompt)["input_ids"])
            if tokens + request.params.max_new_tokens > self.max_positions:
                which = "the prompt" if request.single else f"prompt {index}"
                raise RequestError(
                    f"{which} has {tokens} tokens; with max_new_tokens="
                    f"{request.params.max_new_tokens} that is more than the model's "
                    f"{self.max_positions}-token context: shorten it or lower max_new_tokens")

    # --- one generate() call for prompts that share their parameters -------------------------
    def generate(self, prompts: list[str], params: "GenerationParams",
                 streamer: "TokenStreamer | None" = None) -> list["Completion"]:
        encoded = self.tokenizer(prompts, return_tensors="pt", padding=True).to(self.device)
        with torch.no_grad():
            output = self.model.generate(**encoded, streamer=streamer,
                                         **self._generate_kwargs(params))
        prompt_width = encoded["input_ids"].shape[1]
        input_tokens = encoded["attention_mask"].sum(dim=1).tolist()
        return [self._completion(prompt, row[prompt_width:].tolist(), int(n), params)
                for prompt, row, n in zip(prompts, output, input_tokens)]

    def _generate_kwargs(self, params: "GenerationParams") -> dict[str, Any]:
        kwargs: dict[str, Any] = {"max_new_tokens": params.max_new_tokens,
                                  "pad_token_id": self.tokenizer.pad_token_id,
                                  "do_sample": params.do_sample}
        if params.do_sample:
            if params.seed is not None:
                torch.manual_seed(params.seed)
            kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k)
        else:  # greedy: clear sampling knobs a model's generation_config may carry
            kwargs.update(temperature=None, top_p=None, top_k=None)
        if params.repetition_penalty != 1.0:
            kwargs["repetition_penalty"] = params.repetition_penalty
        if params.ignore_eos:
            kwargs["min_new_tokens"] = params.max_new_tokens
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        return kwargs

    def _completion(self, prompt: str, new_ids: list[int], input_tokens: int,
                    params: "GenerationParams") -> "Completion":
        finish_reason = "length"
        for position, token in enumerate(new_ids):
            if token in self.eos_ids and not params.ignore_eos:
                new_ids, finish_reason = new_ids[:position + 1], "eos_token"
                break
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in params.stop) if i >= 0), default=-1)
        if cut >= 0:
            text, finish_reason = text[:cut], "stop_sequence"
        return Completion(prompt=prompt, text=text, finish_reason=finish_reason,
                          generated_tokens=len(new_ids), input_tokens=input_tokens)

    # --- one prompt, token by token -----------------------------------------------------------
    def stream(self, prompt: str, params: "GenerationParams") -> Iterator[dict[str, Any]]:
        """LMI's jsonlines events: one ``{"token": ...}`` per token; the last also carries
        ``generated_text`` and ``details``."""
        streamer = TokenStreamer(self.tokenizer, timeout=STREAM_TOKEN_TIMEOUT_S)
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                result["completion"] = self.generate([prompt], params, streamer)[0]
            except Exception as exc:  # reported in the stream; the thread must not die silently
                log.exception("generation failed")
                result["error"] = exc
                streamer.end()

        worker = threading.Thread(target=run, name="model-py-generate", daemon=True)
        worker.start()

        def events() -> Iterator[dict[str, Any]]:
            previous = None
            for token in streamer:
                if previous is not None:
                    yield {"token": previous}
                previous = token
            worker.join()
            if "error" in result:
                yield {"token": {"id": -1, "text": "", "special_token": True},
                       "generated_text": "", "error": str(result["error"]), "code": 424,
                       "details": {"finish_reason": "error", "generated_tokens": None,
                                   "inputs": None}}
                return
            completion: Completion = result["completion"]
            last = previous or {"id": -1, "text": "", "special_token": True}
            yield {"token": last, **completion.as_json(params, with_details=True)}

        return events()


def _eos_ids(model, tokenizer) -> set[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


class TokenStreamer(TextIteratorStreamer):
    """transformers' TextIteratorStreamer, one queue item per token: its id and the text it
    adds (held back while the text ends in a partial UTF-8 character)."""

    def __init__(self, tokenizer, timeout: float) -> None:
        super().__init__(tokenizer, skip_prompt=True, timeout=timeout, skip_special_tokens=True)
        self.ids: list[int] = []
        self.sent_text = ""

    def put(self, value) -> None:
        if self.next_tokens_are_prompt:   # generate() hands over the prompt first
            self.next_tokens_are_prompt = False
            return
        for token in value.reshape(-1).tolist():
            self.ids.append(int(token))
            text = self.tokenizer.decode(self.ids, **self.decode_kwargs)
            delta = ""
            if not text.endswith("\ufffd"):
                delta, self.sent_text = text[len(self.sent_text):], text
            self.text_queue.put({"id": int(token), "text": delta}, timeout=self.timeout)

    def end(self) -> None:
        self.next_tokens_are_prompt = True
        self.text_queue.put(self.stop_signal, timeout=self.timeout)


# ---------------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GenerationParams:
    """Hashable, so that batch items with equal parameters share one generate() call."""
    max_new_tokens: int
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 50
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    return_full_text: bool = False
    details: bool = False


@dataclass
class Completion:
    prompt: str
    text: str
    finish_reason: str
    generated_tokens: int
    input_tokens: int

    def as_json(self, params: GenerationParams, with_details: bool | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"generated_text": (self.prompt + self.text) if params.return_full_text
                               else self.text}
        if params.details if with_details is None else with_details:
            out["details"] = {"finish_reason": self.finish_reason,
                              "generated_tokens": self.generated_tokens,
                              "inputs": self.prompt, "input_tokens": self.input_tokens}
        return out


@dataclass
class Request:
    prompts: list[str]
    single: bool                  # "inputs" was one string, not a list
    params: GenerationParams
    stream: bool
    completions: list[Completion] = field(default_factory=list)

    def answer(self) -> Any:
        answers = [c.as_json(self.params) for c in self.completions]
        return answers[0] if self.single else answers


def parse_request(item: Input, default_max_new_tokens: int) -> Request:
    """One batch item → Request, or RequestError naming what is wrong and what would be right."""
    content_type = (item.get_property("Content-Type") or "application/json").lower()
    try:
        if content_type.startswith("text/"):
            body: Any = {"inputs": item.get_as_string()}
        else:
            body = item.get_as_json()
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the body is not valid JSON ({exc}); send e.g. "
                           '{"inputs": "Hello", "parameters": {"max_new_tokens": 32}}') from None
    if not isinstance(body, dict) or "inputs" not in body:
        found = sorted(body) if isinstance(body, dict) else type(body).__name__
        raise RequestError(f'the body needs "inputs" (a string or a list of strings), found '
                           f'{found}; send e.g. {{"inputs": "Hello", "parameters": '
                           f'{{"max_new_tokens": 32}}}}')
    inputs = body["inputs"]
    single = isinstance(inputs, str)
    prompts = [inputs] if single else inputs
    if (not isinstance(prompts, list) or not prompts
            or not all(isinstance(p, str) and p for p in prompts)):
        raise RequestError(f'"inputs" must be a non-empty string or a non-empty list of '
                           f'non-empty strings, not {json.dumps(inputs)[:80]}')
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f'"stream" must be true or false, not {json.dumps(stream)}')
    if stream and not single:
        raise RequestError('"stream": true takes one prompt: send "inputs" as a string')
    return Request(prompts=prompts, single=single,
                   params=parse_parameters(body.get("parameters") or {}, default_max_new_tokens),
                   stream=stream)


def parse_parameters(raw: Any, default_max_new_tokens: int) -> GenerationParams:
    if not isinstance(raw, dict):
        raise RequestError(f'"parameters" must be an object, not {json.dumps(raw)[:80]}')
    for name, value in raw.items():
        allowed = _PARAMETER_TYPES.get(name)
        if allowed is None:
            raise RequestError(f"unknown parameter {name!r}: supported are "
                               f"{', '.join(sorted(_PARAMETER_TYPES))}")
        if isinstance(value, bool) and bool not in allowed or not isinstance(value, allowed):
            kinds = " or ".join(t.__name__ for t in allowed)
            raise RequestError(f"parameter {name}={json.dumps(value)} must be a {kinds}")

    def check(name: str, ok: bool, rule: str) -> None:
        if name in raw and not ok:
            raise RequestError(f"parameter {name}={json.dumps(raw[name])} is out of range: {rule}")

    max_new_tokens = raw.get("max_new_tokens", default_max_new_tokens)
    temperature = float(raw.get("temperature", 1.0))
    top_p = float(raw.get("top_p", 1.0))
    top_k = raw.get("top_k", 0)
    check("max_new_tokens", max_new_tokens >= 1, "a whole number of at least 1")
    check("temperature", temperature >= 0, "0 (greedy) or more")
    check("top_p", 0 < top_p <= 1, "more than 0, at most 1")
    check("top_k", top_k >= 0, "0 (off) or more")
    check("repetition_penalty", raw.get("repetition_penalty", 1.0) > 0, "more than 0")
    check("seed", 0 <= raw.get("seed", 0) < 2 ** 63, "a whole number from 0 to 2**63 - 1")
    stop = raw.get("stop_sequences", raw.get("stop", []))
    stop = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) and s for s in stop):
        raise RequestError(f"stop sequences must be non-empty strings, not {json.dumps(stop)[:80]}")
    # As LMI >= 0.32: sampling is implied by any sampling knob; temperature 0 means greedy.
    sampling_asked = (("temperature" in raw and temperature > 0) or "top_p" in raw
                      or raw.get("top_k", 0) > 0)
    do_sample = raw.get("do_sample", sampling_asked) and temperature > 0
    return GenerationParams(
        max_new_tokens=max_new_tokens, do_sample=bool(do_sample), temperature=temperature,
        top_p=top_p, top_k=top_k, repetition_penalty=float(raw.get("repetition_penalty", 1.0)),
        seed=raw.get("seed"), stop=tuple(stop), ignore_eos=raw.get("ignore_eos_token", raw.get("ignore_eos", False)),
        return_full_text=raw.get("return_full_text", False), details=raw.get("details", False))


def _jsonlines(event: Any) -> bytes:
    return (json.dumps(event, ensure_ascii=False) + "\n").encode("utf-8")


def _error_message(code: int) -> str:
    return "prediction failure" if code == 424 or code >= 500 else "invalid request"


def _error_body(message: str, code: int) -> dict[str, Any]:
    return {"code": code, "message": _error_message(code), "error": message}


# ---------------------------------------------------------------------------------------------
# The entry point DJL Serving calls
# ---------------------------------------------------------------------------------------------
_generator: TextGenerator | None = None
_load_lock = threading.Lock()


def handle(inputs: Input) -> Output | None:
    global _generator
    if _generator is None:
        with _load_lock:          # DJL may start workers in threads; load once
            if _generator is None:
                _generator = TextGenerator(Settings.from_properties(inputs.get_properties()))
    if inputs.is_empty():         # the warm-up request: loading was all it asked for
        return None
    return serve(_generator, inputs)


def serve(generator: TextGenerator, inputs: Input) -> Output:
    batch = inputs.get_batches()
    outputs = Output()
    requests: list[Request | RequestError] = []
    for item in batch:
        try:
            request = parse_request(item, generator.settings.max_new_tokens)
            generator.check_fits(request)
            requests.append(request)
        except RequestError as exc:
            requests.append(exc)

    only = requests[0]
    if len(batch) == 1 and isinstance(only, Request) and only.stream:
        # Streams go one at a time (DJL streams only batches of one), even when batch_size > 1.
        outputs.add_property("content-type", JSONLINES)
        outputs.add_stream_content(generator.stream(only.prompts[0], only.params),
                                   output_formatter=_jsonlines)
        return outputs
    for index, request in enumerate(requests):
        if isinstance(request, Request) and request.stream and len(batch) > 1:
            requests[index] = RequestError(
                '"stream": true cannot share a dynamic batch; send it with batch_size=1 '
                "in serving.properties (the Spectrum server sends streams alone)")
    _run_batched(generator, [r for r in requests if isinstance(r, Request)], requests)

    if not inputs.is_batch():
        only = requests[0]
        if isinstance(only, RequestError):
            return outputs.error(str(only), code=only.code, message=_error_message(only.code))
        outputs.add_property("content-type", "application/json")
        return outputs.add_as_json(only.answer())
    for index, request in enumerate(requests):
        outputs.add_property(f"batch_{index}_Content-Type", "application/json")
        if isinstance(request, RequestError):
            outputs.add_as_json(_error_body(str(request), request.code), batch_index=index)
        else:
            outputs.add_as_json(request.answer(), batch_index=index)
    return outputs


def _run_batched(generator: TextGenerator, runnable: list[Request],
                 requests: list[Request | RequestError]) -> None:
    """Prompts with equal parameters share generate() calls of up to max_batch_size prompts.
    A failing call fails only the requests whose prompts it held."""
    groups: dict[GenerationParams, list[tuple[Request, int]]] = {}
    for request in runnable:
        for position in range(len(request.prompts)):
            groups.setdefault(request.params, []).append((request, position))
        request.completions = [None] * len(request.prompts)  # type: ignore[list-item]
    failed: dict[int, str] = {}
    size = generator.settings.max_batch_size
    for params, members in groups.items():
        for start in range(0, len(members), size):
            chunk = members[start:start + size]
            try:
                results = generator.generate([r.prompts[p] for r, p in chunk], params)
            except Exception as exc:  # one bad call must not take the batch down
                log.exception("generate failed")
                for request, _ in chunk:
                    failed[id(request)] = f"generation failed: {exc}"
                continue
            for (request, position), completion in zip(chunk, results):
                request.completions[position] = completion
    for index, request in enumerate(requests):
        if isinstance(request, Request) and id(request) in failed:
            requests[index] = RequestError(failed[id(request)], code=424)
