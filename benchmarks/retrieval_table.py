"""R@1 / R@10 / MRR of BM25, dense and hybrid ranking for one checkpoint on several datasets.

    python -m benchmarks.retrieval_table CHECKPOINT [DATASET ...] [--split-dir random] [--precision 32-true]
    # DATASET: a folder with corpus.jsonl and SPLIT_DIR/{val,test}.json; default data/batteries

For each dataset, in one process on one device: `test` first, with the checkpoint's hybrid weight
(chosen on the validation split it was trained with; on another corpus hybrid is BM25, weight 0),
then `validate`, which chooses the weight again on that dataset's own validation split (as
`validate` always does) and prints R@10/MRR at every candidate weight, then `test` again with that
weight (split `test*`): what a user gets after running `validate` on a new project's own val split.
Prints one row per dataset, split and mode, and the wall time of each evaluation (corpus
embedding, BM25 index and all three rankings included).
"""

from __future__ import annotations

import time
from pathlib import Path

from jsonargparse import Namespace
from jsonargparse.typing import PositiveInt

from benchmarks.arguments import add_optional_positional, benchmark_parser, run, value_or
from leanagent.checkpoint_files import load_checkpoint
from leanagent.data.datamodule import RetrievalDataModule
from leanagent.lifelong.evaluation import evaluate, evaluation_trainer
from leanagent.models.loading import load_retriever
from leanagent.precision import PRECISIONS
from leanagent.retrieval.fusion import RETRIEVAL_MODES

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("checkpoint", type=Path)
    add_optional_positional(parser, "datasets", "*", type=Path, help="dataset folders (default: the bundled one)")
    parser.add_argument("--split-dir", default="random")
    parser.add_argument("--precision", default="32-true", choices=[str(p) for p in PRECISIONS if isinstance(p, str)])
    parser.add_argument("--eval-batch-size", type=PositiveInt, default=64)
    args = parser.parse_args()
    args.datasets = value_or(args, "datasets", [REPO / "data" / "batteries"])
    rows, grids = [], []
    for dataset in args.datasets:
        model = load_retriever(args.checkpoint)  # fresh per dataset: the checkpoint's own hybrid weight
        stored = sorted(model.hybrid_weights.values())
        trainer = evaluation_trainer(args.precision)
        datamodule = RetrievalDataModule.for_checkpoint(  # the checkpoint's premise_text, max_seq_len, model_name
            load_checkpoint(args.checkpoint, "checkpoint"), str(dataset / args.split_dir), str(dataset / "corpus.jsonl"),
            eval_batch_size=args.eval_batch_size,
        )
        for split in ("test", "val", "test*"):
            start = time.perf_counter()
            metrics = evaluate(model, datamodule, split.rstrip("*"), trainer)
            elapsed = time.perf_counter() - start
            weight = metrics["hybrid_weight"]
            for mode in RETRIEVAL_MODES:
                if split == "test*" and mode != "hybrid":
                    continue  # dense and BM25 do not depend on the weight
                suffix = "" if mode == "dense" else f"/{mode}"  # the plain names are the dense ranking
                values = [metrics[f"{m}{suffix}"] for m in ("Recall@1", "Recall@10", "MRR")]
                rows.append((dataset.name, split, mode, *values, weight if mode == "hybrid" else None, elapsed))
            print(f"{dataset.name} {split}: {elapsed:.0f} s (checkpoint weights {stored})", flush=True)
            if split == "val":
                grid = "  ".join(f"{w:.1f}: {v[1]:.1f}/{v[2]:.3f}" for w, v in sorted(model.eval_by_weight.items()))
        grids.append(f"{dataset.name} val, R@10/MRR by dense weight: {grid}")
        _table(args, rows, grids)  # after each dataset, so a long run shows what it has


def _table(args: Namespace, rows: list[tuple], grids: list[str]) -> None:
    print("\n" + "\n".join(grids))
    print(f"\ncheckpoint {args.checkpoint}, split folder {args.split_dir}; hybrid weight: test = the checkpoint's "
          "(0 = BM25 on premises other than those it was chosen on), val = chosen on this val split")
    print(f"| {'dataset':<20} | split | mode   |   R@1 |  R@10 |   MRR | weight | wall s |")
    print(f"|{'-' * 22}|-------|--------|-------|-------|-------|--------|--------|")
    for name, split, mode, r1, r10, mrr, weight, elapsed in rows:
        w = f"{weight:.1f}" if weight is not None else ""
        print(f"| {name:<20} | {split:<5} | {mode:<6} | {r1:5.1f} | {r10:5.1f} | {mrr:.3f} | {w:>6} | {elapsed:6.0f} |", flush=True)


if __name__ == "__main__":
    run(main)
