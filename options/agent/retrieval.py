"""The agent's documents: read from a folder, cut into passages, embedded, searched by cosine.

The embeddings come from the rung when it serves an embeddings route; until then (no rung
does yet) from ``HashedBagOfWords``, a small local embedding: each word hashed into one of
``dims`` signed buckets, weighted 1 + log(count), normalised. It finds passages that share the
question's words, nothing subtler, and the trace says it was used.
"""
from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from options.core import BadInput

DOC_SUFFIXES = (".md", ".txt", ".rst")
PASSAGE_WORDS = 120          # paragraphs are merged up to about this many words
MIN_SCORE = 0.05             # below this a passage shares (almost) nothing with the question
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


@dataclass(frozen=True)
class HashedBagOfWords:
    """The local embedding fallback: signed feature hashing of words, L2-normalised."""
    dims: int = 512

    @property
    def name(self) -> str:
        return f"local hashed bag-of-words ({self.dims} dims)"

    def embed(self, texts: list[str]) -> list[list[float]]:
        out = []
        for text in texts:
            counts: dict[str, int] = {}
            for w in words(text):
                counts[w] = counts.get(w, 0) + 1
            vec = [0.0] * self.dims
            for w, c in counts.items():
                h = zlib.crc32(w.encode())          # stable across runs, unlike hash()
                vec[h % self.dims] += (1.0 if h & 0x80000000 else -1.0) * (1 + math.log(c))
            norm = math.sqrt(sum(x * x for x in vec)) or 1.0
            out.append([x / norm for x in vec])
        return out


@dataclass
class Index:
    passages: list[Passage]
    vectors: list[list[float]]
    embedder: HashedBagOfWords

    @classmethod
    def build(cls, passages: list[Passage], embedder: HashedBagOfWords | None = None) -> "Index":
        embedder = embedder or HashedBagOfWords()
        return cls(passages, embedder.embed([p.text for p in passages]), embedder)

    def search(self, query: str, k: int = 3) -> list[tuple[Passage, float]]:
        """The ``k`` passages closest to ``query`` that score at least MIN_SCORE, best first."""
        (q,) = self.embedder.embed([query])
        scored = [(p, sum(a * b for a, b in zip(q, v))) for p, v in zip(self.passages, self.vectors)]
        scored.sort(key=lambda ps: -ps[1])
        return [(p, s) for p, s in scored[:k] if s >= MIN_SCORE]

    @property
    def documents(self) -> int:
        return len({p.source for p in self.passages})
