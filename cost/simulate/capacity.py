"""The capacity model of one replica: how long a continuous-batching server's engine steps take.

A replica is one vLLM server. The simulator runs it in engine steps, as vLLM does:

- time advances in engine steps; each step decodes one token for every running sequence and
  prefills up to ``max_num_batched_tokens`` − (running sequences) tokens of admitted prompts,
  first come first served (chunked prefill: a prompt longer than the room left is split over
  several steps). At most ``max_num_seqs`` sequences are admitted at once, and admission stops
  when the KV cache (``kv_cache_tokens``) is full.
- a step takes ``step_s(seqs, kv_tokens, prefill_tokens)`` =
  ``step_base_s + step_per_seq_s·seqs + step_per_kv_token_s·kv_tokens + prefill_per_token_s·prefill_tokens``
  ``+ gemm_s(seqs + prefill_tokens)``, the last a roofline of the weight matmuls (the longer of
  reading the weights and computing with them; see ``CapacityModel.gemm_s``) that a model built
  from specs sets (``cost.hardware``) and a bench fit leaves at 0,
  where ``seqs`` counts every sequence in the step (decoding, or prefilling a chunk),
  ``kv_tokens`` the tokens those sequences hold in the KV cache at the step (a decoding
  sequence: its prompt and the tokens generated so far; a prefilling one: its prompt tokens
  computed so far, this step's chunk included), and ``prefill_tokens`` the prompt tokens this
  step computes. ``step_base_s`` is the intercept; a lone sequence with an empty cache costs
  ``step_base_s + step_per_seq_s``.
- a request's TTFT = its queue wait (with ``async_scheduling``, one step more where it meets a
  busy engine: ``cost.simulate.replica``) + the steps until its prefill is done (its first token comes
  out of the step that finishes its prefill) + ``request_overhead_s`` (what the client sees
  outside engine steps: HTTP, tokenising, detokenising, streaming). Its E2E adds one step per
  further output token.

Two ways to get a model:
- ``fit_capacity`` (``from_bench``, ``load_capacity``): from what ``python -m options.bench
  --profile capacity`` measured on a real server. The fit is non-negative least squares on
  relative errors over every measured point, each point predicted by running the same step
  semantics over the measured request pattern (``wave_terms``): serial requests (TTFT is the
  prefill), bursts of c requests sent at once (their prefill shares the token budget, then c
  sequences decode together: the median request's time per output token), long prompts
  arriving while others decode (TTFT of a prefill inside a decode batch), and, where the profile
  was given a trace (``--replay TRACE``), the server saturated with that trace's request mix
  (the time per output token of the whole server with ``running_seqs`` sequences in the batch:
  each step decodes them all, prefills ``running_seqs × input / output`` prompt tokens to
  replace those finishing, and holds ``running_seqs × (input + output / 2)`` KV tokens). That
  point is the one measurement of capacity itself, where a step model fitted to small bursts
  extrapolates: near capacity, 10-20 % too much of it turned a measured queue of seconds into a
  predicted one of milliseconds. So its relative error weighs as many points as there are others
  (``saturation_weight``: as much as all of them together where each weighs 1).
  Then, at two steady partial loads of that mix (Poisson arrivals at 60 % and 85 % of the
  saturated rate), each request's own time per output token against what its decode steps held,
  requests grouped by the batch they met (``steady_terms``): the regime a replay below capacity
  lives in. Bursts alone misjudge it: over four validation runs (12 profiles, 21 predictions) a
  fit of bursts and saturation predicted E2E at half capacity 15-19 % long in every run, because
  a linear step model drawn between small synchronous bursts and a full batch is too slow in
  between. Each steady group weighs ``STEADY_WEIGHT`` points (compared offline over those runs:
  1 helped less below capacity, 6 made the 130 % predictions worse); weighing the saturation
  point as all of them together instead made 130 % worse again (benchmarks/latency-model/README.md, run 9).
- ``from_throughput``: a stated GPU replica scaled to a measured or assumed output tok/s, for
  when no capacity bench exists (see ``GPU_DEFAULTS``).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from options.core import BadInput

SCHEMA = "spectrum.capacity/1"
PROFILE_SCHEMA = "spectrum.capacity_profile/1"
BENCH_SCHEMA = "spectrum.bench/1"

# The coefficients a fit finds, in the order of a fit row's terms.
COEFFICIENTS = ("step_base_s", "step_per_seq_s", "step_per_kv_token_s", "prefill_per_token_s",
                "request_overhead_s")
LIMITS = ("max_num_seqs", "max_num_batched_tokens", "kv_cache_tokens", "max_model_len")
# The matmul roofline's times (``CapacityModel.gemm_s``): optional, 0 in a bench fit.
ROOFLINE = ("gemm_per_token_s", "weights_read_s", "experts_read_s", "experts_touch_s")
# How closely a fit must reproduce its own points (relative): what --profile capacity checks.
TOLERANCE = {"decode": 0.10, "prefill": 0.15}
# A chat-like request, the mix a throughput figure (from_throughput) is pinned to.
CHAT_INPUT_TOKENS, CHAT_OUTPUT_TOKENS = 1000, 200

# from_throughput's replica: vLLM's OpenAI-server limits on a data-centre GPU, and step
# coefficients shaped like an 8B model in 16-bit weights on one 24 GB GPU (a step reads all
# weights: ~25 ms; 2 FLOPs per weight per token: ~0.13 ms a sequence, ~0.16 ms a prompt token;
# KV reads at 128 KiB a token: ~0.2 µs a token). Only their ratios matter: from_throughput
# scales all four so the saturated output tok/s at the chat mix equals the figure given.
GPU_DEFAULTS = {
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "kv_cache_tokens": 262_144,        # e.g. 32 GiB of KV at 128 KiB a token
    "max_model_len": None,
    "step_base_s": 25e-3,
    "step_per_seq_s": 0.13e-3,
    "step_per_kv_token_s": 0.2e-6,
    "prefill_per_token_s": 0.16e-3,
    "request_overhead_s": 3e-3,        # HTTP + tokenising on the replica; not scaled
}


@dataclass(frozen=True)
class CapacityModel:
    """One replica's engine steps and limits (see the module docstring for the step semantics)."""
    step_base_s: float            # a step's fixed cost (batch of 1, empty KV)
    step_per_seq_s: float         # added per running sequence in the step
    step_per_kv_token_s: float    # added per token held in the KV cache across the batch (attention reads)
    prefill_per_token_s: float    # added per prompt token prefilled in the step
    max_num_seqs: int             # most sequences running at once (vLLM max_num_seqs)
    max_num_batched_tokens: int   # most tokens (prefill + decode) in one step
    kv_cache_tokens: int          # KV cache size in tokens (admission stops when full)
    max_model_len: int | None
    request_overhead_s: float     # fixed client-visible latency per request outside engine steps (HTTP, tokenise, detokenise)
    source: str                   # "bench FILE (fitted from N points)" or "--capacity 1500 tok/s with defaults ..."
    fit: dict = field(default_factory=dict, compare=False)   # the fit's points and residuals, may be {}
    # The weight matrices' roofline (``gemm_s``), set by a model built from specs
    # (``cost.hardware``); all 0 in a bench fit, whose linear terms absorb it.
    gemm_per_token_s: float = 0.0  # matmul compute per token in the step (2 FLOPs a weight / achieved FLOP/s)
    weights_read_s: float = 0.0    # reading the weights every token uses (dense layers, shared experts)
    experts_read_s: float = 0.0    # reading every routed expert once (MoE); a step reads those its tokens touch
    experts_touch_s: float = 0.0   # the fused-MoE kernels' cost of touching every routed expert once, beyond
                                   # their reads (a tile pipeline to fill per expert); paid for those touched
    experts: int = 0               # routed experts per MoE layer (0: dense)
    experts_per_token: int = 0     # experts each token is routed to
    # The share of request_overhead_s the front end spends on each request one at a time (vLLM's
    # API server runs one event loop), so requests sent together reach the engine spread out.
    # Set by a model built from specs; the replica (cost.simulate.replica) spends it before its
    # engine sees a request. 0 in a bench fit.
    frontend_request_s: float = 0.0
    # The share of prompt tokens vLLM's prefix cache serves (its prefix_cache_hits /
    # prefix_cache_queries): a prompt's leading tokens found cached are not computed again, so
    # they take none of a step's token budget or prefill time, though its new tokens still
    # attend over them and the request still holds its whole prompt in the KV cache. A traffic
    # property (shared system prompts, multi-turn chats, agents re-sending their context) given
    # with --prefix-cache-hit-rate; 0 (every prompt new) where not given, as a capacity bench
    # measures it (its prompts are unique).
    prefix_cache_hit_rate: float = 0.0
    # vLLM's async scheduling (its default since 0.14.0): the engine schedules each step while the
    # one before it runs, so a request reaching a busy engine joins one step later than a
    # synchronous scheduler would take it (cost.simulate.replica). Set by a model built from
    # specs; False in a bench fit, whose measured steps and waits already carry the server's own.
    async_scheduling: bool = False

    def __post_init__(self) -> None:
        for name in COEFFICIENTS:
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value) or value < 0:
                raise BadInput(f"capacity model: {name} = {value!r} must be a finite number >= 0 (seconds)")
        for name in LIMITS:
            value = getattr(self, name)
            if value is None and name == "max_model_len":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BadInput(f"capacity model: {name} = {value!r} must be a whole number >= 1")
        for name in ROOFLINE:
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value) or value < 0:
                raise BadInput(f"capacity model: {name} = {value!r} must be a finite number >= 0 (seconds)")
        if not (_is_number(self.frontend_request_s) and 0 <= self.frontend_request_s <= self.request_overhead_s):
            raise BadInput(f"capacity model: frontend_request_s = {self.frontend_request_s!r} must be a number "
                           f"from 0 to request_overhead_s ({self.request_overhead_s!r}): it is a share of it")
        check_hit_rate(self.prefix_cache_hit_rate, "capacity model: prefix_cache_hit_rate")
        if not isinstance(self.async_scheduling, bool):
            raise BadInput(f"capacity model: async_scheduling = {self.async_scheduling!r} must be true or false")
        if (self.experts_read_s or self.experts_touch_s) and not (0 < self.experts_per_token <= self.experts):
            raise BadInput("capacity model: experts_read_s or experts_touch_s is set, so experts "
                           f"({self.experts!r}) and "
                           f"experts_per_token ({self.experts_per_token!r}) must satisfy 0 < top-k <= experts")
        if self.step_s(1, 1, 0) <= 0:
            raise BadInput("capacity model: every coefficient is 0, so a step would take no time")

    @property
    def outside_replica_s(self) -> float:
        """The request overhead the client sees on top of the replica's times: all of it but the
        front end's share, which the replica itself spends before its engine sees the request."""
        return self.request_overhead_s - self.frontend_request_s

    def cached_prompt_tokens(self, prompt_tokens: float) -> float:
        """Of a prompt, the leading tokens the prefix cache serves: ``prefix_cache_hit_rate`` of
        it, whole tokens, at most all but the last (vLLM always computes a prompt's last token,
        whose logits give the first output token)."""
        if not self.prefix_cache_hit_rate or prompt_tokens <= 1:
            return 0
        return min(math.floor(prompt_tokens * self.prefix_cache_hit_rate), math.ceil(prompt_tokens) - 1)

    def with_prefix_cache(self, hit_rate: float | None) -> "CapacityModel":
        """The same replica serving traffic whose prompts the prefix cache serves ``hit_rate``
        of (None: as it was; 0: no reuse, whatever the model carried)."""
        if hit_rate is None or hit_rate == self.prefix_cache_hit_rate:
            return self
        check_hit_rate(hit_rate, "--prefix-cache-hit-rate")
        return replace(self, prefix_cache_hit_rate=float(hit_rate), source=self.source + reuse_note(hit_rate))

    # --- the step ----------------------------------------------------------------------------

    def step_s(self, seqs: int, kv_tokens: int, prefill_tokens: int) -> float:
        """How long one engine step takes (see the module docstring for what each count means)."""
        return (self.step_base_s + self.step_per_seq_s * seqs + self.step_per_kv_token_s * kv_tokens
                + self.prefill_per_token_s * prefill_tokens + self.gemm_s(seqs + prefill_tokens))

    def gemm_s(self, tokens: float) -> float:
        """The weight matmuls of a step of ``tokens`` tokens: the longer of reading the weights
        and computing with them (a roofline). Reading covers the dense weights and, of a MoE's
        routed experts, the share its tokens touch: with top-k of E experts per token, a step of
        t tokens touches 1 − (1 − k/E)^t of them, in expectation over uniform routing. A prefilling
        sequence counts one token more than its chunk (``seqs + prefill_tokens``): a rounding
        the step's hundreds of tokens hide. Each expert touched also costs ``experts_touch_s``
        / experts beside the roofline: the fused-MoE kernels' time per expert that neither its
        bytes nor its FLOPs account for (public kernel timings: benchmarks/capacity-calibration)."""
        if not (self.gemm_per_token_s or self.weights_read_s or self.experts_read_s or self.experts_touch_s):
            return 0.0
        touched = experts_touched(self.experts, self.experts_per_token, tokens) if self.experts else 0.0
        read = self.weights_read_s + self.experts_read_s * touched
        return max(read, self.gemm_per_token_s * tokens) + self.experts_touch_s * touched

    def coefficients(self) -> tuple[float, ...]:
        return tuple(getattr(self, name) for name in COEFFICIENTS)

    def idle_ttft_s(self, prompt_tokens: float) -> float:
        """TTFT of one request on an idle replica: its prefill steps and the request overhead."""
        done = self.cached_prompt_tokens(prompt_tokens)
        ttft = self.request_overhead_s
        while True:                    # its chunks, one step each (at least one step)
            chunk = min(prompt_tokens - done, self.max_num_batched_tokens)
            done += chunk
            ttft += self.step_s(1, done, chunk)
            if done >= prompt_tokens:
                return ttft

    def saturated_output_tok_s(self, input_tokens: float, output_tokens: float) -> float:
        """Steady-state output tokens/s with the batch full, for requests of these mean sizes.

        The batch holds B sequences: ``max_num_seqs``, fewer where the KV cache cannot hold B
        whole requests (prompt + answer) or where one step's token budget cannot hold B decode
        tokens plus the prefill that replaces finishing sequences. Each sequence stays ``output``
        steps (its first token comes out of its prefill step), so per step B·input/output prompt
        tokens are prefilled and the cache holds B·(input + output/2) tokens on average; B
        tokens come out of every step.
        """
        if not (_is_number(input_tokens) and input_tokens >= 0 and math.isfinite(input_tokens)):
            raise BadInput(f"input_tokens {input_tokens!r} must be a finite number >= 0")
        if not (_is_number(output_tokens) and output_tokens >= 1 and math.isfinite(output_tokens)):
            raise BadInput(f"output_tokens {output_tokens!r} must be a finite number >= 1")
        computed = input_tokens - self.cached_prompt_tokens(input_tokens)     # prompt tokens a step computes
        batch = float(self.max_num_seqs)
        batch = min(batch, self.kv_cache_tokens / (input_tokens + output_tokens))
        batch = min(batch, self.max_num_batched_tokens / (1 + computed / output_tokens))
        batch = max(batch, 1.0)
        tokens_per_step = batch * (1 + computed / output_tokens)
        return 1.0 / (_dot(saturation_terms(batch, input_tokens, output_tokens, computed), self.coefficients())
                      + self.gemm_s(tokens_per_step) / batch)

    def steady_tpot_s(self, point: dict[str, Any]) -> float:
        """The time per output token this model gives a measured ``steady`` point (its
        ``steady_terms``): what a request decoding beside that batch takes a token."""
        prefill = point["prefill_tokens_per_s"] * point["tpot_s"]
        return (_dot(steady_terms(point["decoding_seqs"], point["kv_tokens"], point["prefill_tokens_per_s"],
                                  point["tpot_s"]), self.coefficients())
                + self.gemm_s(point["decoding_seqs"] + prefill))

    def with_step_speed(self, factor: float, source: str | None = None) -> "CapacityModel":
        """The same server with every step ``factor`` times as fast (its saturated rate times
        ``factor``); the per-request overhead and the limits unchanged."""
        return replace(self, **{k: getattr(self, k) / factor for k in COEFFICIENTS + ROOFLINE
                                if k != "request_overhead_s"},
                       source=source or f"{self.source}, steps x{factor:g} as fast")

    def describe(self) -> str:
        """One line for tables: the coefficients in readable units and the limits."""
        return (f"step {self.step_base_s * 1e3:.3g} ms + {self.step_per_seq_s * 1e3:.3g} ms/seq + "
                f"{self.step_per_kv_token_s * 1e6:.3g} µs/KV token + {self.prefill_per_token_s * 1e6:.3g} µs/prompt "
                f"token; overhead {self.request_overhead_s * 1e3:.3g} ms; ≤ {self.max_num_seqs} seqs, "
                f"{self.max_num_batched_tokens:,} tokens/step, KV {self.kv_cache_tokens:,} tokens"
                + (f", max_model_len {self.max_model_len:,}" if self.max_model_len else "")
                + (f"; matmuls max({self.weights_read_s * 1e3:.3g} ms read"
                   + (f" + {self.experts_read_s * 1e3:.3g} ms × experts touched" if self.experts_read_s else "")
                   + f", {self.gemm_per_token_s * 1e6:.3g} µs/token)"
                   + (f" + {self.experts_touch_s * 1e3:.3g} ms × experts touched" if self.experts_touch_s else "")
                   if self.gemm_s(1) else "")
                + (f"; {self.prefix_cache_hit_rate:.0%} of prompt tokens cached" if self.prefix_cache_hit_rate else ""))

    # --- JSON --------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    @classmethod
    def from_json(cls, doc: Any, where: str = "capacity model") -> "CapacityModel":
        """From ``to_json``'s dict; BadInput naming ``where`` and the first missing or bad key."""
        if not isinstance(doc, dict):
            raise BadInput(f"{where} must be a JSON object, not {type(doc).__name__}")
        if doc.get("schema", SCHEMA) != SCHEMA:
            raise BadInput(f"{where} has schema {doc.get('schema')!r}; expected {SCHEMA!r}")
        required = COEFFICIENTS + LIMITS
        missing = [k for k in required if k not in doc]
        if missing:
            raise BadInput(f"{where} has no {missing[0]!r}" + (f" (nor {', '.join(map(repr, missing[1:]))})"
                                                                if len(missing) > 1 else "")
                           + f": a capacity model needs {', '.join(required)}")
        roofline = {k: doc[k] for k in ROOFLINE + ("experts", "experts_per_token", "frontend_request_s",
                                              "prefix_cache_hit_rate", "async_scheduling")
                    if doc.get(k) is not None}
        try:
            return cls(**{k: doc[k] for k in required}, **roofline,
                       source=str(doc.get("source") or where), fit=dict(doc.get("fit") or {}))
        except BadInput as exc:
            raise BadInput(f"{where}: {exc}") from None

    @classmethod
    def from_bench(cls, doc: Any, origin: str) -> "CapacityModel":
        """From a ``spectrum.bench/1`` document: its ``capacity_model``, else a fit of its
        ``capacity_profile``, else (an older bench with only a throughput) ``from_throughput``
        on its ``metrics.output_tokens_per_second``."""
        where = f"bench {origin}"
        if not isinstance(doc, dict):
            raise BadInput(f"{where} must be a JSON object, not {type(doc).__name__}")
        if "capacity_model" in doc:
            model = cls.from_json(doc["capacity_model"], f"{where}: capacity_model")
            points = len((model.fit or {}).get("points") or [])
            return replace(model, source=f"bench {origin} (fitted from {points} points)")
        if "capacity_profile" in doc:
            return fit_capacity(doc["capacity_profile"], origin)
        tps = (doc.get("metrics") or {}).get("output_tokens_per_second")
        if _is_number(tps) and math.isfinite(tps) and tps > 0:
            return cls.from_throughput(float(tps), f"bench {origin} (its output tok/s only, measured at "
                                                   f"{_load_of(doc)}: no capacity_profile)")
        raise BadInput(f"{where} has no 'capacity_model', 'capacity_profile' or "
                       "'metrics.output_tokens_per_second': measure one with `python -m options.bench "
                       "--profile capacity --json FILE`")

    @classmethod
    def from_throughput(cls, output_tok_s: float, origin: str) -> "CapacityModel":
        """A GPU replica (``GPU_DEFAULTS``: ≤ 256 sequences, 8,192 tokens a step, a 262,144-token KV
        cache, step coefficients shaped like an 8B model on one 24 GB GPU) with its step
        coefficients scaled so that ``saturated_output_tok_s(1000, 200)`` equals ``output_tok_s``;
        the request overhead stays 3 ms."""
        if not (_is_number(output_tok_s) and math.isfinite(output_tok_s) and output_tok_s > 0):
            raise BadInput(f"{origin}: output tok/s {output_tok_s!r} must be a number > 0")
        shape = cls(**GPU_DEFAULTS, source="shape")
        factor = output_tok_s / shape.saturated_output_tok_s(CHAT_INPUT_TOKENS, CHAT_OUTPUT_TOKENS)
        return shape.with_step_speed(factor, source=(
            f"{origin}: {output_tok_s:,.0f} output tok/s at saturation for {CHAT_INPUT_TOKENS:,} in / "
            f"{CHAT_OUTPUT_TOKENS} out, with defaults for a GPU replica (max_num_seqs "
            f"{GPU_DEFAULTS['max_num_seqs']}, max_num_batched_tokens {GPU_DEFAULTS['max_num_batched_tokens']:,}, "
            f"KV cache {GPU_DEFAULTS['kv_cache_tokens']:,} tokens, step costs shaped like an 8B model on "
            f"one 24 GB GPU, overhead {GPU_DEFAULTS['request_overhead_s'] * 1e3:g} ms)"))


