"""In-process evaluation of one checkpoint on several datasets (one device; no DDP needed to evaluate)."""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl

from leanagent.checkpoints import load_checkpoint
from leanagent.data.datamodule import RetrievalDataModule
from leanagent.metrics import metric_names
from leanagent.models.fisher import load_retriever
from leanagent.retrieval.fusion import RETRIEVAL_MODES


def evaluate_checkpoint(
    checkpoint: Path,
    datasets: dict[str, tuple[Path, Path]],
    split: str,
    precision: str = "32-true",
    eval_batch_size: int = 64,
    num_retrieved: int = 100,
) -> dict[str, dict[str, float]]:
    """{name: {Recall@1, Recall@10, MRR, Recall@1/dense, ..., MRR/hybrid}} on `split` ("val" or "test") of each dataset.

    The plain names are the checkpoint's default ranking (hybrid); `metric/mode` are each mode's.
    """
    model = load_retriever(checkpoint)
    model.num_retrieved = num_retrieved
    trainer = pl.Trainer(
        accelerator="auto", devices=1, precision=precision, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    results: dict[str, dict[str, float]] = {}
    for name, (data_path, corpus_path) in datasets.items():
        # The checkpoint's own data settings (premise_text, max_seq_len, model_name), not the defaults.
        datamodule = RetrievalDataModule.for_checkpoint(
            load_checkpoint(checkpoint, "retriever checkpoint"), str(data_path), str(corpus_path),
            eval_batch_size=eval_batch_size,
        )
        run = trainer.test if split == "test" else trainer.validate
        logged = run(model, datamodule=datamodule, verbose=False)[0]
        # The plain names are the default mode's (model.retrieval, hybrid); dense and bm25 sit beside them.
        names = metric_names(num_retrieved)
        results[name] = {metric: float(logged[f"{metric}_{split}"]) for metric in names}
        results[name].update({
            f"{metric}/{mode}": float(logged[f"{metric}_{split}/{mode}"]) for mode in RETRIEVAL_MODES for metric in names
        })
    return results
