"""What a retriever checkpoint records about the fit it was taken in, so that the next fit plans from it.

A new fit from a finished one starts at the next epoch and step with a fresh LR schedule; an
interrupted one (a preemption saves mid-epoch) continues its own plan from the batch it reached.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl

from leanagent.checkpoint_files import FIT_STATE_KEY, FitState


def fit_state_entry(trainer: pl.Trainer, start_epoch: int, start_step: int) -> dict[str, Any]:
    """The checkpoint's FIT_STATE_KEY entry: the fit's plan and where in its epoch the checkpoint was taken."""
    epoch_done = bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)
    last_epoch = trainer.max_epochs is not None and 0 <= trainer.max_epochs <= trainer.current_epoch + 1
    steps_done = trainer.max_steps is not None and 0 <= trainer.max_steps <= trainer.global_step
    state = FitState(
        start_epoch=start_epoch,
        start_step=start_step,
        max_epochs=int(trainer.max_epochs if trainer.max_epochs is not None else -1),
        finished=(epoch_done and (last_epoch or trainer.should_stop)) or steps_done,
    )
    return {
        **state.as_dict(),
        "epoch": trainer.current_epoch,
        "batches_done": int(trainer.fit_loop.epoch_loop.batch_progress.current.processed),
    }


def resume_position(checkpoint: dict[str, Any]) -> tuple[int, int] | None:
    """(epoch, batches done) where the checkpoint was taken, for an exact resume; None if it does not say."""
    saved = checkpoint.get(FIT_STATE_KEY) or {}
    return (int(saved["epoch"]), int(saved["batches_done"])) if "batches_done" in saved else None
