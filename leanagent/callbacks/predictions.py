"""Writes `predict` results as one JSONL file: retrieved premises (full name, path, score) per tactic state."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch.distributed as dist
from pytorch_lightning.callbacks import BasePredictionWriter

from leanagent.io import atomic_open, write_target

log = logging.getLogger("leanagent")


class PremisePredictionWriter(BasePredictionWriter):
    def __init__(self, output_path: str | None = None) -> None:
        """
        Args:
            output_path: the JSONL file; default `predictions.jsonl` in the trainer's log folder.
        """
        super().__init__(write_interval="epoch")
        self.output_path = output_path

    def write_on_epoch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, predictions: Any, batch_indices: Any
    ) -> None:
        batches = predictions[0] if predictions and isinstance(predictions[0], list) else predictions
        local = [
            (int(i), ids.tolist(), scores.tolist())
            for batch in batches
            for i, ids, scores in zip(batch["index"], batch["retrieved"], batch["scores"])
        ]
        if dist.is_available() and dist.is_initialized() and trainer.world_size > 1:
            # Only rank 0 writes: gather to it, rather than sending every rank every other rank's predictions.
            gathered: list[Any] | None = [None] * trainer.world_size if trainer.global_rank == 0 else None
            dist.gather_object(local, gathered, dst=0)
            rows = [row for part in gathered for row in part] if gathered is not None else []
        else:
            rows = local
        # trainer.log_dir is a broadcast under DDP: every rank must ask.
        path = Path(self.output_path or Path(trainer.log_dir or ".") / "predictions.jsonl")
        if trainer.global_rank == 0:
            self._write(path, trainer.datamodule, rows)
            log.info("wrote %d tactic states' retrieved premises to %s", len({r[0] for r in rows}), path)

    @staticmethod
    def _write(path: Path, datamodule: Any, rows: list[tuple[int, list[int], list[float]]]) -> None:
        corpus = datamodule.corpus
        states = datamodule.states("predict")
        unique = {index: (ids, scores) for index, ids, scores in rows}
        with atomic_open(write_target(path), "w", encoding="utf-8") as f:
            for index in sorted(unique):
                ids, scores = unique[index]
                record = {
                    "file_path": corpus.paths[states.file_ids[index]],
                    "theorem": states.theorem_names[index],
                    "tactic_index": states.tactic_indices[index],
                    "state": states.states[index],
                    "retrieved": [
                        {"full_name": corpus.names[p], "path": corpus.paths[corpus.premise_file[p]], "score": s}
                        for p, s in zip(ids, scores)
                        if p >= 0
                    ],
                }
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
