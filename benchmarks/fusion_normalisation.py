"""Hybrid under other score normalisations than the shipped per-query min-max: does fusion leave gains behind?

    python -m benchmarks.fusion_normalisation CHECKPOINT DATASET [DATASET ...] [--split-dir random] [--precision bf16-mixed]

Hybrid is `w * norm(dense) + (1 - w) * norm(bm25)`. Min-max over all accessible premises lets the far tail
(the least similar premise) set the scale, so this compares it, on the same checkpoint and splits, with
z-scores over the accessible premises, min-max over each side's top 100 (the tail clipped to 0), and
reciprocal rank fusion (1 / (60 + rank), scaled by 60). For each, like `benchmarks.hybrid_weights`, val and
test are evaluated at every weight of the grid; one row per normalisation gives val and test R@10 by weight,
the weight the shipped rule chooses on val (`fusion.choose_weight`) and its test R@10.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import leanagent.retrieval.fusion as fusion
from benchmarks.arguments import run
from benchmarks.hybrid_weights import checkpoint_on_datasets, val_and_test

Normalise = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def zscore(scores: torch.Tensor, accessible: torch.Tensor) -> torch.Tensor:
    """(s - mean) / std over each row's accessible entries; others -inf."""
    scores = scores.float()
    count = accessible.sum(dim=1, keepdim=True).clamp(min=1)
    mean = torch.where(accessible, scores, 0.0).sum(dim=1, keepdim=True) / count
    std = (torch.where(accessible, (scores - mean) ** 2, 0.0).sum(dim=1, keepdim=True) / count).sqrt()
    return ((scores - mean) / std.clamp(min=1e-6)).masked_fill(~accessible, float("-inf"))


def head_minmax(k: int) -> Normalise:
    """Min-max between each row's best and k-th best accessible score; below the k-th, 0."""
    def normalise(scores: torch.Tensor, accessible: torch.Tensor) -> torch.Tensor:
        scores = scores.float().masked_fill(~accessible, float("-inf"))
        top = scores.topk(min(k, scores.shape[1]), dim=1).values
        high, low = top[:, :1], top[:, -1:]
        low = torch.where(torch.isfinite(low), low, scores.masked_fill(~accessible, float("inf")).amin(dim=1, keepdim=True))
        scaled = ((scores - low) / (high - low).clamp(min=1e-12)).clamp(min=0.0)
        return scaled.masked_fill(~accessible, float("-inf"))
    return normalise


def reciprocal_rank(k: int) -> Normalise:
    """k / (k + rank) over each row's accessible entries (rank 0 is the best): 1 at the top."""
    def normalise(scores: torch.Tensor, accessible: torch.Tensor) -> torch.Tensor:
        ranks = scores.float().masked_fill(~accessible, float("-inf")).argsort(dim=1, descending=True).argsort(dim=1)
        return (k / (k + ranks.float())).masked_fill(~accessible, float("-inf"))
    return normalise


NORMALISATIONS: dict[str, Normalise] = {
    "min-max (shipped)": fusion.normalise,
    "z-score": zscore,
    "min-max, top 100": head_minmax(100),
    "reciprocal rank 60": reciprocal_rank(60),
}


def main() -> None:
    args, model, saved = checkpoint_on_datasets(__doc__)
    shipped = fusion.normalise
    for dataset in args.datasets:
        print(f"\n{dataset.name}: R@10 by weight of the dense side (0 = BM25 ... 1 = dense)")
        for name, normalise in NORMALISATIONS.items():
            fusion.normalise = normalise  # the Fuser looks it up at call time
            try:
                val, _, chosen, test = val_and_test(model, saved, dataset, args.split_dir, args.precision, args.eval_batch_size)
            finally:
                fusion.normalise = shipped
            weights = sorted(val)
            print(f"  {name:20s} val  " + " ".join(f"{val[w][1]:5.1f}" for w in weights))
            print(f"  {'':20s} test " + " ".join(f"{test[w][1]:5.1f}" for w in weights)
                  + f"   chosen {chosen:.1f}: test {test[chosen][1]:.1f}, best test {max(t[1] for t in test.values()):.1f}")


if __name__ == "__main__":
    run(main)