# --- reading a file --------------------------------------------------------------------------

def experts_touched(experts: int, experts_per_token: int, tokens: float) -> float:
    """The share of a MoE layer's routed experts a step of ``tokens`` tokens touches, each token
    picking ``experts_per_token`` of ``experts``: 1 − (1 − k/E)^t, in expectation over uniform routing."""
    return 1.0 - (1.0 - experts_per_token / experts) ** tokens


def load_capacity(path: str | Path) -> CapacityModel:
    """A capacity model from a bench JSON file (``python -m options.bench --profile capacity
    --json FILE``) or a saved ``CapacityModel.to_json``; BadInput naming the file and what is
    missing."""
    path = Path(path)
    where = f"capacity file {str(path)!r}"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"{where} does not exist (write one with `python -m options.bench --profile "
                       "capacity --json FILE`)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(f"{where} is not readable JSON: {exc}") from None
    if isinstance(doc, dict) and doc.get("schema") == SCHEMA:
        return CapacityModel.from_json(doc, where)
    if not isinstance(doc, dict) or doc.get("schema") != BENCH_SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise BadInput(f"{where} is neither a bench result (\"schema\": \"{BENCH_SCHEMA}\") nor a "
                       f"capacity model (\"schema\": \"{SCHEMA}\"); got {got!r}")
    return CapacityModel.from_bench(doc, str(path))


