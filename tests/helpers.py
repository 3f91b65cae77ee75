"""Test-only helpers: callbacks loaded by real-process tests with `--trainer.callbacks+=tests.helpers.<Name>`,
and functions the tests share that the package itself does not need."""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback

if TYPE_CHECKING:
    from leanagent.models.fisher import FisherInformation


class SleepInStep(Callback):
    """Global rank `$LEANAGENT_TEST_SLEEP_RANK` sleeps inside train step `$LEANAGENT_TEST_SLEEP_STEP` (default 2), before backward."""

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        rank = os.environ.get("LEANAGENT_TEST_SLEEP_RANK")
        step = int(os.environ.get("LEANAGENT_TEST_SLEEP_STEP", "2"))
        if rank is not None and trainer.global_rank == int(rank) and trainer.fit_loop.epoch_loop.batch_idx == step:
            time.sleep(3600)


class SignalAtStep(Callback):
    """Rank 0 sends itself `signal_name` once the global step reaches `step`, as a scheduler would."""

    def __init__(self, step: int, signal_name: str = "SIGTERM") -> None:
        self.step = step
        self.signum = signal.Signals[signal_name]
        self.sent = False

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        if trainer.global_rank == 0 and not self.sent and trainer.global_step >= self.step:
            self.sent = True
            os.kill(os.getpid(), self.signum)


class Dropout(Callback):
    """Turns on dropout with rate `p` in every dropout layer of the model (the presets have none; ByT5-small has 0.1)."""

    def __init__(self, p: float = 0.1) -> None:
        self.p = p

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for module in pl_module.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = self.p
            if hasattr(module, "dropout") and isinstance(module.dropout, float):  # T5Attention's functional dropout
                module.dropout = self.p


def per_example_grads(fisher: "FisherInformation", batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """[B, *shape] gradients of each pair's own loss, in batch order (what the Fisher squares and sums)."""
    names = [name for name, _ in fisher.retriever.encoder.named_parameters()]
    grads = [fisher.example_grad(batch, i) for i in range(len(batch["index"]))]
    return {name: torch.stack([g[j] for g in grads]) for j, name in enumerate(names)}
