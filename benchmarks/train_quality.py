"""Does training improve the premise retriever on CPU? Validation before and after each epoch, in one process.

Why: with the default config (byt5-tiny, loss "mse", lr 2e-3, warmup 2) validation on
data/batteries/random got worse after training than the untrained model. This script trains
`PremiseRetriever` on `RetrievalDataModule` directly (one CPU process, one torch thread, no
logger or checkpoints), so losses, learning rates and model sizes can be compared quickly.

It prints one line per evaluation (epoch 0 = untrained) with Recall@1/Recall@10/MRR of the dense
ranking and of hybrid on the validation split and wall times, a summary line (dense), then the test
split of the training dataset and of each `--test-datasets` folder (cross-dataset transfer; there
hybrid falls back to BM25, as its weight was chosen on another corpus). One process with --batch-size 8 takes 4x
the optimizer steps per epoch of the default 4-rank run; --batch-size 32 (with --accumulate 4)
matches its effective batch of 128 and its ~11 steps per epoch. Run from the repository root:

    python -m benchmarks.train_quality --loss infonce --lr 5e-4 --warmup-steps 2 --epochs 3 --batch-size 32
"""

from __future__ import annotations

import time

import pytorch_lightning as pl
import torch

from jsonargparse import Namespace
from jsonargparse.typing import NonNegativeInt, PositiveInt

from benchmarks.arguments import benchmark_parser, run
from leanagent.data.datamodule import RetrievalDataModule
from leanagent.lifelong.evaluation import evaluate
from leanagent.models.losses import LOSSES
from leanagent.models.retriever import PremiseRetriever
from leanagent.precision import PRECISIONS, run_precision

METRICS = ("Recall@1_val", "Recall@10_val", "MRR_val")
MODES = ("dense", "bm25", "hybrid")


