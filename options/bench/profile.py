"""A traffic profile: how many requests, how long their prompts and answers, and when they arrive.

Everything random comes from one seeded generator, so a profile and a seed give the same
requests in the same order at the same offsets on every run and every rung. The prompts' text
differs between runs in one place only: each starts with the run's ``RUN_TAG``.
"""
from __future__ import annotations

import argparse
import json
import random
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from options.core import BadInput

# Short common words: one token each for most tokenizers, so a prompt of N words is about N
# tokens. The exact count is the server's (usage.prompt_tokens), never this estimate.
_WORDS = ("the of and to in is for on that with as by at from it this be are was or an not "
          "time data model user cost token price cloud fast small large first last next each "
          "one two three four five six seven eight nine ten run send serve wait read write").split()


@dataclass(frozen=True)
class Lengths:
    """A token-length distribution: fixed N, uniform over [low, high], or values from JSONL."""
    kind: str                      # "fixed" | "uniform" | "jsonl"
    low: int = 0
    high: int = 0
    path: str | None = None
    values: tuple[int, ...] = ()   # jsonl: the lengths, in file order
    texts: tuple[str, ...] = ()    # jsonl: prompt texts, where the file gives them

    def sample(self, rng: random.Random, i: int) -> int:
        if self.kind == "fixed":
            return self.low
        if self.kind == "uniform":
            return rng.randint(self.low, self.high)
        return self.values[i % len(self.values)]

    def to_json(self) -> dict[str, Any]:
        if self.kind == "fixed":
            return {"kind": "fixed", "value": self.low}
        if self.kind == "uniform":
            return {"kind": "uniform", "low": self.low, "high": self.high}
        return {"kind": "jsonl", "path": self.path, "count": len(self.values),
                "mean": sum(self.values) / len(self.values)}


def parse_lengths(spec: str, what: str, jsonl_fields: tuple[str, ...]) -> Lengths:
    """``fixed:N`` (or just ``N``), ``uniform:LOW:HIGH``, or ``jsonl:FILE``."""
    usage = f"{what} must be N, fixed:N, uniform:LOW:HIGH or jsonl:FILE (got {spec!r})"
    kind, _, rest = spec.partition(":")
    if kind.isdigit() and not rest:
        kind, rest = "fixed", kind
    def ints(text: str, n: int) -> list[int]:
        parts = text.split(":")
        if len(parts) != n or not all(x.strip().isdigit() for x in parts):
            raise BadInput(usage)
        return [int(x) for x in parts]

    if kind == "fixed":
        (n,) = ints(rest, 1)
        if n < 1:
            raise BadInput(f"{what} fixed:{n} must be at least 1")
        return Lengths("fixed", n, n)
    if kind == "uniform":
        low, high = ints(rest, 2)
        if not 1 <= low <= high:
            raise BadInput(f"{what} uniform:{low}:{high} needs 1 <= LOW <= HIGH")
        return Lengths("uniform", low, high)
    if kind == "jsonl" and rest:
        return _read_jsonl(Path(rest), what, jsonl_fields)
    raise BadInput(usage)


def _read_jsonl(path: Path, what: str, fields: tuple[str, ...]) -> Lengths:
    """Lengths from a JSONL file: each line an object with one of ``fields`` (or a "prompt")."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise BadInput(f"{what} file {str(path)!r} cannot be read: {exc.strerror}") from None
    values, texts = [], []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise BadInput(f"{path}:{n} is not JSON: {line[:80]!r}") from None
        value = next((row[f] for f in fields if isinstance(row, dict) and f in row), None)
        text = row.get("prompt") if isinstance(row, dict) else None
        if value is None and isinstance(text, str) and "prompt" in what:
            value = max(1, len(text.split()))
        if not isinstance(value, int) or value < 1:
            raise BadInput(f"{path}:{n} has no whole number ≥ 1 in {' or '.join(fields)} "
                           f"for the {what}: {line[:80]!r}")
        values.append(value)
        if isinstance(text, str):
            texts.append(text)
    if not values:
        raise BadInput(f"{what} file {str(path)!r} has no rows")
    return Lengths("jsonl", min(values), max(values), str(path), tuple(values),
                   tuple(texts) if len(texts) == len(values) else ())


# Every prompt a run makes starts with this tag (one per process). A server's prefix cache keeps
# the KV blocks of prompts it has seen: without the tag a second run of the same seed on a warm
# server found its prompts cached (vLLM measured 81 % hits) and timed prefill at a fifth of its
# cost, so the run's capacity profile and replay measured another server than the first's.
RUN_TAG = secrets.token_hex(3)


def make_prompt(rng: random.Random, words: int, i: int) -> str:
    """About ``words`` tokens of text; the run's tag and a number first (``RUN_TAG.i``), so no
    two prompts share a prefix, within a run or with an earlier run's on the same server."""
    return f"{RUN_TAG}.{i} " + " ".join(rng.choice(_WORDS) for _ in range(max(0, words - 1)))


