"""A distributed sampler that shards without padding, for passes that must count each example once."""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import DistributedSampler


class UnpaddedDistributedSampler(DistributedSampler):
    """Rank r gets examples r, r+W, r+2W, ... and nothing else.

    PyTorch's sampler repeats examples so that all ranks get equally many; that is right for
    training (DDP needs the same number of steps) and wrong for evaluation and Fisher sums.
    Passes using this sampler must not run collectives per batch.
    Subclassing DistributedSampler keeps Lightning from replacing it.

    With `never_empty`, a rank left without examples (fewer examples than ranks) gets one that
    another rank also has, because Lightning refuses a rank whose loader is empty; evaluation
    stores results by example index, so the duplicate counts once.
    """

    def __init__(self, dataset, num_replicas: int, rank: int, never_empty: bool = False) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)
        self.indices = list(range(rank, len(dataset), num_replicas))
        if never_empty and not self.indices and len(dataset) > 0:
            self.indices = [rank % len(dataset)]
        self.num_samples = len(self.indices)
        self.total_size = len(dataset)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
