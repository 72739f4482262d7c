"""The agent's documents: read from a folder, cut into passages, embedded, searched by cosine.

The embeddings come from the rung when it serves an OpenAI embeddings route
(``ServedEmbeddings``: ``POST /v1/embeddings``, as the bring-your-own server does when its engine
runs a pooling model); otherwise from ``HashedBagOfWords``, a small local embedding: each word
hashed into one of ``dims`` signed buckets, weighted 1 + log(count), normalised. It finds
passages that share the question's words, nothing subtler, and the trace says it was used, and why.
"""
from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from options.core import BadInput

DOC_SUFFIXES = (".md", ".txt", ".rst")
PASSAGE_WORDS = 120          # paragraphs are merged up to about this many words
MIN_SCORE = 0.05             # below this a passage shares (almost) nothing with the question
EMBED_BATCH = 64             # texts per embeddings request
_WORD = re.compile(r"[a-z0-9]+")
# Words too common to say what a passage is about.
_STOP = frozenset("the a an and or of to in on for is are was were be been it its this that with as by at "
                  "from what which who how why when do does did can could should would not no".split())


@dataclass(frozen=True)
class Passage:
    source: str        # file, relative to the documents folder
    index: int         # its position in that file
    text: str

    @property
    def ref(self) -> str:
        return f"{self.source}#{self.index}"


def read_passages(folder: str | Path) -> list[Passage]:
    """Every .md/.txt/.rst file under ``folder``, in paragraphs merged to about PASSAGE_WORDS."""
    root = Path(folder)
    if not root.is_dir():
        raise BadInput(f"--docs {str(folder)!r} is not a folder: give the folder that holds the documents "
                       f"({', '.join(DOC_SUFFIXES)} files)")
    passages: list[Passage] = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in DOC_SUFFIXES):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue          # unreadable: left out, and the count shown says how many were read
        current: list[str] = []
        n = 0
        for para in re.split(r"\n\s*\n", text):
            words = para.split()
            if not words:
                continue
            if current and len(current) + len(words) > PASSAGE_WORDS:
                passages.append(Passage(str(path.relative_to(root)), n, " ".join(current)))
                current, n = [], n + 1
            current += words
        if current:
            passages.append(Passage(str(path.relative_to(root)), n, " ".join(current)))
    if not passages:
        raise BadInput(f"no documents indexed: {str(folder)!r} holds no non-empty {', '.join(DOC_SUFFIXES)} file. "
                       "Put the documents the agent should answer from there (plain text or Markdown)")
    return passages


def words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


@dataclass
class Embedded:
    vectors: list[list[float]]
    input_tokens: int | None = None    # what the rung counted (usage.prompt_tokens); None locally
    e2e_s: float | None = None         # the rung's time for it, requests and answers included


class Embedder(Protocol):
    name: str
    endpoint: str | None               # where the embeddings come from; None: computed here

    def embed(self, texts: list[str]) -> Embedded: ...


class EmbeddingsNotServed(Exception):
    """The rung refused the embeddings request (404, or 4xx such as "not a pooling model"):
    it serves no embeddings, so the local fallback is used; the message says what it answered."""


class _Batched:
    """Embeds EMBED_BATCH texts per request (``_post``), summing tokens and time."""

    def embed(self, texts: list[str]) -> Embedded:
        out = Embedded([], 0, 0.0)
        for i in range(0, len(texts), EMBED_BATCH):
            part = self._post(texts[i:i + EMBED_BATCH])
            out.vectors += part.vectors
            out.input_tokens = None if out.input_tokens is None or part.input_tokens is None \
                else out.input_tokens + part.input_tokens
            out.e2e_s += part.e2e_s
        return out

    def _post(self, texts: list[str]) -> Embedded:
        raise NotImplementedError

    def _read(self, raw: bytes, texts: list[str], e2e_s: float) -> Embedded:
        """An OpenAI embeddings answer: ``{"data": [{"index", "embedding"}], "usage": {"prompt_tokens"}}``."""
        try:
            doc = json.loads(raw)
            rows = sorted(doc["data"], key=lambda d: d["index"])
            vectors = [[float(x) for x in row["embedding"]] for row in rows]
            tokens = (doc.get("usage") or {}).get("prompt_tokens")
        except (ValueError, KeyError, TypeError) as exc:
            raise RuntimeError(f"{self.endpoint} answered something other than OpenAI embeddings "
                               f"({exc!r}): {raw[:200]!r}") from None
        if len(vectors) != len(texts) or len({len(v) for v in vectors}) > 1:
            raise RuntimeError(f"{self.endpoint} answered {len(vectors)} embeddings of sizes "
                               f"{sorted({len(v) for v in vectors})} for {len(texts)} texts")
        return Embedded(vectors, tokens if isinstance(tokens, int) else None, e2e_s)


