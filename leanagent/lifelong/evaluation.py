"""In-process evaluation of one checkpoint on several datasets (one device; no DDP needed to evaluate)."""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl

from leanagent.checkpoint_files import load_checkpoint
from leanagent.data.datamodule import RetrievalDataModule
from leanagent.retrieval.metrics import metric_names
from leanagent.models.loading import load_retriever
from leanagent.retrieval.fusion import BASELINE_MODES


def evaluate_checkpoint(
    checkpoint: Path,
    datasets: dict[str, tuple[Path, Path]],
    split: str,
    precision: str = "32-true",
    eval_batch_size: int = 64,
    num_retrieved: int = 100,
) -> dict[str, dict[str, float]]:
    """{name: {Recall@1, Recall@10, MRR, Recall@1/bm25, ..., MRR/hybrid, hybrid_weight}} on `split` of each dataset.

    The plain names are the trained (dense) ranking; `/bm25` and `/hybrid` sit beside them. Hybrid on a
    dataset uses the weight chosen on that dataset's own validation split, so "test" validates first.
    """
    splits = ("val", "test") if split == "test" else (split,)
    return evaluate_splits(checkpoint, datasets, splits, precision, eval_batch_size, num_retrieved)[split]


def evaluate_splits(
    checkpoint: Path,
    datasets: dict[str, tuple[Path, Path]],
    splits: tuple[str, ...] = ("val", "test"),
    precision: str = "32-true",
    eval_batch_size: int = 64,
    num_retrieved: int = 100,
) -> dict[str, dict[str, dict[str, float]]]:
    """{split: {name: metrics}} (see `evaluate_checkpoint`), the splits run in the order given on each
    dataset; the corpus is embedded once per dataset and the hybrid weight chosen on its "val"."""
    model = load_retriever(checkpoint)
    model.num_retrieved = num_retrieved
    trainer = pl.Trainer(
        accelerator="auto", devices=1, precision=precision, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    names = metric_names(num_retrieved)
    saved = load_checkpoint(checkpoint, "retriever checkpoint")  # read once, for every dataset's data settings
    results: dict[str, dict[str, dict[str, float]]] = {split: {} for split in splits}
    for name, (data_path, corpus_path) in datasets.items():
        # The checkpoint's own data settings (premise_text, max_seq_len, model_name), not the defaults.
        datamodule = RetrievalDataModule.for_checkpoint(saved, str(data_path), str(corpus_path), eval_batch_size=eval_batch_size)
        for split in splits:
            run = trainer.test if split == "test" else trainer.validate
            logged = run(model, datamodule=datamodule, verbose=False)[0]
            metrics = {metric: float(logged[f"{metric}_{split}"]) for metric in names}
            metrics.update({
                f"{metric}/{mode}": float(logged[f"{metric}_{split}/{mode}"]) for mode in BASELINE_MODES for metric in names
            })
            metrics["hybrid_weight"] = float(logged[f"hybrid_weight_{split}"])
            results[split][name] = metrics
    return results
