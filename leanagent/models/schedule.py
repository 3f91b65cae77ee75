"""The learning-rate plan of one fit: warmup then cosine decay over the fit's own optimizer steps.

A fit that continues an earlier one (a new stage, or a resume) plans from where it starts, and the
lr and weight decay this run was given win over those restored with the optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import pytorch_lightning as pl
import torch

from leanagent.compat import set_last_lr
from leanagent.errors import LeanAgentError


def warmup_cosine(warmup_steps: int, total_steps: int, start_step: int = 0) -> Callable[[int], float]:
    """LeanAgent's schedule (transformers' `get_cosine_schedule_with_warmup`) over one fit.

    The fit's optimizer steps are `start_step .. start_step + total_steps - 1`: linear warmup from 0
    over `warmup_steps`, then cosine decay that reaches zero at `start_step + total_steps`.
    """

    def factor(step: int) -> float:
        s = max(0, step - start_step)
        if s < warmup_steps:
            return s / max(1, warmup_steps)
        progress = (s - warmup_steps) / max(1, total_steps - warmup_steps)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))

    return factor


def fit_steps(trainer: pl.Trainer, start_epoch: int, start_step: int) -> int:
    """Optimizer steps of the fit being run: from its first epoch to `max_epochs` (or `max_steps`)."""
    steps = math.inf
    if trainer.max_epochs is not None and trainer.max_epochs >= 0:
        trainer.estimated_stepping_batches  # sets up the train dataloader, so num_training_batches is known
        per_epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
        steps = per_epoch * (trainer.max_epochs - start_epoch)
    if trainer.max_steps is not None and trainer.max_steps >= 0:
        steps = min(steps, trainer.max_steps - start_step)
    if not math.isfinite(steps):
        raise LeanAgentError("the fit has no end (trainer.max_epochs and max_steps unset): the LR schedule needs one")
    return max(1, int(steps))


def adamw_with_schedule(
    parameters: Iterable[torch.nn.Parameter], lr: float, weight_decay: float, warmup_steps: int, total_steps: int, start_step: int
) -> dict[str, Any]:
    """AdamW and its per-step warmup-cosine scheduler, as `configure_optimizers` returns them."""
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(warmup_steps, total_steps, start_step), last_epoch=-1)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def override_restored(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR,
                      lr: float, weight_decay: float) -> None:
    """After a resume, the restored optimizer and scheduler carry the checkpoint's lr and weight decay:
    the values this run was given win, and the LR follows this fit's schedule from its current step."""
    factor = scheduler.lr_lambdas[0](scheduler.last_epoch)
    for group in optimizer.param_groups:
        group["initial_lr"] = lr
        group["lr"] = lr * factor
        group["weight_decay"] = weight_decay
    scheduler.base_lrs = [lr] * len(optimizer.param_groups)
    set_last_lr(scheduler, [group["lr"] for group in optimizer.param_groups])