# --- the fit ---------------------------------------------------------------------------------

def wave_terms(requests: int, prompt_tokens: float, output_tokens: int, max_num_batched_tokens: int,
               max_num_seqs: int, background_seqs: int = 0, background_kv: float = 0.0):
    """``requests`` identical requests reaching an engine at the same instant, run through the
    module's step semantics; for each request the terms (one per coefficient, in
    ``COEFFICIENTS`` order) of its TTFT and of its time per output token after the first.

    The schedule (which sequences and tokens each step holds) does not depend on how long steps
    take, so every latency is a fixed combination of the coefficients: a dot product of these
    terms with them. ``background_seqs`` sequences holding ``background_kv`` tokens keep
    decoding beside them throughout (the mixed point: a prompt arriving while others decode).
    """
    ttft = [[0.0] * 5 for _ in range(requests)]
    decode = [[0.0] * 5 for _ in range(requests)]
    done = [0.0] * requests            # prompt tokens computed so far
    made = [0] * requests              # output tokens so far
    admitted = 0                       # requests admitted (FCFS) so far
    bg_kv = background_kv
    while any(m < output_tokens for m in made):
        decoding = [i for i in range(admitted) if done[i] >= prompt_tokens and made[i] < output_tokens]
        # Admit while sequences may be added; prefilling ones share what is left of the budget.
        while admitted < requests and admitted + background_seqs - sum(
                1 for i in range(admitted) if made[i] >= output_tokens) < max_num_seqs:
            admitted += 1
        room = max_num_batched_tokens - len(decoding) - background_seqs
        chunks: dict[int, float] = {}
        for i in range(admitted):
            if done[i] < prompt_tokens and room > 0:
                chunks[i] = min(prompt_tokens - done[i], room)
                room -= chunks[i]
        if not chunks and not decoding:
            raise BadInput(f"max_num_batched_tokens {max_num_batched_tokens} leaves no room to prefill "
                           f"beside {background_seqs} running sequences")
        seqs = len(decoding) + len(chunks) + background_seqs
        kv = (sum(prompt_tokens + made[i] for i in decoding) + sum(done[i] + c for i, c in chunks.items())
              + bg_kv)
        step = (1.0, float(seqs), float(kv), float(sum(chunks.values())), 0.0)
        for i in range(requests):
            if made[i] >= output_tokens:
                continue
            if i in decoding:
                _add(decode[i], step)
            elif made[i] == 0:          # waiting or prefilling: the step delays its first token
                _add(ttft[i], step)
        for i in decoding:
            made[i] += 1
        for i, c in chunks.items():
            done[i] += c
            if done[i] >= prompt_tokens:
                made[i] = 1             # the step that finishes a prefill gives the first token
        bg_kv += background_seqs
    for t in ttft:
        t[4] += 1.0                     # the request overhead, once per request
    per_token = [[x / (output_tokens - 1) for x in d] if output_tokens > 1 else d for d in decode]
    return ttft, per_token


