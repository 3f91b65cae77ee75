"""The resolved config.yaml a run saves, beside its logs."""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
from pytorch_lightning.cli import SaveConfigCallback


class ConfigBesideLogs(SaveConfigCallback):
    """Lightning's SaveConfigCallback, but never into the working folder. With `trainer.logger=false` and no
    `trainer.default_root_dir`, Lightning writes ./config.yaml there, over any file of that name (a user's own
    config passed with --config), so such a run saves no config."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if trainer.logger is None and Path(trainer.log_dir or ".").resolve() == Path.cwd().resolve():
            return
        super().setup(trainer, pl_module, stage)
