"""The resolved config.yaml a run saves, beside its logs."""

from __future__ import annotations

import pytorch_lightning as pl
from pytorch_lightning.cli import SaveConfigCallback


class ConfigBesideLogs(SaveConfigCallback):
    """Lightning's SaveConfigCallback, but only where a logger keeps the run's files. With `trainer.logger=false`
    Lightning writes ./config.yaml into the working folder, over any file of that name (a user's own config
    passed with --config), so a run without a logger saves no config."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if trainer.logger is None:
            return
        super().setup(trainer, pl_module, stage)
