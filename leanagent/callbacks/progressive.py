"""LeanAgent's progressive training: each run trains `epochs_per_repo` more epochs than its checkpoint had."""

from __future__ import annotations

import logging

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback

log = logging.getLogger("leanagent")


class ProgressiveTraining(Callback):
    """Sets `max_epochs = current_epoch + epochs_per_repo` once the checkpoint (if any) is restored.

    `trainer.max_epochs` is overridden; a fresh run trains `epochs_per_repo` epochs.
    """

    def __init__(self, epochs_per_repo: int = 1) -> None:
        if epochs_per_repo < 1:
            from leanagent.errors import LeanAgentError

            raise LeanAgentError(f"epochs_per_repo must be at least 1, got {epochs_per_repo}")
        self.epochs_per_repo = epochs_per_repo

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        target = trainer.current_epoch + self.epochs_per_repo
        trainer.fit_loop.max_epochs = target
        log.info(
            "rank %d: progressive training from epoch %d to max_epochs=%d",
            trainer.global_rank, trainer.current_epoch, target,
        )
