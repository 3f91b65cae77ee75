"""Lightning's ModelCheckpoint, with a `last.ckpt` that always holds the end of the last epoch, written atomically.

With `monitor` set, the pinned Lightning rewrites `last.ckpt` only when a new best is saved, so a
fit whose metric fell in its final epochs leaves an older epoch there. Resuming, the Fisher
config and every lifelong stage read `last.ckpt`; here it is rewritten at the end of every
training epoch, and every file (best and last) is written to a temporary name and renamed.

With no `dirpath`, checkpoints go to `checkpoints/<logger name>` (Lightning's default is a new
versioned folder per run, which a resume or a lifelong stage could not find): a config overlay then
renames a recipe's logs and checkpoints together by setting `trainer.logger.init_args.name`.
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch
from fsspec.implementations.local import LocalFileSystem
from lightning_fabric.utilities.cloud_io import get_filesystem
from pytorch_lightning.callbacks import ModelCheckpoint as LightningModelCheckpoint

from leanagent import compat
from leanagent.errors import DISK_ERRNOS, LeanAgentError, write_failed

log = logging.getLogger("leanagent")


class ModelCheckpoint(LightningModelCheckpoint):
    """Drop-in for `pytorch_lightning.callbacks.ModelCheckpoint` (same arguments)."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.dirpath is None and trainer.loggers and trainer.loggers[0].name:
            self.dirpath = default_dirpath(str(trainer.loggers[0].name), trainer.default_root_dir)
        with warnings.catch_warnings():
            # Lightning's "Checkpoint directory ... exists and is not empty" says nothing about what happens; we do, below.
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
            super().setup(trainer, pl_module, stage)
        self._earlier = []
        if stage == "fit" and trainer.is_global_zero and self.dirpath and os.path.isdir(self.dirpath):
            self._earlier = sorted(p.name for p in Path(self.dirpath).glob("*.ckpt"))

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Said here, not in setup: Lightning sets `trainer.ckpt_path` when it restores, after setup."""
        super().on_fit_start(trainer, pl_module)
        earlier = getattr(self, "_earlier", [])
        if earlier:
            resumed = trainer.ckpt_path is not None
            log.info(
                "%s holds %d checkpoint(s) of an earlier fit (%s): this fit %s; last.ckpt is rewritten at every epoch "
                "end, a best file of the same name is replaced, other files stay",
                self.dirpath, len(earlier), ", ".join(earlier[:3]) + (", ..." if len(earlier) > 3 else ""),
                f"resumes from {trainer.ckpt_path}" if resumed else "starts afresh (it does not resume without --ckpt_path)",
            )

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        """Lightning's private hook for every file it writes (best, last); see docs/private_apis.md."""
        bad = [n for n, p in trainer.lightning_module.named_parameters() if not torch.isfinite(p).all()]
        if bad:  # every rank holds the same weights under DDP, so every rank refuses together
            raise LeanAgentError(
                f"refusing to write {filepath}: the weights hold NaN or infinite values ({bad[0]}, ...) "
                f"at global step {trainer.global_step}; the previous checkpoint is left as it was"
            )
        if not isinstance(get_filesystem(filepath), LocalFileSystem):
            return super()._save_checkpoint(trainer, filepath)
        target = Path(filepath)
        tmp = str(target.with_name(f".{target.name}.tmp"))  # the same name on every rank; rank 0 writes it
        try:
            super()._save_checkpoint(trainer, tmp)
            if trainer.is_global_zero:
                os.replace(tmp, target)
        except OSError as e:
            if trainer.is_global_zero:
                Path(tmp).unlink(missing_ok=True)
            if e.errno not in DISK_ERRNOS:
                raise
            # Lightning stages the file in the temporary folder first, so a full /tmp fails here too.
            raise write_failed(e, filepath, f" (a checkpoint is first written in {tempfile.gettempdir()}, then here); "
                                            "the checkpoints written before it are as they were") from e
        compat.record_checkpoint_saved(self, str(target))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Lightning's own hook writes last.ckpt even under fast_dev_run, which promises no checkpoints."""
        if not trainer.fast_dev_run:
            super().on_train_end(trainer, pl_module)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        # Even if a best checkpoint was just saved at this step: last.ckpt must be this epoch's end.
        if self.save_last and not (trainer.fast_dev_run or trainer.sanity_checking):
            compat.save_last_checkpoint(self, trainer)


def default_dirpath(logger_name: str, root: str | os.PathLike | None = None) -> str:
    """`checkpoints/<logger name>`, under the trainer's default_root_dir when that is not the working folder."""
    folder = os.path.join("checkpoints", logger_name)
    if root is None or os.path.abspath(root) == os.getcwd():
        return folder
    return os.path.join(str(root), folder)
