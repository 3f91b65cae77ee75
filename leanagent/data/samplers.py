"""Samplers: unpadded shards for passes that count each example once, and a resumable training order."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler

DEFAULT_SEED = 3407  # data.seed where the run has no number of its own: every rank must draw alike


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

    def __init__(self, dataset, num_replicas: int, rank: int, never_empty: bool = False, equal_length: bool = False) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)
        self.indices = list(range(rank, len(dataset), num_replicas))
        if never_empty and not self.indices and len(dataset) > 0:
            self.indices = [rank % len(dataset)]
        if equal_length and len(dataset) > 0:
            # Every rank gets ceil(N / W) items; the extra ones are -1 - i, which the dataset serves as
            # a copy of item i marked as padding, for passes that must run the same number of steps.
            target = -(-len(dataset) // num_replicas)
            extra = target - len(self.indices)
            self.indices += [-1 - (i % len(dataset)) for i in range(rank, rank + extra)]
        self.num_samples = len(self.indices)
        self.total_size = len(dataset)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples


class EpochShuffledSampler(DistributedSampler):
    """The training order, a function of (seed, epoch) alone, on one rank or many.

    PyTorch's sampler for one process draws from the global RNG, so a resumed fit would see another
    order; this one shuffles and pads like DistributedSampler with any world size (1 included), and
    can skip the part of an epoch that a resumed fit has already trained on.
    """

    def __init__(self, dataset, num_replicas: int, rank: int, seed: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=False)
        self.skip = 0
        self.skip_epoch: int | None = None

    def set_epoch(self, epoch: int) -> None:
        """Lightning calls this before every epoch, a resumed one included (unlike `on_train_epoch_start`),
        so the epoch of the dataset's negative sampling follows it too."""
        super().set_epoch(epoch)
        if hasattr(self.dataset, "epoch"):
            self.dataset.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        if self.skip and self.skip_epoch == self.epoch:
            indices = indices[self.skip :]
        self.skip, self.skip_epoch = 0, None
        return iter(indices)


class _IterOnFirstNext:
    """An iterator that builds the real one on the first `next()`.

    Lightning calls `iter()` on the training loader before it calls the sampler's `set_epoch` (when it
    sets up the data, and again on a resumed epoch it does not call `iter()` a second time). A loader
    with worker processes draws its first indices and hands the dataset (its `epoch`) to the workers
    inside `iter()`, so it would serve epoch 0's order, negatives and skip. The first batch is asked for
    after `set_epoch`, so building the iterator then serves the epoch being trained.
    """

    def __init__(self, make: Callable[[], Iterator[Any]]) -> None:
        self._make = make
        self._iterator: Iterator[Any] | None = None

    def __iter__(self) -> "_IterOnFirstNext":
        return self

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._make()
        return next(self._iterator)


class ResumableLoader(DataLoader):
    """A training DataLoader whose checkpointed state is its place in the epoch (Lightning's stateful loading).

    `position()` is the number of batches the fit loop has trained on in this epoch (read from the loop,
    not counted here: the loader runs ahead of training by its prefetch).
    """

    def __init__(self, *args: Any, position: Callable[[], int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.position = position

    def __iter__(self) -> Iterator[Any]:
        return _IterOnFirstNext(super().__iter__)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": int(self.sampler.epoch), "batches_done": int(self.position())}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.sampler.skip = int(state["batches_done"]) * int(self.batch_size)
        self.sampler.skip_epoch = int(state["epoch"])
