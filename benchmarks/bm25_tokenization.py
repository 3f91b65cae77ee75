"""BM25 quality of tokenizer variants on real datasets' validation splits (and test, against the shared baselines).

    python -m benchmarks.bm25_tokenization [--split val] [DATASET ...]
    # default: data/batteries, ../shared/data/mathlib-order, ../shared/data/lifelong/mathlib-logic

Prints R@1 / R@10 / MRR per dataset and variant, the index build time and ms per query (scoring,
masking and top-100 of batches of 64). Each variant adds one change to the previous line's, except
where its name says otherwise. The metrics are leanagent.retrieval.metrics's, over accessible premises only.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from benchmarks.arguments import add_optional_positional, benchmark_parser, run, value_or
from leanagent.corpus.corpus import Corpus
from leanagent.corpus.tactics import load_tactic_states
from leanagent.retrieval.metrics import retrieval_metrics
from leanagent.retrieval.bm25 import BM25Index, LeanTokenizer, masked_topk

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
DEFAULT_DATASETS = [REPO / "data" / "batteries", SHARED / "mathlib-order", SHARED / "lifelong" / "mathlib-logic"]

_BASE = LeanTokenizer(split=False, camel=False, keep_whole=False, symbols=False, lowercase=False, whitespace=True, text="code")
VARIANTS: list[tuple[str, LeanTokenizer]] = [
    ("whitespace, code (baseline)", _BASE),
    ("+ lowercase", replace(_BASE, lowercase=True)),
    ("words + symbols as tokens", replace(_BASE, whitespace=False, symbols=True)),
    ("words, symbols dropped", replace(_BASE, whitespace=False)),
    ("words + symbols, lowercase", replace(_BASE, whitespace=False, symbols=True, lowercase=True)),
    ("+ split at . _ '", replace(_BASE, whitespace=False, symbols=True, lowercase=True, split=True)),
    ("+ camelCase split", replace(_BASE, whitespace=False, symbols=True, lowercase=True, split=True, camel=True)),
    ("+ keep whole words", replace(_BASE, whitespace=False, symbols=True, lowercase=True, split=True, camel=True, keep_whole=True)),
    ("  same, text = name only", LeanTokenizer(text="name")),
    ("  same, text = name + code (default)", LeanTokenizer(text="both")),
    ("  default without camelCase split", LeanTokenizer(camel=False)),
    ("  default without symbols", LeanTokenizer(symbols=False)),
]


def evaluate(index: BM25Index, corpus: Corpus, states, k: int = 100, batch: int = 64) -> tuple[np.ndarray, float]:
    """Mean [R@1, R@10, MRR] over states with a positive, and seconds spent per query."""
    rows, elapsed = [], 0.0
    positives = states.positives_array()
    for lo in range(0, len(states), batch):
        sl = slice(lo, min(lo + batch, len(states)))
        start = time.perf_counter()
        scores = index.scores(states.states[sl])
        accessible = corpus.accessible_mask(torch.tensor(states.file_ids[sl]), torch.tensor(states.pos_keys[sl]))
        ids, _ = masked_topk(scores, accessible, k)
        elapsed += time.perf_counter() - start
        rows.append(retrieval_metrics(ids, torch.from_numpy(positives[sl])))
    values = torch.cat(rows)
    has = values[:, -1] > 0
    return values[has, :-1].mean(dim=0).numpy(), elapsed / max(1, len(states))


def main() -> None:
    parser = benchmark_parser(__doc__)
    add_optional_positional(parser, "datasets", "*", type=Path,
                            help="dataset folders (default: " + " ".join(str(d) for d in DEFAULT_DATASETS) + ")")
    parser.add_argument("--split", default="val")
    parser.add_argument("--split-dir", default="random")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for dataset in value_or(args, "datasets", DEFAULT_DATASETS):
        corpus = Corpus.from_jsonl(dataset / "corpus.jsonl")
        states = load_tactic_states(dataset / args.split_dir / f"{args.split}.json", corpus)
        print(f"\n{dataset.name} {args.split_dir}/{args.split}: {len(corpus):,} premises, {len(states):,} tactic states")
        print(f"{'variant':<40} {'R@1':>6} {'R@10':>6} {'MRR':>6} {'build s':>8} {'ms/query':>9}")
        for name, tokenizer in VARIANTS:
            start = time.perf_counter()
            index = BM25Index(corpus, tokenizer)
            build = time.perf_counter() - start
            (r1, r10, mrr), per_query = evaluate(index, corpus, states)
            print(f"{name:<40} {r1:6.1f} {r10:6.1f} {mrr:6.3f} {build:8.2f} {per_query * 1000:9.2f}")


if __name__ == "__main__":
    run(main)
