"""LeanAgent's progressive training: each fit trains `epochs_per_repo` more epochs than its checkpoint had.

The epoch budget is decided once, before the Trainer and the optimizer exist (`plan_max_epochs`,
called by the CLI hook), so the learning-rate schedule is built for the fit that actually runs.

A fit that resumes onto other validation data (the next repository of a lifelong run, or a project
fine-tuned from a `--ckpt_path`) starts checkpoint selection and early stopping afresh: `--ckpt_path`
restores their best score, and a best Recall@10_val measured on another repository would otherwise
keep the new one from ever recording a best of its own (LeanAgent gives each repository new callbacks).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback

from leanagent.checkpoint_files import fit_state
from leanagent.errors import LeanAgentError

log = logging.getLogger("leanagent")


def first_epoch(checkpoint: dict[str, Any] | None) -> int:
    """The epoch a fit from this checkpoint starts in (from 0): an interrupted fit's own, else the next one."""
    if checkpoint is None:
        return 0
    epoch = int(checkpoint.get("epoch", -1))
    return epoch if not fit_state(checkpoint).finished else epoch + 1


def plan_max_epochs(
    checkpoint: dict[str, Any] | None, explicit_max_epochs: int | None, epochs_per_repo: int, max_steps: int = -1
) -> int:
    """`trainer.max_epochs` for a fit, given the checkpoint it resumes from (if any).

    - An explicit `trainer.max_epochs` (command line or config) wins; one that would train nothing is refused.
      -1 is Lightning's "no epoch limit": kept when `trainer.max_steps` ends the fit, refused when nothing
      would (the LR schedule needs an end).
    - A checkpoint whose fit was interrupted finishes that fit's plan.
    - Otherwise (fresh, or after a finished fit): the next epoch plus `epochs_per_repo`.
    """
    start = first_epoch(checkpoint)
    if checkpoint is None:
        planned = epochs_per_repo
    else:
        state = fit_state(checkpoint)
        planned = state.max_epochs if not state.finished else start + epochs_per_repo
    if explicit_max_epochs is None and planned >= 0:
        return planned
    if explicit_max_epochs in (None, -1):  # given as -1, or the plan of an interrupted fit without an epoch limit
        if max_steps is None or max_steps < 0:
            whose = ("trainer.max_epochs is -1" if explicit_max_epochs == -1
                     else "the fit this checkpoint interrupted had trainer.max_epochs -1")
            raise LeanAgentError(
                f"{whose} (no epoch limit) and trainer.max_steps is unset, so the fit would have no end, "
                "which the LR schedule cannot plan: give trainer.max_steps, a number of epochs, or leave "
                f"trainer.max_epochs unset to train progressive.epochs_per_repo ({epochs_per_repo}) epochs"
            )
        return -1
    if explicit_max_epochs < 0:
        return explicit_max_epochs  # Lightning refuses it, naming the setting
    if explicit_max_epochs <= start:
        raise LeanAgentError(
            f"trainer.max_epochs is {explicit_max_epochs}, but the checkpoint has already trained {start} epoch(s), "
            f"so this fit would train none: give more than {start}, or leave trainer.max_epochs unset "
            f"to train progressive.epochs_per_repo ({epochs_per_repo}) more"
        )
    return explicit_max_epochs


def check_epochs_per_repo(value: object) -> None:
    """The CLI checks it before planning max_epochs from it; the callback again when built without the CLI."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LeanAgentError(f"progressive.epochs_per_repo must be at least 1, got {value}")


class ProgressiveTraining(Callback):
    """Holds `epochs_per_repo` (the CLI's `progressive` group) and logs the plan each fit runs."""

    def __init__(self, epochs_per_repo: int = 1) -> None:
        check_epochs_per_repo(epochs_per_repo)
        self.epochs_per_repo = epochs_per_repo
        self._validation_key: str | None = None
        self._restored_key: str | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"validation_key": self._validation_key}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored_key = state_dict.get("validation_key")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        log.info(
            "rank %d: progressive training from epoch %d to max_epochs=%d",
            trainer.global_rank, trainer.current_epoch, trainer.max_epochs,
        )
        self._validation_key = validation_key(getattr(trainer, "datamodule", None))
        if self._restored_key is not None and self._validation_key is not None and self._restored_key != self._validation_key:
            restart_monitors(trainer)
            log.info("rank %d: the checkpoint was validated on other data: checkpoint selection and early stopping "
                     "start afresh for this fit's validation split", trainer.global_rank)
        self._restored_key = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """A fit that `trainer.max_steps` ends mid-epoch validates its last step, as one that early stopping ends
        does: Lightning validates only at an epoch's end, so checkpoint selection, EarlyStopping (which refuses a
        missing metric) and `test_after_fit` would otherwise have nothing to go on."""
        if 0 <= trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True


def validation_key(datamodule: Any) -> str | None:
    """Identifies what a fit validates on (the val split's states and the premises); None without such data."""
    if datamodule is None or not hasattr(datamodule, "states") or not hasattr(datamodule, "corpus"):
        return None
    try:
        states = datamodule.states("val")
    except LeanAgentError:  # no val split (a fit that never validates): nothing to select on
        return None
    digest = hashlib.sha256(datamodule.corpus.premise_set_key.encode())
    for name, state in zip(states.theorem_names, states.states):
        digest.update(f"\x01{name}\x00{state}".encode())
    return digest.hexdigest()


def restart_monitors(trainer: pl.Trainer) -> None:
    """Forget the best scores (and early stopping's wait) that `--ckpt_path` restored; files stay on disk."""
    for callback in trainer.checkpoint_callbacks:
        worst = torch.tensor(torch.inf if callback.mode == "min" else -torch.inf)
        callback.best_k_models = {}
        callback.kth_best_model_path = ""
        callback.kth_value = worst
        callback.best_model_score = None
        callback.best_model_path = ""
        callback.current_score = None
    for callback in trainer.early_stopping_callbacks:
        callback.wait_count = 0
        callback.stopped_epoch = 0
        callback.best_score = torch.tensor(torch.inf if callback.mode == "min" else -torch.inf)
