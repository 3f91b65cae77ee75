"""Test-only callbacks, imported by real-process tests with `--trainer.callbacks+=tests.helpers.<Name>`."""

from __future__ import annotations

import os
import time

from pytorch_lightning.callbacks import Callback


class SleepInStep(Callback):
    """Global rank `$LEANAGENT_TEST_SLEEP_RANK` sleeps inside train step `$LEANAGENT_TEST_SLEEP_STEP` (default 2), before backward."""

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        rank = os.environ.get("LEANAGENT_TEST_SLEEP_RANK")
        step = int(os.environ.get("LEANAGENT_TEST_SLEEP_STEP", "2"))
        if rank is not None and trainer.global_rank == int(rank) and trainer.fit_loop.epoch_loop.batch_idx == step:
            time.sleep(3600)
