"""Test-only callbacks that a real CLI run loads by class path (`--trainer.callbacks+=tests.helpers....`)."""

from __future__ import annotations

import os
import signal

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback


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


class RecordBatches(Callback):
    """Appends `rank epoch step lr index...` per training batch to `path`, to compare two runs' training."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        import torch
        weights = float(sum(p.double().abs().sum() for p in pl_module.parameters()))
        state = trainer.optimizers[0].state
        moments = float(sum(s["exp_avg_sq"].double().sum() for s in state.values() if "exp_avg_sq" in s))
        indices = " ".join(str(int(i)) for i in batch["index"])
        with open(f"{self.path}.{trainer.global_rank}", "a") as f:
            f.write(f"{trainer.current_epoch} {trainer.global_step} {lr:.8g} {weights:.10g} {moments:.10g} {indices}\n")
