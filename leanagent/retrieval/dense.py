"""Dense search: query embeddings against the corpus embeddings, in the dtype evaluation runs in.

Under `bf16-mixed`, autocast casts both operands of `queries @ corpus.T` to bf16 on every call, so
the whole corpus would be cast again for every batch, a cost that grows with the corpus and can exceed
the bf16 search itself.
The retriever casts the corpus once to `search_dtype` and `dense_scores` multiplies in that dtype:
the same rounding autocast applies, so the same scores, without the per-batch cast.

bf16 keeps 8 bits of mantissa, so premises whose cosines differ by less than about one bf16 ulp
tie or swap, and some queries' top 10 then differs from exact float32 search's. `rescore_head` re-scores the
first `EXACT_HEAD` candidates with the float32 embeddings and re-sorts them: a small fixed cost that
gives back exact float32's top 10 (benchmarks/search.py; figures in docs/measurements.md).
"""

from __future__ import annotations

import torch


def search_dtype(device: torch.device) -> torch.dtype:
    """The dtype a matmul runs in here: autocast's where it is enabled for this device type, else float32."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return torch.float32


def dense_scores(queries: torch.Tensor, corpus: torch.Tensor) -> torch.Tensor:
    """[B, N] dot products in `corpus.dtype` (cosines, as both sides are L2-normalised)."""
    return queries.to(corpus.dtype) @ corpus.T


# Candidates re-scored in float32. bf16's error stayed under ~1 ulp of the score, so a premise of the
# exact top 10 falls beyond this only if 22 others lie within an ulp above it.
EXACT_HEAD = 32


def rescore_head(
    ids: torch.Tensor, scores: torch.Tensor, queries: torch.Tensor, corpus: torch.Tensor, head: int = EXACT_HEAD
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `head` of each row's candidates re-scored against `corpus` (float32) and re-sorted.

    Padding (-1) stays last; the other candidates keep their order and their search-dtype scores.
    """
    head = min(head, ids.shape[1])
    top = ids[:, :head]
    rows = corpus.index_select(0, top.clamp(min=0).flatten()).view(*top.shape, corpus.shape[1])
    with torch.autocast(queries.device.type, enabled=False):
        exact = torch.bmm(rows, queries.to(corpus.dtype)[:, :, None])[..., 0]
    exact = exact.masked_fill(top < 0, float("-inf"))
    exact, order = exact.sort(dim=1, descending=True, stable=True)
    ids, scores = ids.clone(), scores.to(corpus.dtype)
    ids[:, :head] = top.gather(1, order)
    scores[:, :head] = exact
    return ids, scores


class SearchCorpus:
    """The corpus embeddings in the search dtype, cast once per embeddings and dtype, not once per batch.

    In float32 it is the embeddings themselves (no copy); in bf16 a second, half-size copy that is
    kept beside them, since the float32 ones stay the cache of `embed_corpus`.
    """

    def __init__(self) -> None:
        self._source: torch.Tensor | None = None
        self._cast: torch.Tensor | None = None

    def get(self, embeddings: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if self._source is not embeddings or self._cast is None or self._cast.dtype != dtype:
            self._source = embeddings
            self._cast = embeddings.to(dtype)
        return self._cast

    def clear(self) -> None:
        self._source = self._cast = None
