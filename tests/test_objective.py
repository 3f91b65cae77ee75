"""The training objective: in-batch negatives shared across ranks, labelled by premise id."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from leanagent.models.losses import candidate_labels, contrastive_loss, share_candidates


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
