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
# Logged beside the plain (dense) metric names as `Recall@10_val/bm25`, `Recall@10_val/hybrid`.
BASELINE_MODES = ("bm25", "hybrid")
# Candidate weights of the dense side, evaluated together at the end of each validation epoch.
HYBRID_GRID = tuple(round(0.1 * i, 1) for i in range(11))
# The weight used where none was chosen for the corpus at hand: a model never validated, a checkpoint
# without a stored weight, or a corpus other than the one the weight was chosen on. 0 is pure BM25,
# so hybrid is never worse than BM25 where the encoder's worth is unknown.
DEFAULT_HYBRID_WEIGHT = 0.0
# Column weights that reproduce the single modes.
MODE_WEIGHTS = {"dense": 1.0, "bm25": 0.0}
# One weight's gain over BM25 would need to clear two standard errors (one-sided z >= 2): that level,
# about 2.3%, is now the family-wise false-positive rate over all the weights tried (Holm, below).
MIN_GAIN_Z = 2.0
GAIN_ALPHA = 0.5 * math.erfc(MIN_GAIN_Z / math.sqrt(2.0))


def gain_p_value(values: torch.Tensor, bm25: torch.Tensor, scale: torch.Tensor) -> float:
    """One-sided p-value of a paired z test that a weight's per-example gain over BM25
    (Recall@1 + Recall@k + 100 MRR) has a positive mean; 1 for fewer than two examples."""
    if len(values) < 2:
        return 1.0
    gain = ((values - bm25) * scale).sum(dim=1)
    mean, error = float(gain.mean()), float(gain.std()) / math.sqrt(len(gain))
    if error == 0.0:
        return 0.0 if mean > 0 else 1.0
    return 0.5 * math.erfc(mean / error / math.sqrt(2.0))


def holm(p_values: dict[float, float], alpha: float) -> set[float]:
    """Holm's step-down procedure: the hypotheses rejected at family-wise level `alpha`.

    The smallest p-value is compared with alpha / m, the next with alpha / (m - 1), ..., stopping at the
    first that fails; uniformly at least as powerful as Bonferroni, with the same family-wise guarantee.
    """
    ordered = sorted(p_values, key=lambda key: (p_values[key], key))
    rejected: set[float] = set()
    for i, key in enumerate(ordered):
        if p_values[key] > alpha / (len(ordered) - i):
            break
        rejected.add(key)
    return rejected


def choose_weight(per_example: dict[float, torch.Tensor], alpha: float = GAIN_ALPHA) -> float:
    """The fusion weight validation supports: BM25 (0) unless another weight is clearly better.

    `per_example[w]` is [n, metrics] for the n validation examples (columns Recall@1, [Recall@k], MRR,
    as `metric_names` gives them). A weight qualifies when its mean is at least BM25's on every metric
    and its paired gain in Recall@1 + Recall@k + 100 MRR is significant in a one-sided z test, corrected
    for the number of weights tried with Holm's procedure at family-wise level `alpha` (default: the level
    of z >= 2 for a single test): testing ten weights at z >= 2 each would let noise through far more
    often than one test does, and on a small validation split a gain of one or two examples is noise; a
    weight chosen on noise can fall below BM25 on test (a lifelong run did, docs/measurements.md). Among qualifying
    weights the best (Recall@k, MRR, Recall@1) wins, the smallest on ties.
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
    means = {w: per_example[w].mean(0) if len(per_example[w]) else torch.zeros(width, dtype=torch.float64) for w in per_example}
    tried = {w: gain_p_value(per_example[w], bm25, scale) for w in per_example if w != 0.0}
    significant = holm(tried, alpha)

    def qualifies(weight: float) -> bool:
        return weight == 0.0 or weight in significant and not bool((means[weight] < means[0.0]).any())

    order = [max(0, width - 2), width - 1, 0]
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