def prompt_number(prompt: str) -> int:
    """The number ``make_prompt`` put first in a prompt."""
    return int(prompt.split(" ", 1)[0].rsplit(".", 1)[1])


@dataclass(frozen=True)
class PromptTokens:
    """How a target counts a generated prompt: tokens = overhead + per_word × words.

    The overhead is what the server adds to every prompt (a BOS token, a chat template).
    """
    per_word: float = 1.0
    overhead: float = 0.0

    def words_for(self, tokens: int) -> int:
        return max(1, round((tokens - self.overhead) / self.per_word))

    @classmethod
    def fit(cls, short: tuple[int, int], long: tuple[int, int]) -> "PromptTokens":
        """From two (words, tokens) measurements of prompts made by ``make_prompt``."""
        (w1, t1), (w2, t2) = short, long
        per_word = (t2 - t1) / (w2 - w1)
        if not per_word > 0:
            return cls()
        return cls(per_word, max(0.0, t1 - per_word * w1))

    def to_json(self) -> dict[str, float]:
        return {"tokens_per_word": round(self.per_word, 4), "overhead_tokens": round(self.overhead, 2)}


CALIBRATION_WORDS = (16, 96)


@dataclass(frozen=True)
class Profile:
    requests: int
    prompt_tokens: Lengths
    output_tokens: Lengths
    concurrency: int | None = 8          # at most this many in flight (None: no cap)
    request_rate: float | None = None    # mean arrivals per second (None: all at once)
    burstiness: float = 1.0              # gamma shape: 1 = Poisson, < 1 burstier, > 1 steadier
    seed: int = 0

    def __post_init__(self) -> None:
        if self.requests < 1:
            raise BadInput(f"--requests {self.requests} must be at least 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise BadInput(f"--concurrency {self.concurrency} must be at least 1")
        if self.request_rate is not None and not self.request_rate > 0:
            raise BadInput(f"--request-rate {self.request_rate} must be > 0 requests/s "
                           "(leave it out to send as fast as the concurrency allows)")
        if not self.burstiness > 0:
            raise BadInput(f"--burstiness {self.burstiness} must be > 0 (1 = Poisson arrivals)")
        if self.concurrency is None and self.request_rate is None:
            raise BadInput("give --concurrency, --request-rate, or both: with neither, every "
                           "request would be sent at once")

    def plan(self, tokens: "PromptTokens | None" = None) -> list[tuple[float, str, int]]:
        """(send offset in seconds, prompt, max_tokens) for every request, in order.

        ``tokens`` (measured on the target by ``calibrate``) turns a token length into a word
        count; without it one word is taken as one token.
        """
        tokens = tokens or PromptTokens()
        rng = random.Random(self.seed)
        out, t = [], 0.0
        for i in range(self.requests):
            if self.request_rate is not None and i > 0:
                # Gamma inter-arrival times with mean 1/rate; shape 1 is exponential (Poisson).
                t += rng.gammavariate(self.burstiness, 1.0 / (self.request_rate * self.burstiness))
            n_in = self.prompt_tokens.sample(rng, i)
            texts = self.prompt_tokens.texts
            prompt = texts[i % len(texts)] if texts else make_prompt(rng, tokens.words_for(n_in), i)
            out.append((t, prompt, self.output_tokens.sample(rng, i)))
        return out

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "concurrency": self.concurrency,
                "request_rate": self.request_rate, "burstiness": self.burstiness,
                "prompt_tokens": self.prompt_tokens.to_json(),
                "output_tokens": self.output_tokens.to_json(), "seed": self.seed}


# --- from the CLI's flags ---------------------------------------------------------------------

def one_concurrency(args: argparse.Namespace) -> int | None:
    """The single --concurrency of a plain or agent run; several are for --adapters runs."""
    if args.concurrency is None:
        return None
    if len(args.concurrency) > 1 and not args.adapters:
        raise BadInput(f"--concurrency {','.join(map(str, args.concurrency))}: several values are "
                       "for --adapters runs (each measured in turn); give one here")
    return args.concurrency[0]


def profile_from_args(args: argparse.Namespace) -> Profile:
    """The Profile of a run of independent requests, from the CLI's flags."""
    concurrency = one_concurrency(args)
    if concurrency is None and args.request_rate is None:
        concurrency = 8
    return Profile(requests=args.requests,
                   prompt_tokens=parse_lengths(args.prompt_tokens, "--prompt-tokens", ("prompt_tokens",)),
                   output_tokens=parse_lengths(args.output_tokens, "--output-tokens",
                                               ("output_tokens", "max_tokens")),
                   concurrency=concurrency, request_rate=args.request_rate,
                   burstiness=args.burstiness, seed=args.seed)
