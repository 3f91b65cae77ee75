"""Dense search: query embeddings against the corpus embeddings, in the dtype evaluation runs in.

Under `bf16-mixed`, autocast casts both operands of `queries @ corpus.T` to bf16 on every call, so
a [40k, 1472] corpus was cast again for every batch (3.8x the cost of the bf16 search itself).
The retriever casts the corpus once to `search_dtype` and `dense_scores` multiplies in that dtype:
the same rounding autocast applies, so the same scores, without the per-batch cast.
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
