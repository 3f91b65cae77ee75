"""The map-style datasets the loaders draw from: training pairs with their negatives, and evaluation states."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch.utils.data import Dataset

from leanagent.corpus.tactics import TacticStates
from leanagent.data.negatives import NegativeSampler


class TrainingPairs(Dataset):
    """(tactic state, one positive premise) pairs with negatives drawn from the item's index and the seed.

    Seeding each item by (seed, epoch, index) makes its negatives independent of worker, rank and
    batch order: what the Fisher computation needs to agree across world sizes.
    """

    def __init__(
        self, states: TacticStates, sampler: NegativeSampler, seed: int, hard_pools: np.ndarray | None = None
    ) -> None:
        self.states = states
        self.sampler = sampler
        self.seed = seed
        self.hard_pools = hard_pools
        self.epoch = 0
        self.pairs = np.asarray(
            [(i, p) for i, positives in enumerate(states.positives) for p in positives], dtype=np.int64
        ).reshape(-1, 2)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index < 0:  # a padding copy of item -1 - index (see UnpaddedDistributedSampler.equal_length)
            return {**self[-1 - index], "padding": True}
        state, positive = (int(v) for v in self.pairs[index])
        rng = np.random.default_rng([self.seed, self.epoch, index])
        negatives = self.sampler.sample(
            self.states.file_ids[state], self.states.pos_keys[state], positive, rng,
            None if self.hard_pools is None else self.hard_pools[state], positives=self.states.positives[state],
        )
        return {"index": index, "state": state, "positive": positive, "negatives": negatives}


class EvalStates(Dataset):
    """Every tactic state of a split, one item each (ReProver evaluates per tactic)."""

    def __init__(self, states: TacticStates) -> None:
        self.states = states

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, index: int) -> int:
        return index
