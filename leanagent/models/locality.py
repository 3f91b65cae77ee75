"""The retriever's one structural parameter: a score bonus for premises of the theorem's own file.

Lean proofs mostly use lemmas stated a few lines above them: in LeanDojo data most annotated premises lie in
the theorem's own file, among a few dozen accessible there, against thousands imported. An encoder that sees
only the tactic state cannot know which file it is in, so the dense ranking scores a premise

    score = cosine(state, premise) + bias * [premise is in the state's file, above the theorem]

`bias` is chosen on the validation split, as hybrid's weight is: the value of `BIAS_GRID` whose dense
ranking has the best mean Recall@1 + Recall@k + 100 MRR (the smallest on ties, so 0 unless a bonus helps).
Not on the train split: a fine-tuned encoder already ranks its own training pairs first, so there the best
bonus is about 0, while on held-out states of the same project it is a few tenths (docs/measurements.md).
Each validation of a fit chooses it again (the encoder moves); checkpoints and exported weights carry it,
and 0 stands where none was chosen.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from leanagent.errors import LeanAgentError
from leanagent.retrieval.bm25 import hide_inaccessible, padded_topk
from leanagent.retrieval.dense import EXACT_HEAD, dense_scores
from leanagent.retrieval.fusion import combined_scores
from leanagent.retrieval.metrics import recall_ks, retrieval_metrics

# Candidate bonuses, in cosine units.
BIAS_GRID = tuple(round(0.05 * i, 2) for i in range(11))
CHECKPOINT_KEY = "locality_bias"


def with_bias(scores: torch.Tensor, own_file: torch.Tensor, bias: float) -> torch.Tensor:
    """Dense scores with the bonus added in place, in their own dtype."""
    return scores.add_(own_file.to(scores.dtype), alpha=bias) if bias else scores


def combined_by_bias(
    scores: torch.Tensor, own_file: torch.Tensor, accessible: torch.Tensor, positives: torch.Tensor,
    num_retrieved: int, grid: tuple[float, ...] = BIAS_GRID,
) -> tuple[torch.Tensor, int]:
    """([len(grid)] summed Recall@1 + Recall@k + 100 MRR at each bias, states with a positive) for one batch
    of cosines [B, N] (float32) and positives [B, P] padded with -1."""
    ks = recall_ks(num_retrieved)
    masked = hide_inaccessible(scores.float(), accessible)
    own = own_file.float()
    has_positive = (positives >= 0).any(dim=1)  # retrieval_metrics' has_positive, the same at every bias
    sums = []
    for bias in grid:
        retrieved, _ = padded_topk(masked + bias * own, num_retrieved)
        values = retrieval_metrics(retrieved, positives, ks)
        sums.append(combined_scores(values[has_positive, :-1].cpu().double()).sum())
    return torch.stack(sums), int(has_positive.sum())


def best_bias(sums: torch.Tensor, grid: tuple[float, ...] = BIAS_GRID) -> float:
    """The grid value of the highest summed score (the smallest on ties; 0 if any sum is not finite)."""
    if not torch.isfinite(sums).all():
        return 0.0
    values = sums.tolist()
    best = max(values)
    return min(b for b, v in zip(grid, values) if v == best)


@torch.no_grad()
def choose_bias(module: Any, split: str = "val") -> tuple[float, int]:
    """(bias, states counted): the bonus `module`'s current encoder ranks `split` best with.

    Every rank scores its share of the split against the cached corpus embeddings (float32), and one
    all-reduce sums the per-bias scores, so every rank chooses the same bias.
    """
    data = module.data
    states = data.states(split)
    world_size, rank = module.trainer.world_size, module.global_rank
    mine = list(range(rank, len(states), world_size))
    corpus = module.corpus_embeddings.to(module.device)
    sums = torch.zeros(len(BIAS_GRID), dtype=torch.float64)
    count = 0
    was_training = module.training
    module.eval()
    try:
        for start in range(0, len(mine), data.eval_batch_size):
            batch = data.collate_eval(split, mine[start : start + data.eval_batch_size])
            batch = {k: v.to(module.device) for k, v in batch.items()}
            with module.trainer.precision_plugin.forward_context():
                queries = module(batch["query_ids"], batch["query_mask"])
            own_file = data.corpus.own_file_mask(batch["file_ids"], batch["pos_keys"])
            accessible = data.corpus.accessible_mask(batch["file_ids"], batch["pos_keys"], own_file)
            part, counted = combined_by_bias(
                dense_scores(queries.float(), corpus), own_file, accessible, batch["positives"], module.num_retrieved
            )
            sums += part
            count += counted
    finally:
        module.train(was_training)
    if world_size > 1 and dist.is_available() and dist.is_initialized():
        summed = torch.cat([sums, torch.tensor([float(count)], dtype=torch.float64)]).to(module.device)
        dist.all_reduce(summed)
        sums, count = summed[:-1].cpu(), int(summed[-1].item())
    return (best_bias(sums) if count else 0.0), count


def rescore_with_bias(
    rescore: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    own_file: torch.Tensor, bias: float, ids: torch.Tensor, scores: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rescore` (the float32 re-scoring of a bf16 search's head, which returns cosines) with the bonus put back."""
    ids, scores = rescore(ids, scores)
    head = min(EXACT_HEAD, ids.shape[1])
    top = ids[:, :head]
    bonus = own_file.gather(1, top.clamp(min=0)) & (top >= 0)
    scores[:, :head] = torch.where(bonus, scores[:, :head] + bias, scores[:, :head])
    order = scores.argsort(dim=1, descending=True, stable=True)
    return ids.gather(1, order), scores.gather(1, order)


def load_bias(checkpoint: dict[str, Any], source: str) -> float:
    """The checkpoint's bias; 0 for one saved before there was one."""
    value = checkpoint.get(CHECKPOINT_KEY, 0.0)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise LeanAgentError(f"{source}: '{CHECKPOINT_KEY}' must be a finite number, got {value!r}")
    return float(value)


def with_bonus(
    cosines: torch.Tensor, rescore: Callable | None, own_file: torch.Tensor | None, bonus: float,
) -> tuple[torch.Tensor, Callable | None]:
    """A batch's dense scores (and the re-scoring of a bf16 search's head, if any) with `bonus` on the own file's premises."""
    if not bonus:
        return cosines, rescore
    if rescore is not None:
        rescore = functools.partial(rescore_with_bias, rescore, own_file, bonus)
    return with_bias(cosines, own_file, bonus), rescore
