"""Hybrid at every candidate weight on val and on test: what the weight rule leaves on the table.

    python -m benchmarks.hybrid_weights CHECKPOINT DATASET [DATASET ...] [--split-dir random] [--precision bf16-mixed]

For each dataset, the checkpoint is validated on its val split (which evaluates every weight of the grid and
chooses one with `fusion.choose_weight`), then on its test split served as a validation split, so that test,
too, is evaluated at every weight. Prints one row per weight with val and test R@1 / R@10 / MRR and the val
z of its Recall@10 gain over BM25 (what the rule tests), marks the weight the rule chose and the one with the
best val R@10, and their test R@10 beside BM25's (weight 0).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from jsonargparse.typing import PositiveInt

from benchmarks.arguments import benchmark_parser, run
from leanagent.checkpoint_files import load_checkpoint
from leanagent.data.datamodule import RetrievalDataModule
from leanagent.lifelong.evaluation import evaluation_trainer
from leanagent.models.loading import load_retriever
from leanagent.precision import PRECISIONS
from leanagent.retrieval.fusion import gain_z


def weights_on(model, saved: dict, split_dir: Path, corpus: Path, precision: str, batch: int) -> tuple[dict, dict, float]:
    """{weight: [R@1, R@10, MRR]} of a validation pass on `split_dir`, {weight: z of its gain over BM25},
    and the weight it chose."""
    datamodule = RetrievalDataModule.for_checkpoint(saved, str(split_dir), str(corpus), eval_batch_size=batch)
    logged = evaluation_trainer(precision).validate(model, datamodule=datamodule, verbose=False)[0]
    rows = model.eval_per_example
    z = {w: gain_z(rows[w].double(), rows[0.0].double()) for w in rows}
    return dict(model.eval_by_weight), z, round(float(logged["hybrid_weight_val"]), 1)  # logged as float32


def val_and_test(model, saved: dict, dataset: Path, split_dir: str, precision: str, batch: int) -> tuple[dict, dict, float, dict]:
    """`weights_on` the dataset's val split (means, z, chosen weight), then the means of every weight on its test split."""
    split, corpus = dataset / split_dir, dataset / "corpus.jsonl"
    val, z, chosen = weights_on(model, saved, split, corpus, precision, batch)
    with tempfile.TemporaryDirectory() as tmp:  # test served as val: the same pass, every weight evaluated
        for name, source in (("train", "train"), ("val", "test"), ("test", "test")):
            (Path(tmp) / f"{name}.json").symlink_to((split / f"{source}.json").resolve())
        test, _, _ = weights_on(model, saved, Path(tmp), corpus, precision, batch)
    return val, z, chosen, test


def checkpoint_on_datasets(doc: str | None):
    """Arguments of a benchmark that evaluates one checkpoint on datasets: (args, model, its checkpoint dict)."""
    parser = benchmark_parser(doc)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("datasets", nargs="+", type=Path, help="dataset folders (corpus.jsonl and SPLIT_DIR/)")
    parser.add_argument("--split-dir", default="random")
    parser.add_argument("--precision", default="bf16-mixed", choices=[str(p) for p in PRECISIONS if isinstance(p, str)])
    parser.add_argument("--eval-batch-size", type=PositiveInt, default=64)
    args = parser.parse_args()
    return args, load_retriever(args.checkpoint), load_checkpoint(args.checkpoint, "checkpoint")


def main() -> None:
    args, model, saved = checkpoint_on_datasets(__doc__)
    for dataset in args.datasets:
        val, z, chosen, test = val_and_test(model, saved, dataset, args.split_dir, args.precision, args.eval_batch_size)
        best = max(val, key=lambda w: (val[w][1], val[w][2], val[w][0], -w))
        print(f"\n{dataset.name}: weight of the dense side, val and test R@1 / R@10 / MRR")
        for weight in sorted(val):
            mark = " <- chosen" if weight == chosen else ""
            mark += " <- best val R@10" if weight == best else ""
            v, t = val[weight], test[weight]
            print(f"  {weight:.1f}  val {v[0]:5.1f} {v[1]:5.1f} {v[2]:.3f} z {z[weight]:5.2f}   "
                  f"test {t[0]:5.1f} {t[1]:5.1f} {t[2]:.3f}{mark}")
        print(f"  test R@10: BM25 {test[0.0][1]:.1f}, dense {test[1.0][1]:.1f}, chosen ({chosen:.1f}) {test[chosen][1]:.1f}, "
              f"best val R@10 ({best:.1f}) {test[best][1]:.1f}")


if __name__ == "__main__":
    run(main)
