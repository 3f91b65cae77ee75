"""Preemption and Ctrl-C: stop every rank at the next optimizer step, save a resumable last.ckpt, exit non-zero.

SLURM and Kubernetes send SIGTERM before killing a job; a terminal sends SIGINT to every rank. The
signal handler only sets a flag (no collective may run inside a handler) and passes nothing on; at each
optimizer-step boundary the ranks agree on it with one tiny all-reduce (so a signal that reached one
rank stops them all), rank 0 writes `last.ckpt` through the
checkpoint callback (atomically), and every rank raises `Preempted`, which the CLI turns into one
line saying how to resume and exit code 128 + signal. A second Ctrl-C stops at once.

Under SLURM with Lightning's auto-requeue (its `SLURMEnvironment`), Lightning's own handlers are
kept: it saves an `hpc_ckpt_*.ckpt` on the requeue signal and restores it when the job restarts.
Otherwise this callback's handlers replace Lightning's SIGTERM handler for the fit: that one forwards
the signal to the ranks it spawned and runs a broadcast inside the handler (a collective that can
deadlock against a rank inside its own), does nothing about SIGINT and writes no checkpoint.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from types import FrameType
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.plugins.environments import SLURMEnvironment
from pytorch_lightning.callbacks import Callback

from leanagent import compat
from leanagent.errors import LeanAgentError

log = logging.getLogger("leanagent")


class Preempted(Exception):
    """Raised on every rank once a resumable checkpoint of the interrupted fit is on disk."""

    def __init__(self, signum: int, checkpoint: str | None, epoch: int, step: int, resumable: bool = True) -> None:
        self.signum = signum
        self.checkpoint = checkpoint
        name = signal.Signals(signum).name
        if not resumable:
            # A pass with no optimizer (the Fisher computation) cannot continue from a checkpoint: `fit`
            # refuses one without optimizer state, so the only advice that works is to run it again.
            super().__init__(f"stopped by {name} at epoch {epoch}, step {step}; this pass (no optimizer, such as the "
                             "Fisher computation) cannot resume: run the same command again to compute it from the start")
            return
        where = f"saved {checkpoint} at epoch {epoch}, step {step}" if checkpoint else "no checkpoint callback to save with"
        super().__init__(
            f"stopped by {name}: {where}; to resume, run the same command with --ckpt_path={checkpoint}"
            if checkpoint else f"stopped by {name}: {where}"
        )


class PreemptionCheckpoint(Callback):
    def __init__(self, signals: list[str] = ["SIGTERM", "SIGINT"]) -> None:
        """
        Args:
            signals: signal names that stop the fit at the next optimizer step with a checkpoint.
        """
        try:
            self.signals = [signal.Signals[name] for name in signals]
        except KeyError as e:
            raise LeanAgentError(f"preemption.signals: unknown signal {e.args[0]!r}") from None
        if uncatchable := [s.name for s in self.signals if s in (signal.SIGKILL, signal.SIGSTOP)]:
            raise LeanAgentError(f"preemption.signals: {', '.join(uncatchable)} cannot be caught, so nothing can save on it; "
                                 "name signals a process can handle (SIGTERM, SIGINT, SIGUSR1, ...)")
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        """Only sets the flag. Nothing is passed on to the other ranks: a terminal's Ctrl-C (and SLURM's
        SIGTERM) reaches every rank already, where a forwarded copy would count as a second Ctrl-C and stop
        that rank at once; a signal sent to one rank reaches the others through the all-reduce."""
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.received = signum

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After Lightning has registered its own SIGTERM handler (which runs a collective inside the handler).
        environment = compat.cluster_environment(trainer)
        if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
            log.info("SLURM auto-requeue is on: Lightning's own signal handling saves and requeues")
            return
        self.received = None
        for signum in self.signals:
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                return

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._restore()

    def _agreed_signal(self, trainer: pl.Trainer) -> int:
        flag = torch.tensor([self.received or 0], dtype=torch.int64, device=trainer.strategy.root_device)
        if dist.is_available() and dist.is_initialized() and trainer.world_size > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self._previous:
            return
        at_step_boundary = (batch_idx + 1) % trainer.accumulate_grad_batches == 0 or (
            batch_idx + 1 == trainer.num_training_batches
        )
        if not at_step_boundary:
            return
        signum = self._agreed_signal(trainer)
        if not signum:
            return
        if not _has_optimizer(trainer, pl_module):
            # No optimizer (configure_optimizers gave none): nothing a resumed fit could continue; write no checkpoint.
            raise Preempted(signum, None, trainer.current_epoch, trainer.global_step, resumable=False)
        raise Preempted(signum, self._save(trainer), trainer.current_epoch, trainer.global_step)

    @staticmethod
    def _save(trainer: pl.Trainer) -> str | None:
        """last.ckpt through the checkpoint callback (atomic with ours), else a file beside the logs."""
        callback = trainer.checkpoint_callback
        if callback is not None and callback.save_last and callback.dirpath:
            compat.save_last_checkpoint(callback, trainer)
            return callback.last_model_path
        path = os.path.join(trainer.default_root_dir, "preempted.ckpt")
        tmp = path + ".tmp"
        try:
            trainer.save_checkpoint(tmp)
            if trainer.is_global_zero:
                os.replace(tmp, path)
        except OSError:
            if trainer.is_global_zero:
                Path(tmp).unlink(missing_ok=True)
            raise
        return path


def _has_optimizer(trainer: pl.Trainer, pl_module: pl.LightningModule) -> bool:
    """False when `configure_optimizers` gave none: Lightning then holds a stand-in over a tensor of its own."""
    own = {id(p) for p in pl_module.parameters()}
    return any(id(p) in own for optimizer in trainer.optimizers for group in optimizer.param_groups for p in group["params"])
