"""Barriers that keep DDP ranks in step around data loading and the end of fit, as LeanAgent does."""

from __future__ import annotations

import logging
import time

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback

from leanagent.distributed import process_group_timeout
from leanagent.faults.watchdog import beat

log = logging.getLogger("leanagent")


def timed_barrier(trainer: pl.Trainer, name: str) -> float:
    """Wait for every rank, log how long this one waited; a single process passes straight through."""
    start = time.perf_counter()
    beat({"before_data_loading": "data loading barrier", "after_fit": "after-fit barrier"}.get(name, f"barrier {name}"), trainer=trainer)
    trainer.strategy.barrier(name)
    waited = time.perf_counter() - start
    log.info("rank %d/%d: barrier '%s' passed after %.3fs", trainer.global_rank, trainer.world_size, name, waited)
    return waited


class DataLoadingBarrier(Callback):
    """Runs in `setup`, which precedes the (lazy) loading of corpus and splits by the datamodule."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        timeout = process_group_timeout()
        if timeout is not None:
            log.info("rank %d/%d: process group timeout %s", trainer.global_rank, trainer.world_size, timeout)
        timed_barrier(trainer, "before_data_loading")


class FitEndBarrier(Callback):
    """No rank leaves fit (and starts writing or exiting) before the others have finished."""

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        timed_barrier(trainer, "after_fit")
