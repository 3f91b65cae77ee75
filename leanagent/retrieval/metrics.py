"""Retrieval metrics as ReProver computes them: over all positive premises of each tactic state."""

from __future__ import annotations

import torch

RECALL_AT = (1, 10)


def recall_ks(num_retrieved: int) -> tuple[int, ...]:
    """The k of each Recall@k that `num_retrieved` premises can measure: Recall@10 needs 10 of them."""
    return tuple(sorted({min(k, num_retrieved) for k in RECALL_AT}))


def metric_names(num_retrieved: int) -> tuple[str, ...]:
    return tuple(f"Recall@{k}" for k in recall_ks(num_retrieved)) + ("MRR",)


def retrieval_metrics(retrieved: torch.Tensor, positives: torch.Tensor, ks: tuple[int, ...] = RECALL_AT) -> torch.Tensor:
    """Per-query [R@k for k in ks, MRR, has_positive] from ranked ids ([B, n], -1 = nothing) and positives ([B, m], -1 pad).

    Recall@k is the fraction of the query's distinct positives among its first k retrieved (in percent,
    as ReProver logs it); MRR is 1/rank of the first positive within the retrieved list, 0 if none.
    Queries without positives get zeros and has_positive = 0, so callers can leave them out of means.
    """
    valid_pos = positives >= 0
    num_pos = valid_pos.sum(dim=1)
    hits = ((retrieved[:, :, None] == positives[:, None, :]) & valid_pos[:, None, :]).any(-1) & (retrieved >= 0)
    cumulative = hits.cumsum(dim=1)
    columns = []
    for k in ks:
        found = cumulative[:, min(k, hits.shape[1]) - 1] if hits.shape[1] else torch.zeros_like(num_pos)
        columns.append(100.0 * found.float() / num_pos.clamp(min=1).float())
    ranks = torch.arange(1, hits.shape[1] + 1, device=hits.device, dtype=torch.float32)
    scored = torch.cat([hits.float() / ranks, torch.zeros_like(num_pos, dtype=torch.float32)[:, None]], dim=1)
    columns.append(scored.amax(dim=1))
    has_positive = (num_pos > 0).float()
    return torch.stack([c * has_positive for c in columns] + [has_positive], dim=1)


def format_rankings(logged: dict[str, float], split: str, source: str, weight_chosen: bool) -> str:
    """The trained (dense) ranking beside BM25 and hybrid, one row each, as validate/test logged them.

    `weight_chosen`: a validation chose hybrid's weight for these premises (else hybrid is BM25's fallback)."""
    names = [n for n in ("Recall@1", "Recall@10", "MRR") if f"{n}_{split}" in logged]
    rows = [("dense (trained)", ""), ("bm25", "/bm25"), ("hybrid", "/hybrid")]
    lines = [f"{split} results of {source}:", f"{'ranking':<16}" + "".join(f"{n:>11}" for n in names)]
    for label, suffix in rows:
        values = [float(logged[f"{n}_{split}{suffix}"]) for n in names]
        lines.append(f"{label:<16}" + "".join(f"{v:>11.3f}" if n == "MRR" else f"{v:>11.1f}" for n, v in zip(names, values)))
    weight = logged.get(f"hybrid_weight_{split}")
    if weight is not None:
        why = ("chosen on this dataset's validation split" if weight_chosen
               else "no validation chose one for these premises, so hybrid is BM25")
        lines.append(f"hybrid weight of the dense side: {float(weight):.1f} ({why})")
    bonus = logged.get(f"locality_bias_{split}")
    if bonus is not None:
        lines.append(f"own-file bonus of the dense ranking: {float(bonus):.2f} (leanagent/models/locality.py)")
    return "\n".join(lines)
