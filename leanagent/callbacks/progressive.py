"""LeanAgent's progressive training: each fit trains `epochs_per_repo` more epochs than its checkpoint had.

The epoch budget is decided once, before the Trainer and the optimizer exist (`plan_max_epochs`,
called by the CLI hook), so the learning-rate schedule is built for the fit that actually runs.
"""

from __future__ import annotations

import logging
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback

from leanagent.checkpoint_files import fit_state
from leanagent.errors import LeanAgentError

log = logging.getLogger("leanagent")


def plan_max_epochs(checkpoint: dict[str, Any] | None, explicit_max_epochs: int | None, epochs_per_repo: int) -> int:
    """`trainer.max_epochs` for a fit, given the checkpoint it resumes from (if any).

    - An explicit `trainer.max_epochs` (command line or config) wins; one that would train nothing is refused.
    - A checkpoint whose fit was interrupted finishes that fit's plan.
    - Otherwise (fresh, or after a finished fit): the next epoch plus `epochs_per_repo`.
    """
    if checkpoint is None:
        start, planned = 0, epochs_per_repo
    else:
        state = fit_state(checkpoint)
        epoch = int(checkpoint.get("epoch", -1))
        start = epoch if not state.finished else epoch + 1
        planned = state.max_epochs if not state.finished else start + epochs_per_repo
    if explicit_max_epochs is None or explicit_max_epochs < 0:
        return planned
    if explicit_max_epochs <= start:
        raise LeanAgentError(
            f"trainer.max_epochs is {explicit_max_epochs}, but the checkpoint has already trained {start} epoch(s), "
            f"so this fit would train none: give more than {start}, or leave trainer.max_epochs unset "
            f"to train progressive.epochs_per_repo ({epochs_per_repo}) more"
        )
    return explicit_max_epochs


class ProgressiveTraining(Callback):
    """Holds `epochs_per_repo` (the CLI's `progressive` group) and logs the plan each fit runs."""

    def __init__(self, epochs_per_repo: int = 1) -> None:
        if epochs_per_repo < 1:
            raise LeanAgentError(f"progressive.epochs_per_repo must be at least 1, got {epochs_per_repo}")
        self.epochs_per_repo = epochs_per_repo

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        log.info(
            "rank %d: progressive training from epoch %d to max_epochs=%d",
            trainer.global_rank, trainer.current_epoch, trainer.max_epochs,
        )