def saturation_terms(batch: float, input_tokens: float, output_tokens: float,
                     computed_input_tokens: float | None = None) -> list[float]:
    """The terms of the time per output token of a server whose batch stays full with
    ``batch`` sequences of these mean sizes: each step decodes them all, prefills the
    ``batch × computed / output`` prompt tokens that replace the finishing ones (``computed``: the
    prompt less what the prefix cache serves; all of it by default), and holds
    ``batch × (input + output / 2)`` KV tokens; ``batch`` tokens come out of it."""
    b, i, o = batch, input_tokens, output_tokens
    c = i if computed_input_tokens is None else computed_input_tokens
    return [1.0 / b, 1.0, i + o / 2, c / o, 0.0]


def reuse_note(hit_rate: float) -> str:
    """What a capacity's source adds for the prompts the prefix cache serves ('' for none)."""
    return f"; {hit_rate:.0%} of prompt tokens from the prefix cache" if hit_rate else ""


def check_hit_rate(value: Any, what: str) -> None:
    """A prefix-cache hit rate is a share of prompt tokens: from 0 up to, not including, 1."""
    if not (_is_number(value) and 0 <= value < 1):
        raise BadInput(f"{what} {value!r} must be a number from 0 up to (not including) 1: the share of prompt "
                       "tokens vLLM's prefix cache serves (its prefix_cache_hits / prefix_cache_queries; "
                       "a prompt's last token is always computed)")


