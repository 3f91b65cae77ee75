"""What a retriever checkpoint records about the fit it was taken in, so that the next fit plans from it.

A new fit from a finished one starts at the next epoch and step with a fresh LR schedule; an
interrupted one (a preemption saves mid-epoch) continues its own plan from the batch it reached.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.trainer.states import TrainerFn

from leanagent.checkpoint_files import FIT_STATE_KEY, FitState
from leanagent.errors import LeanAgentError


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
        # What batches_done counts in: a resume mid-epoch skips batches_done * batch_size of the rank's shard.
        "epoch_done": epoch_done,
        "batch_size": _batch_size(trainer),
        "world_size": int(trainer.world_size),
    }


def _batch_size(trainer: pl.Trainer) -> int | None:
    size = getattr(getattr(trainer, "datamodule", None), "batch_size", None)
    return int(size) if isinstance(size, int) else None


def resume_position(checkpoint: dict[str, Any], trainer: pl.Trainer | None = None) -> tuple[int, int] | None:
    """(epoch, batches done) where the checkpoint was taken, for an exact resume; None if it does not say.

    With the `trainer` of a fit resuming mid-epoch, the batch size and number of ranks must be the
    checkpoint's: with others, skipping the batches done would skip examples never trained on and train
    others twice, without a word."""
    saved = checkpoint.get(FIT_STATE_KEY) or {}
    if "batches_done" not in saved:
        return None
    epoch, done = int(saved["epoch"]), int(saved["batches_done"])
    fitting = trainer is not None and trainer.state.fn == TrainerFn.FITTING
    then = (saved.get("batch_size"), saved.get("world_size"))
    if fitting and saved.get("epoch_done") is False and not saved.get("finished") and done > 0 and None not in then:
        now = (_batch_size(trainer), int(trainer.world_size))
        if then != now:
            source = getattr(trainer, "ckpt_path", None)
            raise LeanAgentError(
                f"{f'--ckpt_path {source}' if source else 'the checkpoint'} was saved {done} batches into epoch {epoch} "
                f"with data.batch_size={then[0]} on {then[1]} rank(s), and this fit has data.batch_size={now[0]} on "
                f"{now[1]}: the rest of that epoch would skip examples it never trained on; resume with the same "
                "data.batch_size and number of processes (trainer.devices x trainer.num_nodes)"
            )
    return epoch, done
