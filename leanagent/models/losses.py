"""The training losses: contrastive loss of similarities against labels, in-batch and across ranks."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def contrastive_loss(
    similarity: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, loss: str = "mse", temperature: float = 0.05
) -> torch.Tensor:
    """Loss of cosine similarities [B, C] against 0/1 labels, over real (not padded) candidates.

    `mse` is ReProver's and LeanAgent's: (similarity - label)^2 averaged over valid entries.
    `infonce` is the multi-positive softmax loss: -log(sum over positives / sum over candidates) of
    exp(similarity / temperature), averaged over queries that have a positive. It depends only on
    how candidates rank against each other, so it keeps what an encoder already ranks well.
    """
    weight = valid.to(similarity.dtype).expand_as(similarity)
    if loss == "mse":
        return ((similarity - labels) ** 2 * weight).sum() / weight.sum().clamp(min=1)
    logits = (similarity / temperature).masked_fill(weight == 0, float("-inf"))
    positive_logits = logits.masked_fill(labels * weight == 0, float("-inf"))
    has_positive = (labels * weight).sum(dim=1) > 0
    # Rows without a positive get a zero loss with finite gradients (not 0 * NaN through torch.where).
    positive_logits = torch.where(has_positive[:, None], positive_logits, logits)
    per_query = torch.logsumexp(logits, dim=1) - torch.logsumexp(positive_logits, dim=1)
    per_query = torch.where(has_positive, per_query, torch.zeros_like(per_query))
    return per_query.sum() / has_positive.sum().clamp(min=1)


LOSSES = ("mse", "infonce")


def bm25_distillation_loss(
    similarity: torch.Tensor, bm25: torch.Tensor, valid: torch.Tensor,
    temperature: float = 0.05, teacher_temperature: float = 0.1,
) -> torch.Tensor:
    """KL(teacher || encoder) over each query's valid candidates, the teacher being BM25's ranking of them.

    Why: positives teach what premises of the training library mean; BM25's ranking teaches matching a
    state's identifiers to a premise's, which holds in any library, so it is what transfers to a
    repository the encoder never saw. The teacher is softmax(score / row max / teacher_temperature):
    scale-free per query, its best candidate e^(1/teacher_temperature) times a candidate sharing no
    term. The encoder's side is softmax(similarity / temperature), as in InfoNCE. Queries with no BM25
    score above 0 have no teacher and are left out.
    """
    valid = valid.expand_as(similarity)
    scores = bm25.to(torch.float32).masked_fill(~valid, 0.0)
    row_max = scores.max(dim=1, keepdim=True).values
    taught = row_max[:, 0] > 0
    teacher = torch.softmax((scores / row_max.clamp(min=1e-12) / teacher_temperature).masked_fill(~valid, float("-inf")), dim=1)
    student = torch.log_softmax((similarity.float() / temperature).masked_fill(~valid, float("-inf")), dim=1)
    per_query = (teacher * (teacher.clamp(min=1e-12).log() - student.masked_fill(~valid, 0.0))).sum(dim=1)
    return (per_query * taught).sum() / taught.sum().clamp(min=1)


def stack_padded(*tables: torch.Tensor) -> torch.Tensor:
    """Rows of 2D tables one after the other, zero-padded on the right to the widest."""
    width = max(t.shape[1] for t in tables)
    return torch.cat([F.pad(t, (0, width - t.shape[1])) for t in tables])


Encode = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (ids, mask) -> embeddings
Share = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def batch_loss(
    encode: Encode, batch: dict[str, torch.Tensor], loss: str = "mse", share: Share | None = None,
    bm25_distillation: float = 0.0,
) -> torch.Tensor:
    """The in-batch loss: every query against every candidate of the batch (its own and the others').

    `share`, if given, widens the candidates beyond this batch (`share_candidates`: every rank's).
    `bm25_distillation` > 0 adds that weight times `bm25_distillation_loss` over this batch's own
    candidates (the batch's `bm25` scores).
    """
    # One call for both, so that queries and candidates of similar length share encoder chunks.
    ids = stack_padded(batch["query_ids"], batch["cand_ids"])  # 0 is ByT5's padding id
    mask = stack_padded(batch["query_mask"], batch["cand_mask"])
    embeddings = encode(ids, mask)
    num_queries = len(batch["query_ids"])
    queries, candidates = embeddings[:num_queries], embeddings[num_queries:]
    labels, valid = batch["labels"], batch["cand_valid"]
    similarity = queries @ candidates.T
    distillation = 0.0
    if bm25_distillation > 0:
        distillation = bm25_distillation * bm25_distillation_loss(similarity, batch["bm25"], valid[None, :])
    if share is not None:
        candidates, premises, valid = share(candidates, batch["cand_premises"], valid)
        labels = candidate_labels(batch["query_positives"], premises)
        similarity = queries @ candidates.T
    return contrastive_loss(similarity, labels, valid[None, :], loss) + distillation


def candidate_labels(query_positives: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """[B, C] 1.0 where candidate premise j is any positive of query i (-1 pads both sides)."""
    hit = (candidates[None, :, None] == query_positives[:, None, :]).any(-1) & (candidates[None, :] >= 0)
    return hit.to(torch.float32)


def share_candidates(
    candidates: torch.Tensor, premises: torch.Tensor, valid: torch.Tensor,
    gather: Callable[[torch.Tensor], torch.Tensor], rank: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every rank's candidates, for in-batch negatives across the whole global batch.

    `gather` is an all_gather that stacks a tensor of every rank ([world, ...]); other ranks' embeddings
    come without gradient (each rank back-propagates through its own candidates, and DDP averages).
    Ranks may hold batches of different sizes (the last one), so rows are padded to the largest.
    """
    sizes = gather(torch.tensor([len(premises)], device=candidates.device)).flatten()
    width = int(sizes.max())
    pad = width - len(premises)
    local = F.pad(candidates, (0, 0, 0, pad))
    with torch.no_grad():
        everyone = gather(local.detach())
    all_embeddings = torch.cat([everyone[:rank], local[None], everyone[rank + 1 :]]).flatten(0, 1)
    all_premises = gather(F.pad(premises, (0, pad), value=-1)).flatten()
    all_valid = gather(F.pad(valid.to(torch.int32), (0, pad))).flatten() > 0  # gloo gathers no bool
    return all_embeddings, all_premises, all_valid
