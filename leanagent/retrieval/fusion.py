"""Hybrid ranking: a weighted sum of per-query min-max normalised dense and BM25 scores.

    hybrid = w * norm(dense) + (1 - w) * norm(bm25),   norm(s) = (s - min) / (max - min)

with min and max taken over each query's accessible premises. w = 0 is exactly the BM25 ranking
and w = 1 exactly the dense one (the raw scores are returned, so not even ties move). The weight
is chosen on the validation split from `HYBRID_GRID` and stored in the checkpoint with the
fingerprint of the corpus it was chosen on; elsewhere hybrid uses `DEFAULT_HYBRID_WEIGHT` (BM25).
`choose_weight` leaves BM25 only for the weight validation shows best, and only when its Recall@10 gain is not noise.

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
# The chosen weight's Recall@k gain over BM25 must clear this one-sided z (about 5%) on the validation split.
MIN_GAIN_Z = 1.645


def combined_scores(values: torch.Tensor) -> torch.Tensor:
    """Per-example Recall@1 + Recall@k + 100 MRR (columns as `metric_names` gives them): one number that
    a weight buying Recall@10 with Recall@1 does not win, on the recalls' percent scale."""
    scale = torch.ones(values.shape[1], dtype=values.dtype)
    scale[-1] = 100.0  # MRR is in [0, 1], recalls in percent
    return (values * scale).sum(dim=1)


def gain_z(values: torch.Tensor, bm25: torch.Tensor) -> float:
    """z statistic of a paired test that a weight's per-example Recall@k (the largest k measured, the column
    before MRR: Recall@10, which checkpoints monitor) beats BM25's; 0 for fewer than two examples, +-inf when
    every example gains (or loses) the same."""
    if len(values) < 2:
        return 0.0
    gain = values[:, -2] - bm25[:, -2]
    mean, error = float(gain.mean()), float(gain.std()) / math.sqrt(len(gain))
    if error == 0.0:
        return math.copysign(math.inf, mean) if mean else 0.0
    return mean / error


def choose_weight(per_example: dict[float, torch.Tensor], min_gain_z: float = MIN_GAIN_Z) -> float:
    """The fusion weight validation supports: the best, unless its gain over BM25 (0) is noise.

    `per_example[w]` is [n, metrics] for the n validation examples (columns Recall@1, [Recall@k], MRR).
    The best weight has the highest mean `combined_scores` (the smallest on ties), so Recall@1 is not sold
    for Recall@10; it is taken when its paired Recall@k gain over BM25 clears a one-sided z test at
    `min_gain_z`, otherwise BM25 is. The gain is tested on Recall@k, the metric runs monitor, and not on the
    sum: on a ~100-example split the sum's R@1 and MRR swings hid a 10-point Recall@10 gain that came with
    gains on R@1 and MRR too (docs/measurements.md). One test of the best weight, not one per weight:
    neighbouring weights rank almost alike, so the grid is not ten independent chances, and a rule that
    wanted each weight to beat BM25 on every metric and survive a correction for ten tests kept BM25 on
    most ~100-theorem splits of trained models. The z test still keeps out a gain of a few lucky states,
    which is what put a weakly trained model below BM25 on a small test split.
    """
    if 0.0 not in per_example:
        raise ValueError("choosing a fusion weight needs BM25's column (weight 0)")
    # A few numbers per example, whatever device evaluation ran on: decided on the host, in float64,
    # so no tensor made here meets one on the model's device (and the answer is a plain float).
    per_example = {w: values.detach().cpu().double() for w, values in per_example.items()}
    if not len(per_example[0.0]):
        return 0.0
    means = {w: float(combined_scores(values).mean()) for w, values in per_example.items()}
    best = max(sorted(means), key=lambda w: (means[w], -w))
    return best if best != 0.0 and gain_z(per_example[best], per_example[0.0]) >= min_gain_z else 0.0


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