class Report(pl.Callback):
    """Prints the validation metrics and timings after every validation run."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.train_seconds = 0.0
        self._train_start = self._val_start = 0.0

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._train_start = time.perf_counter()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._val_start = time.perf_counter()
        # In fit, validation runs at the end of the training epoch: its training time ends here.
        self._epoch_train = self._val_start - self._train_start if trainer.state.fn == "fit" else 0.0
        self.train_seconds += self._epoch_train

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        fitting = trainer.state.fn == "fit"
        row = {
            "epoch": trainer.current_epoch + 1 if fitting else 0,
            "steps": trainer.global_step,
            **{name: float(trainer.callback_metrics[name]) for name in METRICS},  # plain names: dense
            "hybrid": [float(trainer.callback_metrics[f"{name}/hybrid"]) for name in METRICS],
            "train_s": self._epoch_train,
            "val_s": time.perf_counter() - self._val_start,
        }
        self.rows.append(row)
        print(
            f"epoch {row['epoch']:2d}  steps {row['steps']:3d}  R@1 {row['Recall@1_val']:5.1f}  "
            f"R@10 {row['Recall@10_val']:5.1f}  MRR {row['MRR_val']:.3f} (dense)  "
            f"hybrid {row['hybrid'][0]:5.1f}/{row['hybrid'][1]:5.1f}/{row['hybrid'][2]:.3f}  "
            f"train {row['train_s']:6.1f}s  val {row['val_s']:5.1f}s",
            flush=True,
        )


def parse_args() -> Namespace:
    p = benchmark_parser(__doc__)
    p.add_argument("--loss", choices=LOSSES, default="mse")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-steps", type=NonNegativeInt, default=2)
    p.add_argument("--epochs", type=PositiveInt, default=1)
    p.add_argument("--model-name", default="byt5-tiny")
    p.add_argument("--batch-size", type=PositiveInt, default=8)
    p.add_argument("--accumulate", type=PositiveInt, default=4)
    p.add_argument("--max-seq-len", type=PositiveInt, default=512)
    p.add_argument("--limit-train-batches", type=int | float | None, default=None, help="int = batches, float = fraction")
    p.add_argument("--data-path", default="data/batteries/random")
    p.add_argument("--corpus-path", default="data/batteries/corpus.jsonl")
    p.add_argument("--precision", default="bf16-mixed", choices=[str(p) for p in PRECISIONS if isinstance(p, str)])
    p.add_argument("--seed", type=int, default=3407)
    p.add_argument("--num-hard-negatives", type=NonNegativeInt, default=0, help="BM25-mined negatives among the 3 per pair")
    p.add_argument("--test-datasets", nargs="*", default=[],
                   help="dataset folders whose random/test split the trained model is tested on (cross-dataset transfer)")
    p.add_argument("--premise-text", choices=("serialized", "code"), default="serialized",
                   help="what the encoder reads for a premise (ReProver's serialized form, or raw code)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    pl.seed_everything(args.seed)  # before building the model, as LightningCLI does: same initial weights
    data = RetrievalDataModule(
        data_path=args.data_path,
        corpus_path=args.corpus_path,
        batch_size=args.batch_size,
        max_seq_len=args.max_seq_len,
        model_name=args.model_name,
        seed=args.seed,
        premise_text=args.premise_text,
        num_hard_negatives=args.num_hard_negatives,
    )
    model = PremiseRetriever(
        model_name=args.model_name,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        max_seq_len=args.max_seq_len,
        loss=args.loss,
    )
    report = Report()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy="auto",
        precision=run_precision(args.precision, "cpu"),
        max_epochs=args.epochs,
        accumulate_grad_batches=args.accumulate,
        gradient_clip_val=1.0,
        limit_train_batches=args.limit_train_batches,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[report],
    )
    print(f"config: {vars(args)}", flush=True)
    start = time.perf_counter()
    trainer.validate(model, datamodule=data, verbose=False)
    trainer.fit(model, datamodule=data)
    before, after = report.rows[0], report.rows[-1]
    best = max(report.rows[1:], key=lambda r: r["MRR_val"], default=after)
    print(
        f"summary (dense): premise_text={args.premise_text} hard={args.num_hard_negatives} loss={args.loss} lr={args.lr:g} warmup={args.warmup_steps} model={args.model_name} "
        f"bs={args.batch_size}x{args.accumulate} epochs={args.epochs} steps={after['steps']}  "
        f"R@1/R@10/MRR before {before['Recall@1_val']:.1f}/{before['Recall@10_val']:.1f}/{before['MRR_val']:.3f}  "
        f"final {after['Recall@1_val']:.1f}/{after['Recall@10_val']:.1f}/{after['MRR_val']:.3f}  "
        f"best epoch {best['epoch']} MRR {best['MRR_val']:.3f}  "
        f"train {report.train_seconds:.0f}s  total {time.perf_counter() - start:.0f}s",
        flush=True,
    )
    for folder in [args.data_path.rsplit("/", 1)[0], *args.test_datasets]:
        test_data = RetrievalDataModule(
            data_path=f"{folder}/random", corpus_path=f"{folder}/corpus.jsonl", max_seq_len=args.max_seq_len,
            model_name=args.model_name, premise_text=args.premise_text,
        )
        metrics = evaluate(model, test_data, "test", trainer)

        def cell(mode: str) -> str:
            suffix = "" if mode == "dense" else f"/{mode}"  # the plain names are the dense ranking
            r1, r10, mrr = (metrics[f"{m}{suffix}"] for m in ("Recall@1", "Recall@10", "MRR"))
            return f"{mode} {r1:.1f}/{r10:.1f}/{mrr:.3f}"

        cells = "  ".join(cell(mode) for mode in MODES)
        print(f"test {folder}: R@1/R@10/MRR {cells}  (hybrid weight {metrics['hybrid_weight']:.1f})", flush=True)


if __name__ == "__main__":
    run(main)
