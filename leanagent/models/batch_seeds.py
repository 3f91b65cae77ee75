"""Per-batch seeds of the global RNGs, so that a resumed fit draws the dropout masks an uninterrupted one draws.

Dropout (ByT5-small has 0.1) draws from the global torch RNG, which Lightning does not checkpoint,
and which iterator creation and validation also draw from: a resumed fit would draw other masks.
Seeded per batch from (seed, epoch, batch, rank), the masks of batch b of epoch e on rank r are the
same in an uninterrupted and a resumed fit, and no RNG state needs saving. Negatives and the
training order are seeded already (leanagent/data/).
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def run_seed() -> int:
    """The run's seed (seed_everything's, the same when the same command resumes)."""
    return int(os.environ.get("PL_GLOBAL_SEED", torch.initial_seed()))


def batch_seed(seed: int, epoch: int, batch_idx: int, rank: int) -> int:
    """A 63-bit seed that is a function of (seed, epoch, batch, rank) alone (numpy's SeedSequence mixing)."""
    state = np.random.SeedSequence([seed % 2**63, epoch, batch_idx, rank]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 ^ int(state[1])


def seed_global_rngs(seed: int) -> None:
    """torch (CPU and every CUDA device), Python's `random` and numpy's global RNG."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
