"""Hybrid ranking: a weighted sum of per-query min-max normalised dense and BM25 scores.

    hybrid = w * norm(dense) + (1 - w) * norm(bm25),   norm(s) = (s - min) / (max - min)

with min and max taken over each query's accessible premises. w = 0 is exactly the BM25 ranking
and w = 1 exactly the dense one (the raw scores are returned, so not even ties move). The weight
is chosen on the validation split from `HYBRID_GRID` and stored in the checkpoint with the
fingerprint of the corpus it was chosen on; elsewhere hybrid uses `DEFAULT_HYBRID_WEIGHT` (BM25).
`choose_weight` leaves BM25 only for a weight that validation shows clearly better.

Dense scores keep the search's dtype (bf16 under `bf16-mixed`, whose top candidates the retriever
re-scores in float32, leanagent/retrieval/dense.py); hybrid normalises them in float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from leanagent.retrieval.bm25 import hide_inaccessible, padded_topk

RETRIEVAL_MODES = ("dense", "bm25", "hybrid")
# Candidate weights of the dense side, evaluated together at the end of each validation epoch.
HYBRID_GRID = tuple(round(0.1 * i, 1) for i in range(11))
# The weight used where none was chosen for the corpus at hand: a model never validated, a checkpoint
# without a stored weight, or a corpus other than the one the weight was chosen on. 0 is pure BM25,
# so hybrid is never worse than BM25 where the encoder's worth is unknown.
DEFAULT_HYBRID_WEIGHT = 0.0
# Column weights that reproduce the single modes.
MODE_WEIGHTS = {"dense": 1.0, "bm25": 0.0}
# How many standard errors a weight's gain over BM25 on validation must clear before hybrid leaves BM25.
MIN_GAIN_Z = 2.0


def choose_weight(per_example: dict[float, torch.Tensor], min_gain_z: float = MIN_GAIN_Z) -> float:
    """The fusion weight validation supports: BM25 (0) unless another weight is clearly better.

    `per_example[w]` is [n, metrics] for the n validation examples (columns Recall@1, [Recall@k], MRR,
    as `metric_names` gives them). A weight qualifies when its mean is at least BM25's on every metric
    and its paired gain in Recall@1 + Recall@k + 100 MRR is at least `min_gain_z` standard errors:
    on a small validation split a gain of one or two examples is noise, and a weight chosen on noise
    falls below BM25 on test (measured in a lifelong run, README). Among qualifying weights the best
    (Recall@k, MRR, Recall@1) wins, the smallest on ties.
    """
    if 0.0 not in per_example:
        raise ValueError("choosing a fusion weight needs BM25's column (weight 0)")
    # A few numbers per example, whatever device evaluation ran on: decided on the host, in float64,
    # so no tensor made here meets one on the model's device (and the answer is a plain float).
    per_example = {w: values.detach().cpu().double() for w, values in per_example.items()}
    bm25 = per_example[0.0]
    width = bm25.shape[1]
    scale = torch.ones(width, dtype=torch.float64)
    scale[-1] = 100.0  # MRR is in [0, 1], recalls in percent

    def qualifies(weight: float) -> bool:
        values = per_example[weight]
        if weight == 0.0:
            return True
        if len(values) < 2 or (values.mean(0) < bm25.mean(0)).any():
            return False
        gain = ((values - bm25) * scale).sum(dim=1)
        return bool(gain.mean() >= min_gain_z * gain.std() / math.sqrt(len(gain)) and gain.mean() > 0)

    order = [max(0, width - 2), width - 1, 0]
    means = {w: per_example[w].mean(0) if len(per_example[w]) else torch.zeros(width, dtype=torch.float64) for w in per_example}
    allowed = [w for w in sorted(per_example) if qualifies(w)]
    return max(allowed, key=lambda w: tuple(float(means[w][i]) for i in order) + (-w,))


def normalise(scores: torch.Tensor, accessible: torch.Tensor) -> torch.Tensor:
    """Per-row min-max scaling to [0, 1] over accessible entries (0 when they are all equal); others -inf."""
    scores = scores.float()
    low = scores.masked_fill(~accessible, float("inf")).amin(dim=1, keepdim=True)
    high = scores.masked_fill(~accessible, float("-inf")).amax(dim=1, keepdim=True)
    span = (high - low).clamp(min=1e-12)
    scaled = torch.where(torch.isfinite(span), (scores - low) / span, torch.zeros_like(scores))
    return scaled.masked_fill(~accessible, float("-inf"))


class Fuser:
    """Masks a batch's dense and BM25 scores once, normalises them once, then fuses them at any weight.

    The score tensors are taken over: they are filled with -inf in place where inaccessible (the
    retriever computes them for this batch alone), which saves a [B, num_premises] copy each.
    `rescore_dense`, if given, refines the dense top-k (the retriever's float32 re-scoring of the
    head of a bf16 search, leanagent/retrieval/dense.py).
    """

    def __init__(
        self,
        dense: torch.Tensor | None,
        sparse: torch.Tensor | None,
        accessible: torch.Tensor,
        rescore_dense: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> None:
        self.accessible = accessible
        self.rescore_dense = rescore_dense
        self.dense = hide_inaccessible(dense, accessible, in_place=True) if dense is not None else None
        self.sparse = hide_inaccessible(sparse.float(), accessible, in_place=True) if sparse is not None else None
        self._normalised: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(self, weight: float) -> torch.Tensor:
        """[B, N] scores, -inf where inaccessible."""
        if weight == 1.0:
            return self.dense
        if weight == 0.0:
            return self.sparse
        if self._normalised is None:
            self._normalised = (normalise(self.dense, self.accessible), normalise(self.sparse, self.accessible))
        dense, sparse = self._normalised
        return weight * dense + (1.0 - weight) * sparse

    def topk(self, weight: float, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`masked_topk` of the scores at `weight`, without masking them again."""
        ids, scores = padded_topk(self(weight), k)
        if weight == 1.0 and self.rescore_dense is not None:
            return self.rescore_dense(ids, scores)
        return ids, scores