def steady_terms(decoding_seqs: float, kv_tokens: float, prefill_tokens_per_s: float,
                 tpot_s: float) -> list[float]:
    """The terms of the time per output token of requests decoding beside ``decoding_seqs``
    sequences (themselves included) that hold ``kv_tokens`` KV tokens, while prompts are prefilled
    at ``prefill_tokens_per_s``: each of their steps is ``step_s(seqs, kv, prefill)``, and the
    prompt tokens one of their steps carries on average are that rate times the step, the
    measured time per token (so the row stays linear in the coefficients)."""
    return [1.0, decoding_seqs, kv_tokens, prefill_tokens_per_s * tpot_s, 0.0]


# Steady points from open-loop requests (``group_by_batch``): at most this many groups, each of
# at least STEADY_MIN_GROUP requests; answers shorter than STEADY_MIN_OUTPUT tokens say no time
# per token; each request's decode is sampled at STEADY_SAMPLES instants.
STEADY_GROUPS = 6
STEADY_MIN_GROUP = 12
STEADY_MIN_OUTPUT = 8
STEADY_SAMPLES = 32


def group_by_batch(sent_s, ttft_s, e2e_s, input_tokens, output_tokens, groups: int = STEADY_GROUPS,
                   min_group: int = STEADY_MIN_GROUP, samples: int = STEADY_SAMPLES,
                   by: str = "batch") -> list[dict[str, Any]]:
    """Answered open-loop requests grouped by the batch their decode met: ``steady`` points.
    ``by="sent"`` cuts them in the order they were sent instead (each point then says the span
    of send times it covers, ``sent_from_s`` / ``sent_to_s``): how the server's speed moved over
    time, whatever batch each request met.

    Per request (parallel sequences; a request with any of its times or sizes None is left out):
    its decode runs from its first token to its last (send + TTFT, send + E2E, client times). At
    ``samples`` instants evenly inside it: how many requests were decoding (it included), and
    their KV tokens (prompt, plus the answer so far, taken as even over the decode). Prompt tokens
    prefilled a second: those of the requests whose first token came while it decoded. Requests
    with at least ``STEADY_MIN_OUTPUT`` tokens are sorted by their batch and cut into ``groups``
    groups of equal size (fewer where a group would have under ``min_group``); a point is a
    group's means, and its median time per output token.
    """
    import numpy as np

    if by not in ("batch", "sent"):
        raise ValueError(f"group_by_batch: by={by!r} is not 'batch' or 'sent'")
    done = [(s, f, e, i, o) for s, f, e, i, o in zip(sent_s, ttft_s, e2e_s, input_tokens, output_tokens)
            if s is not None and f is not None and e is not None and i is not None and o]
    if not done:
        return []
    first = np.array([s + f for s, f, _, _, _ in done])
    last = np.array([s + e for s, _, e, _, _ in done])
    prompt = np.array([i for _, _, _, i, _ in done], dtype=float)
    answer = np.array([o for _, _, _, _, o in done], dtype=float)
    rows = []
    for j in range(len(done)):
        if answer[j] < max(2, STEADY_MIN_OUTPUT) or last[j] <= first[j]:
            continue
        at = first[j] + (np.arange(samples)[:, None] + 0.5) / samples * (last[j] - first[j])
        live = (first[None, :] <= at) & (last[None, :] > at)
        made = answer * np.clip((at - first) / np.maximum(last - first, 1e-9), 0.0, 1.0)
        kv = np.where(live, prompt + made, 0.0).sum(axis=1)
        arrived = (first > first[j]) & (first <= last[j])
        tpot = (last[j] - first[j]) / (answer[j] - 1)
        rows.append((live.sum(axis=1).mean(), kv.mean(), prompt[arrived].sum() / (last[j] - first[j]), tpot,
                     done[j][0]))
    count = min(groups, len(rows) // min_group)
    if count < 1:
        return []
    rows.sort(key=(lambda row: row[4]) if by == "sent" else None)
    points = []
    for part in np.array_split(np.array(rows), count):
        point = {"kind": "steady", "decoding_seqs": float(part[:, 0].mean()),
                 "kv_tokens": float(part[:, 1].mean()), "prefill_tokens_per_s": float(part[:, 2].mean()),
                 "tpot_s": float(np.median(part[:, 3])), "requests": len(part),
                 "decoding_seqs_min": float(part[:, 0].min()), "decoding_seqs_max": float(part[:, 0].max())}
        if by == "sent":
            point.update(sent_from_s=float(part[:, 4].min()), sent_to_s=float(part[:, 4].max()))
        points.append(point)
    return points


def point_terms(point: dict[str, Any], limits: dict[str, Any]) -> list[float]:
    """The terms of one measured point's latency (a fit row), from its kind and sizes."""
    budget, seqs_cap = limits["max_num_batched_tokens"], limits["max_num_seqs"]
    kind = point["kind"]
    if kind == "prefill":               # serial requests: TTFT is overhead + the prefill steps
        ttft, _ = wave_terms(1, point["prompt_tokens"], 1, budget, seqs_cap)
        return ttft[0]
    if kind == "decode":                # a burst of c: the median request's time per output token
        _, per_token = wave_terms(int(point["requests"]), point["prompt_tokens"], int(point["output_tokens"]),
                                  budget, seqs_cap)
        return _median_terms(per_token)
    if kind == "mixed":                 # a prompt arriving during others' decode steps
        ttft, _ = wave_terms(1, point["prompt_tokens"], 1, budget, seqs_cap,
                             background_seqs=int(point["background_seqs"]),
                             background_kv=point["background_kv_tokens"])
        # It arrives at a random moment of a running step: on average half a step before its own.
        waiting = [0.5, 0.5 * point["background_seqs"], 0.5 * point["background_kv_tokens"], 0.0, 0.0]
        return [a + b for a, b in zip(ttft[0], waiting)]
    if kind == "saturation":            # the whole server's time per output token, batch full
        return saturation_terms(point["running_seqs"], point["input_tokens"], point["output_tokens"])
    if kind == "steady":                # requests' time per output token at a steady partial load
        return steady_terms(point["decoding_seqs"], point["kv_tokens"], point["prefill_tokens_per_s"],
                            point["tpot_s"])
    raise BadInput(f"capacity_profile point kind {kind!r} is not one of {', '.join(KINDS)}")


MEASURED = {"prefill": "ttft_s", "decode": "step_s", "mixed": "ttft_s", "saturation": "token_s",
            "steady": "tpot_s"}
NEEDS = {"prefill": ("prompt_tokens", "ttft_s"),
         "decode": ("requests", "prompt_tokens", "output_tokens", "step_s"),
         "mixed": ("background_seqs", "background_kv_tokens", "prompt_tokens", "ttft_s"),
         "saturation": ("running_seqs", "input_tokens", "output_tokens", "token_s"),
         "steady": ("decoding_seqs", "kv_tokens", "prefill_tokens_per_s", "tpot_s")}
KINDS = tuple(MEASURED)
# A steady group's weight in the fit (see the module docstring).
STEADY_WEIGHT = 3.0


def saturation_weight(points: int) -> float:
    """The saturation point's weight in the fit (on its relative error): its square is the
    number of the other points, so it counts as much as all of them together where each weighs 1
    (steady groups weigh more: ``STEADY_WEIGHT``)."""
    return math.sqrt(max(1, points))


def _weights(points: list[dict[str, Any]]) -> list[float]:
    """Each point's weight on its relative error: saturation ``saturation_weight``, a steady
    group ``STEADY_WEIGHT``, any other 1."""
    others = len(points) - 1
    return [saturation_weight(others) if p["kind"] == "saturation" else STEADY_WEIGHT if p["kind"] == "steady"
            else 1.0 for p in points]


def fit_capacity(profile: dict, origin: str) -> CapacityModel:
    """Fit the step coefficients and the request overhead to a capacity profile (what
    ``python -m options.bench --profile capacity`` writes as ``capacity_profile``).

    Non-negative least squares on relative errors (every point counts by its error in percent,
    so a 2 ms step and a 40 ms TTFT weigh alike), coefficients kept >= 0. ``fit`` holds every
    point with its prediction and residual, the worst residual per kind, and whether they are
    within ``TOLERANCE``.
    """
    import numpy as np

    where = f"bench {origin}: capacity_profile"
    if not isinstance(profile, dict):
        raise BadInput(f"{where} must be a JSON object, not {type(profile).__name__}")
    for key in ("limits", "points"):
        if key not in profile:
            raise BadInput(f"{where} has no {key!r}")
    limits = profile["limits"]
    for key in LIMITS:
        if not isinstance(limits, dict) or key not in limits:
            raise BadInput(f"{where}.limits has no {key!r}")
    points = [p for p in profile["points"] if isinstance(p, dict)]
    for n, point in enumerate(points):
        kind = point.get("kind")
        if kind not in NEEDS:
            raise BadInput(f"{where}.points[{n}] has kind {kind!r}: expected one of {', '.join(KINDS)}")
        for key in NEEDS[kind]:
            value = point.get(key)
            if not _is_number(value) or not math.isfinite(value) or value < 0:
                raise BadInput(f"{where}.points[{n}] ({kind}) has no number {key!r} (got {value!r})")
        if not point[MEASURED[kind]] > 0:
            raise BadInput(f"{where}.points[{n}] ({kind}): {MEASURED[kind]} must be > 0")
        if kind == "saturation" and not (point["running_seqs"] >= 1 and point["output_tokens"] >= 1):
            raise BadInput(f"{where}.points[{n}] (saturation) needs running_seqs >= 1 and "
                           "output_tokens >= 1")
        if kind == "steady" and not point["decoding_seqs"] >= 1:
            raise BadInput(f"{where}.points[{n}] (steady) needs decoding_seqs >= 1 (the request itself "
                           f"decodes), got {point['decoding_seqs']!r}")
        if kind == "decode" and not (point["requests"] >= 1 and point["output_tokens"] >= 2):
            raise BadInput(f"{where}.points[{n}] (decode) needs requests >= 1 and output_tokens >= 2 "
                           f"(a time per output token after the first)")
    kinds = {p["kind"] for p in points}
    if not {"prefill", "decode"} <= kinds:
        raise BadInput(f"{where} needs prefill and decode points to fit a step model (has: "
                       f"{', '.join(sorted(kinds)) or 'none'})")
    rows = np.array([point_terms(p, limits) for p in points], dtype=float)
    measured = np.array([p[MEASURED[p["kind"]]] for p in points], dtype=float)
    weights = np.array(_weights(points))
    coef = _nonnegative_least_squares(rows / measured[:, None] * weights[:, None], weights)
    values = {name: float(v) for name, v in zip(COEFFICIENTS, coef)}
    if values["step_base_s"] + values["step_per_seq_s"] <= 0:
        raise BadInput(f"{where}: the points give no positive step time (measured: {measured.tolist()})")
    predicted = rows @ coef
    fitted = []
    for point, pred, meas in zip(points, predicted, measured):
        fitted.append({**point, "measured_s": float(meas), "predicted_s": float(pred),
                       "residual": float(pred / meas - 1)})
    worst = {kind: max(abs(p["residual"]) for p in fitted if p["kind"] == kind) for kind in sorted(kinds)}
    check = {kind: {"tolerance": tol, "worst": worst[kind], "ok": worst[kind] <= tol}
             for kind, tol in TOLERANCE.items() if kind in worst}
    fit = {"method": "non-negative least squares on relative errors"
                     + (", the saturation point weighted as many points as there are others"
                        if "saturation" in kinds else "")
                     + (f", each steady group as {STEADY_WEIGHT:g} points" if "steady" in kinds else ""),
           "points": fitted, "worst_residual": worst,
           "rms_residual": float(np.sqrt(np.mean((predicted / measured - 1) ** 2))),
           "check": check, "within_tolerance": all(c["ok"] for c in check.values())}
    lim = {k: limits[k] for k in LIMITS}
    try:
        return CapacityModel(**values, **lim, source=f"bench {origin} (fitted from {len(points)} points)", fit=fit)
    except BadInput as exc:
        raise BadInput(f"{where}.limits: {exc}") from None


def _nonnegative_least_squares(a, b):
    """argmin ‖a·x − b‖ with x >= 0, exactly, for a handful of columns: the best unconstrained
    solution over every subset of columns whose coefficients all come out >= 0 (the active-set
    answer, found by trying all 2^n − 1 sets; n = 5 here)."""
    import numpy as np

    n = a.shape[1]
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a = a / scale                     # columns of ~1e-3 and ~1e-7 s alike: keep lstsq well conditioned
    best, best_x = math.inf, np.zeros(n)
    for mask in range(1, 2 ** n):
        cols = [j for j in range(n) if mask >> j & 1]
        x_cols, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
        if (x_cols < 0).any():
            continue
        x = np.zeros(n)
        x[cols] = x_cols
        cost = float(np.sum((a @ x - b) ** 2))
        if cost < best - 1e-15:
            best, best_x = cost, x
    return best_x / scale


# --- small helpers ---------------------------------------------------------------------------

def _median_terms(rows: list[list[float]]) -> list[float]:
    """The terms of the median request (by its total time per token): the middle one's, or the
    mean of the middle two. Requests of a burst are ordered by admission, and their latency by
    it too, so the middle of the admission order is the median."""
    n = len(rows)
    mid = rows[(n - 1) // 2], rows[n // 2]
    return [(a + b) / 2 for a, b in zip(*mid)]


def _add(acc: list[float], step: tuple[float, ...]) -> None:
    for j, v in enumerate(step):
        acc[j] += v


def _dot(terms, coef) -> float:
    return float(sum(t * c for t, c in zip(terms, coef)))


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _load_of(doc: dict[str, Any]) -> str:
    profile = doc.get("profile") or {}
    if profile.get("request_rate") is not None:
        return f"{profile['request_rate']:g} req/s"
    return f"concurrency {profile.get('concurrency')}"
