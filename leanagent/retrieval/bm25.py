"""BM25 over a corpus's premises, with a tokenizer for Lean source, scored for a batch at once.

The index is `bm25s`'s (a sparse token x document matrix of precomputed BM25 term scores, Lucene
variant). Scoring B queries is one sparse product, query term counts [B, V] times that matrix,
which is what `bm25s.BM25.get_scores` computes one query at a time (a test checks they agree).
The caller masks the dense [B, num_premises] result with `Corpus.accessible_mask`, as the dense
retriever does, so BM25 never returns an inaccessible premise. Document frequencies are counted
over the whole corpus (one index per corpus), not over each query's accessible subset.

Building the index means tokenizing every premise, which dominates its cost, so it is built once per
process and corpus and kept in memory, not written to disk (build times: docs/measurements.md).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import asdict, dataclass

# bm25s runs a JAX top-k when it is imported, if JAX is installed (common on GPU machines): JAX then takes
# 75% of every visible GPU's memory in each process, so the other ranks of a GPU node fail at import
# ("Unable to initialize backend 'cuda'") and torch is left a quarter of the card. Scoring here is torch
# and scipy; JAX stays on the CPU unless the user chose otherwise.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import bm25s  # noqa: E402
import numpy as np
import scipy.sparse as sp
import torch

from leanagent.corpus.corpus import Corpus
from leanagent.errors import LeanAgentError

# A word: letters (any script: ℕ, α), digits, subscripts (h₁), _, ', !, ? and inner dots (Nat.succ_le).
_WORD = r"[\w'!?]+(?:\.[\w'!?]+)*"
# Symbols: `⁻¹` is one token; every other non-space, non-word character stands alone (≤, ∘, →, ⟨).
_TOKEN = re.compile(rf"(?P<word>{_WORD})|(?P<sym>⁻¹|[^\w\s])")
_NAME_PARTS = re.compile(r"[._']+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")

TEXTS = ("code", "name", "both")


@dataclass(frozen=True)
class LeanTokenizer:
    """How Lean text becomes BM25 terms. The defaults scored best or near best (benchmarks/bm25_tokenization.py, docs/measurements.md).

    Attributes:
        split: split words into pieces at dots, underscores and primes (`Nat.le_of_lt` -> nat, le, of, lt).
        camel: also split pieces at camelCase boundaries (`foldlM` -> foldl, m; `HEq.refl` -> h, eq, refl).
        keep_whole: keep the whole word beside its pieces (`Nat.le_of_lt` is also a term).
        symbols: keep each symbol (`≤`, `∘`, `⁻¹`, `→`, `(`) as a term; otherwise symbols are dropped.
        lowercase: lowercase every term.
        whitespace: ignore all of the above and split at whitespace only (the baseline).
        text: what a premise's document is: its `code`, its full `name`, or `both`.
    """

    split: bool = True
    camel: bool = True
    keep_whole: bool = True
    symbols: bool = True
    lowercase: bool = True
    whitespace: bool = False
    text: str = "both"

    def __post_init__(self) -> None:
        if self.text not in TEXTS:
            raise LeanAgentError(f"BM25 tokenizer text must be one of {TEXTS}, got {self.text!r}")

    def __call__(self, text: str) -> list[str]:
        if self.whitespace:
            tokens = text.split()
        else:
            tokens = []
            for match in _TOKEN.finditer(text):
                word = match.group("word")
                if word is None:
                    if self.symbols:
                        tokens.append(match.group("sym"))
                    continue
                tokens.extend(self._word(word))
        return [t.lower() for t in tokens] if self.lowercase else tokens

    def _word(self, word: str) -> list[str]:
        if not self.split:
            return [word]
        pieces = [p for p in _NAME_PARTS.split(word) if p]
        if self.camel:
            pieces = [q for p in pieces for q in _CAMEL.split(p) if q]
        if self.keep_whole and pieces != [word]:
            pieces.append(word)
        return pieces

    def document(self, name: str, code: str) -> str:
        return code if self.text == "code" else name if self.text == "name" else f"{name} {code}"

    def settings(self) -> dict:
        return asdict(self)


class BM25Index:
    """BM25 scores of queries against every premise of one corpus."""

    def __init__(self, corpus: Corpus, tokenizer: LeanTokenizer | None = None, k1: float = 1.5, b: float = 0.75) -> None:
        self.tokenizer = tokenizer or LeanTokenizer()
        self.num_documents = len(corpus)
        self.vocab: dict[str, int] = {}
        ids = [
            [self.vocab.setdefault(t, len(self.vocab)) for t in self.tokenizer(self.tokenizer.document(n, c))]
            for n, c in zip(corpus.names, corpus.codes)
        ]
        # bm25s appends an empty token (for empty documents) after the vocabulary; it is never queried.
        self.bm25 = bm25s.BM25(k1=k1, b=b, method="lucene")
        self.bm25.index(bm25s.tokenization.Tokenized(ids=ids, vocab=dict(self.vocab)), show_progress=False)
        scores = self.bm25.scores
        # Term scores as a [V, num_documents] CSR matrix: bm25s's token-major CSC arrays, read row by token.
        self.term_scores = sp.csr_matrix(
            (scores["data"], scores["indices"], scores["indptr"]),
            shape=(len(scores["indptr"]) - 1, self.num_documents),
        )
        self._term_columns: sp.csc_matrix | None = None

    def query_counts(self, queries: list[str]) -> sp.csr_matrix:
        """[B, V] counts of each query's terms that occur in the corpus (others cannot score)."""
        rows: list[int] = []
        cols: list[int] = []
        vals: list[int] = []
        for i, query in enumerate(queries):
            counts = Counter(self.vocab[t] for t in self.tokenizer(query) if t in self.vocab)
            rows.extend([i] * len(counts))
            cols.extend(counts.keys())
            vals.extend(counts.values())
        return sp.csr_matrix(
            (np.asarray(vals, dtype=np.float32), (np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64))),
            shape=(len(queries), self.term_scores.shape[0]),
        )

    def candidate_scores(self, queries: list[str], premises: np.ndarray) -> torch.Tensor:
        """[B, len(premises)] float32 scores of each query against the given premises only (a training
        batch's candidates); -1 marks padding, scored 0."""
        if self._term_columns is None:
            self._term_columns = self.term_scores.tocsc()  # column slicing, once
        scores = (self.query_counts(queries) @ self._term_columns[:, np.maximum(premises, 0)]).toarray()
        scores[:, premises < 0] = 0.0
        return torch.from_numpy(scores.astype(np.float32, copy=False))

    def scores(self, queries: list[str]) -> torch.Tensor:
        """[B, num_premises] float32 BM25 scores (0 where a premise shares no term with the query)."""
        dense = (self.query_counts(queries) @ self.term_scores).toarray()
        return torch.from_numpy(dense.astype(np.float32, copy=False))


def masked_topk(
    scores: torch.Tensor, accessible: torch.Tensor, k: int, in_place: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k accessible premises per row; -1 (and score -inf) where a row has fewer than k accessible.

    `in_place` fills `scores` itself, saving a [B, num_premises] copy when the caller is done with them.
    """
    return padded_topk(hide_inaccessible(scores, accessible, in_place), k)


def hide_inaccessible(scores: torch.Tensor, accessible: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """Scores with -inf where inaccessible, in one pass (no inverted [B, N] mask), in `scores` itself if `in_place`."""
    hidden = torch.tensor(float("-inf"), dtype=scores.dtype, device=scores.device)
    return torch.where(accessible, scores, hidden, out=scores) if in_place else torch.where(accessible, scores, hidden)


def padded_topk(masked_scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of scores that are already -inf where inaccessible; ids are -1 where the score is not finite."""
    k = min(k, masked_scores.shape[1])
    top_scores, top_ids = masked_scores.topk(k, dim=1)
    return top_ids.masked_fill_(~torch.isfinite(top_scores), -1), top_scores
