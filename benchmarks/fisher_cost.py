"""What a Fisher pass costs against a plain training pass over the same batches, in one process.

    python -m benchmarks.fisher_cost [--data DATASET] [--model byt5-tiny] [--batches N] [--threads 1]

For real training batches of the data module (configs/fisher.yaml's settings: batch 8, 3 negatives,
max_seq_len 512), times per batch:
  plain      forward + backward of the in-batch training loss (what a training step costs, no optimizer)
  empirical  the squared per-example gradients of `mode: empirical` (one autograd pass per pair)
  leanagent  the in-batch gradient of `mode: leanagent` (torch.func grad) and its square
and prints the ratios empirical/plain and leanagent/plain (issue 13's targets: <= 1.5x and <= 1.1x).
Best of `--rounds` rounds per batch, CPU time of this process (load on the other cores disturbs it least).
It asserts nothing: timed tests would be flaky.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from jsonargparse.typing import PositiveInt

from benchmarks.arguments import benchmark_parser, run
from leanagent.data.datamodule import RetrievalDataModule
from leanagent.models.fisher import FisherInformation
from leanagent.models.losses import batch_loss
from leanagent.models.retriever import PremiseRetriever

REPO = Path(__file__).resolve().parents[1]


def cpu_seconds(fn, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--data", type=Path, default=REPO / "data" / "batteries")
    parser.add_argument("--model", default="byt5-tiny")
    parser.add_argument("--batches", type=PositiveInt, default=4)
    parser.add_argument("--rounds", type=PositiveInt, default=3)
    parser.add_argument("--threads", type=PositiveInt, default=1)
    parser.add_argument("--batch-size", type=PositiveInt, default=8)
    parser.add_argument("--max-seq-len", type=PositiveInt, default=512)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    data = RetrievalDataModule(data_path=str(args.data / "random"), corpus_path=str(args.data / "corpus.jsonl"),
                               batch_size=args.batch_size, max_seq_len=args.max_seq_len, model_name=args.model)
    pairs = data.train_pairs
    retriever = PremiseRetriever(model_name=args.model, max_seq_len=args.max_seq_len)
    fisher = FisherInformation.__new__(FisherInformation)  # its methods, without loading a checkpoint
    torch.nn.Module.__init__(fisher)
    fisher.retriever, fisher.chunk_size = retriever, None

    def plain(batch) -> None:
        retriever.zero_grad(set_to_none=True)
        batch_loss(retriever, batch, retriever.loss).backward()

    def empirical(batch) -> None:
        fisher.squared_example_grads(batch, torch.ones(len(batch["index"])))

    def leanagent(batch) -> None:
        {k: g.float() ** 2 for k, g in fisher.batch_grads(batch).items()}

    totals = {"plain": 0.0, "empirical": 0.0, "leanagent": 0.0}
    for b in range(args.batches):
        items = [pairs[i] for i in range(b * args.batch_size, (b + 1) * args.batch_size)]
        batch = data.collate_train(items)
        times = {name: cpu_seconds(lambda: fn(batch), args.rounds) for name, fn in
                 (("plain", plain), ("empirical", empirical), ("leanagent", leanagent))}
        for name, value in times.items():
            totals[name] += value
        print(f"batch {b}: " + "  ".join(f"{k} {v * 1000:.0f} ms" for k, v in times.items()), flush=True)
    print(f"\n{args.model}, {args.batches} batches of {args.batch_size} pairs, {args.threads} thread(s), best of {args.rounds}:")
    print(f"  empirical / plain = {totals['empirical'] / totals['plain']:.2f}x (target <= 1.5x)")
    print(f"  leanagent / plain = {totals['leanagent'] / totals['plain']:.2f}x (target <= 1.1x)")


if __name__ == "__main__":
    run(main)