def _error_message(raw: bytes) -> str:
    """What an error answer says: OpenAI's ``{"error": {"message"}}`` when it is that, else its text."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        error = json.loads(text).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    return (message if isinstance(message, str) and message else text)[:300]


@dataclass(frozen=True)
class ServedEmbeddings(_Batched):
    """A server's OpenAI embeddings route: ``POST {base}/v1/embeddings {"input": [...]}``."""
    base_url: str
    model: str | None = None
    timeout_s: float = 300.0

    @property
    def endpoint(self) -> str:
        return self.base_url.rstrip("/") + "/v1/embeddings"

    @property
    def name(self) -> str:
        return f"the rung's embeddings ({self.endpoint})"

    def _post(self, texts: list[str]) -> Embedded:
        body = {"input": texts, **({"model": self.model} if self.model else {})}
        req = urllib.request.Request(self.endpoint, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = _error_message(exc.read()[:2000])
            if 400 <= exc.code < 500:      # the route is not there, or the model does not pool
                raise EmbeddingsNotServed(f"{self.endpoint} answered HTTP {exc.code}: {detail}") from None
            raise RuntimeError(f"the rung's embeddings route {self.endpoint} failed: HTTP {exc.code}: "
                               f"{detail}") from None
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"could not reach the rung's embeddings route {self.endpoint}: {exc}") from None
        return self._read(raw, texts, time.perf_counter() - started)


@dataclass(frozen=True)
class EndpointEmbeddings(_Batched):
    """A SageMaker endpoint of the bring-your-own image (level 5): its ``/invocations`` embeds an
    OpenAI embeddings body when the engine runs a pooling model, and answers 400 when it does not
    (SageMaker passes that on as a ModelError)."""
    client: object                       # boto3 sagemaker-runtime
    endpoint_name: str

    @property
    def endpoint(self) -> str:
        return f"sagemaker:{self.endpoint_name} (openai-embeddings)"

    @property
    def name(self) -> str:
        return f"the endpoint's embeddings ({self.endpoint})"

    def _post(self, texts: list[str]) -> Embedded:
        from botocore.exceptions import ClientError

        started = time.perf_counter()
        try:
            resp = self.client.invoke_endpoint(EndpointName=self.endpoint_name, ContentType="application/json",
                                               Accept="application/json", Body=json.dumps({"input": texts}).encode())
            raw = resp["Body"].read()
        except ClientError as exc:
            status = exc.response.get("OriginalStatusCode")
            message = exc.response.get("OriginalMessage") or exc.response.get("Error", {}).get("Message", "")
            if exc.response.get("Error", {}).get("Code") == "ModelError" and isinstance(status, int) \
                    and 400 <= status < 500:
                raise EmbeddingsNotServed(f"{self.endpoint} answered {status}: "
                                          f"{_error_message(message.encode())}") from None
            raise
        return self._read(raw, texts, time.perf_counter() - started)


@dataclass(frozen=True)
class HashedBagOfWords:
    """The local embedding fallback: signed feature hashing of words, L2-normalised."""
    dims: int = 512
    endpoint = None

    @property
    def name(self) -> str:
        return f"local hashed bag-of-words ({self.dims} dims)"

    def embed(self, texts: list[str]) -> Embedded:
        return Embedded([self._vector(t) for t in texts])

    def _vector(self, text: str) -> list[float]:
        counts: dict[str, int] = {}
        for w in words(text):
            counts[w] = counts.get(w, 0) + 1
        vec = [0.0] * self.dims
        for w, c in counts.items():
            h = zlib.crc32(w.encode())          # stable across runs, unlike hash()
            vec[h % self.dims] += (1.0 if h & 0x80000000 else -1.0) * (1 + math.log(c))
        norm = math.sqrt(sum(x * x for x in vec)) or 1.0
        return [x / norm for x in vec]


def cosine(a: list[float], b: list[float]) -> float:
    # Served embeddings need not be unit length; the local ones are.
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(x * x for x in b))
    return sum(x * y for x, y in zip(a, b)) / (na * nb) if na and nb else 0.0


@dataclass
class Index:
    passages: list[Passage]
    embedder: Embedder
    indexing: Embedded                     # the passages' vectors, and what embedding them took
    fallback: str | None = None            # why the local embedding is used, when it is
    vectors: list[list[float]] = field(init=False)

    def __post_init__(self) -> None:
        self.vectors = self.indexing.vectors

    @classmethod
    def build(cls, passages: list[Passage], embedder: Embedder | None = None,
              fallback: str | None = None) -> "Index":
        embedder = embedder or HashedBagOfWords()
        return cls(passages, embedder, embedder.embed([p.text for p in passages]), fallback)

    def nearest(self, query: list[float], k: int = 3) -> list[tuple[Passage, float]]:
        """The ``k`` passages closest to ``query`` that score at least MIN_SCORE, best first."""
        scored = [(p, cosine(query, v)) for p, v in zip(self.passages, self.vectors)]
        scored.sort(key=lambda ps: -ps[1])
        return [(p, s) for p, s in scored[:k] if s >= MIN_SCORE]

    def search(self, query: str, k: int = 3) -> list[tuple[Passage, float]]:
        return self.nearest(self.embedder.embed([query]).vectors[0], k)

    @property
    def documents(self) -> int:
        return len({p.source for p in self.passages})
