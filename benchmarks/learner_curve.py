"""Dense validation Recall@10 against training minutes, for several encoder shapes on the same data and objective.

    python -m benchmarks.learner_curve --shapes byt5-tiny byt5-mini byt5-cpu --minutes 20 --steps-per-eval 50

Why: the shipped retriever's shape and recipe were to be chosen by what a CPU-hour buys. Each
shape trains one process on one thread with the recipe of configs/recipes/pretrain.yaml (InfoNCE, in-batch
negatives over the batch, one BM25-mined hard negative, bf16 autocast) for `--minutes` of training time,
validating every `--steps-per-eval` optimizer steps and at the end; the schedule spans `--epochs`. It prints one line per
validation (training minutes, dense Recall@10 on val, BM25's and hybrid's beside it) and a table at the end.
Validation time (embedding the whole corpus) is not counted as training time. It asserts nothing.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytorch_lightning as pl
import torch
from jsonargparse.typing import NonNegativeInt, PositiveFloat, PositiveInt

from benchmarks.arguments import benchmark_parser, run
from leanagent.data.datamodule import RetrievalDataModule
from leanagent.models.encoder import PRESETS
from leanagent.models.retriever import PremiseRetriever
from leanagent.precision import run_precision

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "mathlib-order"


class Curve(pl.Callback):
    """(training minutes, dense / BM25 / hybrid val Recall@10) at every validation, training time only."""

    def __init__(self, shape: str, budget_seconds: float) -> None:
        self.shape, self.points, self.train_seconds, self.budget = shape, [], 0.0, budget_seconds
        self._since, self.last_step = None, -1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._since is None:
            self._since = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.train_seconds + time.perf_counter() - self._since >= self.budget:
            trainer.should_stop = True  # the budget is training time; validation does not count

    def on_validation_start(self, trainer, pl_module) -> None:
        if self._since is not None:
            self.train_seconds += time.perf_counter() - self._since
            self._since = None

    def on_validation_end(self, trainer, pl_module) -> None:
        self.last_step = trainer.global_step
        metrics = trainer.callback_metrics
        point = (self.train_seconds / 60, *(float(metrics[f"Recall@10_val{s}"]) for s in ("", "/bm25", "/hybrid")))
        self.points.append(point)
        print(f"{self.shape:<10} {point[0]:6.1f} min  dense R@10 {point[1]:5.1f}  bm25 {point[2]:5.1f}  "
              f"hybrid {point[3]:5.1f}  (step {trainer.global_step})", flush=True)


def main() -> None:
    p = benchmark_parser(__doc__)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="a LeanDojo Benchmark 4 dataset folder")
    p.add_argument("--split", default="random")
    p.add_argument("--shapes", nargs="+", default=["byt5-tiny", "byt5-mini", "byt5-cpu"], choices=sorted(PRESETS))
    p.add_argument("--minutes", type=PositiveFloat, default=20.0, help="training minutes per shape (validation not counted)")
    p.add_argument("--epochs", type=PositiveInt, default=1, help="the schedule's span; training stops at --minutes first")
    p.add_argument("--steps-per-eval", type=PositiveInt, default=50)
    p.add_argument("--batch-size", type=PositiveInt, default=64)
    p.add_argument("--max-seq-len", type=PositiveInt, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-steps", type=NonNegativeInt, default=30)
    p.add_argument("--seed", type=int, default=3407)
    args = p.parse_args()
    torch.set_num_threads(1)
    curves = {}
    for shape in args.shapes:
        pl.seed_everything(args.seed)
        data = RetrievalDataModule(
            data_path=str(args.data / args.split), corpus_path=str(args.data / "corpus.jsonl"), batch_size=args.batch_size,
            max_seq_len=args.max_seq_len, model_name=shape, seed=args.seed, num_negatives=1, num_in_file_negatives=0,
            num_hard_negatives=1,
        )
        model = PremiseRetriever(model_name=shape, lr=args.lr, warmup_steps=args.warmup_steps, max_seq_len=args.max_seq_len,
                                 loss="infonce", weight_decay=0.01)
        curve = Curve(shape, 60 * args.minutes)
        trainer = pl.Trainer(
            accelerator="cpu", devices=1, strategy="auto", precision=run_precision("bf16-mixed", "cpu"), max_epochs=args.epochs, gradient_clip_val=1.0,
            val_check_interval=args.steps_per_eval, num_sanity_val_steps=0,
            logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[curve],
        )
        trainer.validate(model, datamodule=data, verbose=False)  # the untrained encoder: minute 0
        trainer.fit(model, datamodule=data)
        if curve.last_step != trainer.global_step:  # stopped between validations: one last point
            curve.on_validation_start(trainer, model)
            trainer.validate(model, datamodule=data, verbose=False)
        curves[shape] = curve.points
        params = sum(p.numel() for p in model.encoder.parameters())
        print(f"{shape}: {params / 1e6:.2f}M parameters, {trainer.global_step} steps in {curve.train_seconds / 60:.1f} min", flush=True)
    print(f"\n{args.data.name}/{args.split} val, dense Recall@10 (BM25 / hybrid) by training minutes, one thread:")
    for shape, points in curves.items():
        print(f"{shape:<10} " + "  ".join(f"{m:.1f}: {d:.1f} ({b:.1f}/{h:.1f})" for m, d, b, h in points))


if __name__ == "__main__":
    run(main)
