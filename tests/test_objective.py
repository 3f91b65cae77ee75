"""The training objective: in-batch negatives shared across ranks, labelled by premise id."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from leanagent.models.losses import batch_loss, bm25_distillation_loss, candidate_labels, contrastive_loss, share_candidates


def test_labels_mark_any_positive_of_the_query_and_never_padding():
    positives = torch.tensor([[4, 7], [9, -1]])
    candidates = torch.tensor([7, 9, -1, 4, 3])
    assert candidate_labels(positives, candidates).tolist() == [[1, 0, 0, 1, 0], [0, 1, 0, 0, 0]]


class FakeGather:
    """all_gather as rank `rank` of two sees it: what this rank gives, stacked with the other rank's tensors."""

    def __init__(self, others: list[torch.Tensor], rank: int) -> None:
        self.others, self.rank = list(others), rank

    def __call__(self, mine: torch.Tensor) -> torch.Tensor:
        other = self.others.pop(0)
        return torch.stack([mine, other] if self.rank == 0 else [other, mine])


def test_shared_candidates_are_every_ranks_with_gradient_only_through_this_ranks():
    torch.manual_seed(0)
    mine = F.normalize(torch.randn(3, 8), dim=-1).requires_grad_()
    theirs = F.normalize(torch.randn(2, 8), dim=-1)
    my_premises, their_premises = torch.tensor([5, 6, -1]), torch.tensor([7, 8])
    my_valid, their_valid = my_premises >= 0, their_premises >= 0
    # What the other rank contributes, padded to 3 rows as share_candidates pads (sizes, embeddings, ids, valid).
    gather = FakeGather([torch.tensor([2]), F.pad(theirs, (0, 0, 0, 1)), F.pad(their_premises, (0, 1), value=-1),
                         F.pad(their_valid.to(torch.int32), (0, 1))], rank=1)
    embeddings, premises, valid = share_candidates(mine, my_premises, my_valid, gather, rank=1)
    assert premises.tolist() == [7, 8, -1, 5, 6, -1]
    assert valid.tolist() == [True, True, False, True, True, False]
    assert torch.equal(embeddings[3:], mine.detach()) and torch.equal(embeddings[:2], theirs)

    queries = F.normalize(torch.randn(2, 8), dim=-1)
    positives = torch.tensor([[8], [5]])  # the first query's positive lives on the other rank
    loss = contrastive_loss(queries @ embeddings.T, candidate_labels(positives, premises), valid[None, :], "infonce")
    # The same loss as over the whole global batch in one process.
    everything = torch.cat([theirs, mine])
    ids = torch.cat([their_premises, my_premises])
    expected = contrastive_loss(queries @ everything.T, candidate_labels(positives, ids), (ids >= 0)[None, :], "infonce")
    assert torch.allclose(loss, expected)
    loss.backward()
    assert mine.grad is not None and mine.grad[:2].abs().sum() > 0


def test_bm25_distillation_is_zero_where_the_encoder_ranks_as_bm25_does_and_pulls_it_there():
    bm25 = torch.tensor([[8.0, 2.0, 0.0, 4.0], [0.0, 0.0, 0.0, 0.0]])  # query 1 shares no term: no teacher
    valid = torch.tensor([[True, True, True, True]])
    # The encoder's softmax(sim / 0.05) equals the teacher's softmax(score / max / 0.1): sim = score / max / 2.
    agreeing = torch.stack([bm25[0] / 8 / 2, torch.tensor([0.9, -0.3, 0.2, 0.0])])
    assert bm25_distillation_loss(agreeing, bm25, valid).item() == pytest.approx(0.0, abs=1e-5)
    reversed_ = agreeing.clone()
    reversed_[0] = -agreeing[0]
    assert bm25_distillation_loss(reversed_, bm25, valid).item() > 1.0
    # A gradient step on the similarities moves BM25's best candidate up, its worst down.
    sims = torch.zeros(2, 4, requires_grad=True)
    bm25_distillation_loss(sims, bm25, valid).backward()
    assert sims.grad[0, 0] < 0 < sims.grad[0, 2]
    assert torch.equal(sims.grad[1], torch.zeros(4))  # the untaught query is left alone


def test_bm25_distillation_leaves_padding_out_and_adds_to_the_batch_loss_with_its_weight():
    bm25 = torch.tensor([[3.0, 1.0, 5.0]])
    sims = torch.tensor([[0.2, 0.1, -0.4]])
    padded = bm25_distillation_loss(sims, bm25, torch.tensor([[True, True, False]]))
    assert padded.item() == pytest.approx(bm25_distillation_loss(sims[:, :2], bm25[:, :2], torch.tensor([[True, True]])).item())

    torch.manual_seed(0)
    embed = torch.nn.Linear(3, 4)
    batch = {
        "query_ids": torch.randn(2, 3), "query_mask": torch.ones(2, 3), "cand_ids": torch.randn(4, 3),
        "cand_mask": torch.ones(4, 3), "labels": torch.tensor([[1.0, 0, 0, 0], [0, 0, 1.0, 0]]),
        "cand_valid": torch.ones(4, dtype=torch.bool), "bm25": torch.tensor([[1.0, 0, 2.0, 0], [0, 3.0, 1.0, 0]]),
    }

    def encode(ids, mask):
        return F.normalize(embed(ids), dim=-1)

    plain = batch_loss(encode, batch, "infonce")
    with_teacher = batch_loss(encode, batch, "infonce", bm25_distillation=0.5)
    queries, candidates = encode(batch["query_ids"], None), encode(batch["cand_ids"], None)
    expected = 0.5 * bm25_distillation_loss(queries @ candidates.T, batch["bm25"], batch["cand_valid"][None, :])
    assert (with_teacher - plain).item() == pytest.approx(expected.item(), rel=1e-5) and expected.item() > 0
