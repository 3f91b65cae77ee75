"""Evaluation of a retriever on datasets, in process on one device: the one path every evaluation takes.

`evaluate` runs Lightning's validate or test on one dataset and returns the metrics by their plain
names; `evaluate_splits` does that for a checkpoint over several datasets
(the lifelong runner), and the benchmarks call `evaluate` for their own orders of runs.
"""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl

from leanagent.checkpoint_files import load_checkpoint
from leanagent.data.datamodule import RetrievalDataModule
from leanagent.models.loading import load_retriever
from leanagent.models.retriever import PremiseRetriever
from leanagent.precision import run_precision
from leanagent.retrieval.fusion import BASELINE_MODES
from leanagent.retrieval.metrics import metric_names


def evaluation_trainer(precision: str = "32-true") -> pl.Trainer:
    """One device, nothing written: no logger, checkpoints, progress bar or summary; bf16 only where it is native
    (leanagent/precision.py)."""
    return pl.Trainer(
        accelerator="auto", devices=1, precision=run_precision(precision), logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )


def evaluate(model: PremiseRetriever, datamodule: RetrievalDataModule, split: str, trainer: pl.Trainer) -> dict[str, float]:
    """{Recall@1, Recall@10, MRR, Recall@1/bm25, ..., MRR/hybrid, hybrid_weight} of `model` on `split` ("val" or "test").

    The plain names are the trained (dense) ranking; `/bm25` and `/hybrid` sit beside them. "val"
    also chooses the hybrid weight for the dataset's premises, which a later "test" uses.
    """
    run = trainer.test if split == "test" else trainer.validate
    logged = run(model, datamodule=datamodule, verbose=False)[0]
    names = metric_names(model.num_retrieved)
    metrics = {metric: float(logged[f"{metric}_{split}"]) for metric in names}
    metrics.update({f"{metric}/{mode}": float(logged[f"{metric}_{split}/{mode}"]) for mode in BASELINE_MODES for metric in names})
    metrics["hybrid_weight"] = float(logged[f"hybrid_weight_{split}"])
    return metrics


def evaluate_splits(
    checkpoint: Path,
    datasets: dict[str, tuple[Path, Path]],
    splits: tuple[str, ...] = ("val", "test"),
    precision: str = "32-true",
    eval_batch_size: int = 64,
    num_retrieved: int = 100,
) -> dict[str, dict[str, dict[str, float]]]:
    """{split: {name: metrics}} (see `evaluate`), the splits run in the order given on each dataset.

    The corpus is embedded once per dataset. Hybrid on a dataset uses the weight chosen on that
    dataset's own validation split, so test results need "val" before "test".
    """
    model = load_retriever(checkpoint)
    model.num_retrieved = num_retrieved
    trainer = evaluation_trainer(precision)
    saved = load_checkpoint(checkpoint, "retriever checkpoint")  # read once, for every dataset's data settings
    results: dict[str, dict[str, dict[str, float]]] = {split: {} for split in splits}
    for name, (data_path, corpus_path) in datasets.items():
        # The checkpoint's own data settings (premise_text, max_seq_len, model_name), not the defaults.
        datamodule = RetrievalDataModule.for_checkpoint(saved, str(data_path), str(corpus_path), eval_batch_size=eval_batch_size)
        for split in splits:
            results[split][name] = evaluate(model, datamodule, split, trainer)
    return results
