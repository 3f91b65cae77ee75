"""Throughput of the data side on a large corpus: loading, negative sampling, accessibility masks.

    python -m benchmarks.data_pipeline [DATASET]    # default ../shared/data/mathlib-order

Prints figures; it asserts nothing (timed tests would be flaky). Compare against ReProver, whose
sampler loops in Python over every accessible premise of each example (about 9,000 on mathlib-order).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.arguments import add_optional_positional, benchmark_parser, run, value_or
from leanagent.corpus.corpus import Corpus
from leanagent.data.negatives import NegativeSampler
from leanagent.corpus.tactics import load_tactic_states


def timed(label: str, fn, repeat: int = 1):
    start = time.perf_counter()
    for _ in range(repeat):
        result = fn()
    elapsed = (time.perf_counter() - start) / repeat
    print(f"{label:<48} {elapsed * 1000:10.1f} ms")
    return result, elapsed


def main(dataset: Path) -> None:
    torch.set_num_threads(1)
    corpus, _ = timed("load corpus.jsonl (+ import closure)", lambda: Corpus.from_jsonl(dataset / "corpus.jsonl"))
    print(f"  {len(corpus):,} premises in {corpus.num_files:,} files")
    states, _ = timed("load random/train.json", lambda: load_tactic_states(dataset / "random" / "train.json", corpus))
    pairs = [(i, p) for i, ps in enumerate(states.positives) for p in ps]
    sampler = NegativeSampler(corpus, num_negatives=3, num_in_file=1)
    rng = np.random.default_rng(0)
    sample = lambda: [sampler.sample(states.file_ids[i], states.pos_keys[i], p, rng) for i, p in pairs[:2000]]
    sample()  # fills the per-file range cache, as the first epoch does
    _, elapsed = timed("sample negatives for 2,000 pairs", sample)
    print(f"  {2000 / elapsed:,.0f} pairs/s")
    accessible = [len(corpus.accessible_ids(states.file_ids[i], states.pos_keys[i])) for i, _ in pairs[:200]]
    print(f"  mean accessible premises per pair: {np.mean(accessible):,.0f}")
    files = torch.tensor(states.file_ids[:64])
    keys = torch.tensor(states.pos_keys[:64])
    mask, elapsed = timed("accessibility mask, 64 queries x all premises", lambda: corpus.accessible_mask(files, keys), repeat=5)
    scores = torch.randn(64, len(corpus))
    timed("masked top-100 for 64 queries", lambda: scores.masked_fill(~mask, float("-inf")).topk(100, dim=1), repeat=5)


DEFAULT_DATASET = Path(__file__).resolve().parents[2] / "shared" / "data" / "mathlib-order"


if __name__ == "__main__":
    parser = benchmark_parser(__doc__)
    add_optional_positional(parser, "dataset", "?", type=Path, help=f"a dataset folder (default: {DEFAULT_DATASET})")
    run(main, value_or(parser.parse_args(), "dataset", DEFAULT_DATASET))
