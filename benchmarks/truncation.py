"""How much text `max_seq_len` cuts off: the share of premises and tactic states longer than it, per dataset.

ByT5 reads bytes, so a Lean premise with unicode notation is longer in tokens than in characters.
Prints one row per dataset and length, for premises in the form the encoder reads
(`--premise-text`) and for the tactic states of the training split. Run from the repository root:

    python -m benchmarks.truncation data/batteries ../shared/data/mathlib-order --max-seq-len 512 1024
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from jsonargparse.typing import PositiveInt

from leanagent.corpus.corpus import Corpus
from leanagent.corpus.tactics import load_tactic_states
from benchmarks.arguments import benchmark_parser, run
from leanagent.models.tokenizer import ByteTokenizer


def token_lengths(texts: list[str]) -> np.ndarray:
    """ByT5 token counts (UTF-8 bytes plus EOS), without the cap that encoding applies."""
    return np.fromiter((len(t.encode("utf-8")) + 1 for t in texts), dtype=np.int64, count=len(texts))


def main() -> None:
    p = benchmark_parser(__doc__)
    p.add_argument("datasets", nargs="+", type=Path, help="dataset folders (corpus.jsonl and random/)")
    p.add_argument("--max-seq-len", type=PositiveInt, nargs="+", default=[512])
    p.add_argument("--premise-text", choices=("serialized", "code"), default="serialized")
    p.add_argument("--split", default="random/train.json")
    args = p.parse_args()
    assert ByteTokenizer.offset == 3  # lengths below assume one token per byte
    print(f"{'dataset':24} {'max_len':>7} {'premises':>9} {'cut':>7} {'p50':>6} {'p99':>6} {'states':>8} {'cut':>7} {'p50':>6} {'p99':>6}")
    for root in args.datasets:
        corpus = Corpus.from_jsonl(root / "corpus.jsonl")
        premises = token_lengths(corpus.premise_texts(args.premise_text))
        states = token_lengths(load_tactic_states(root / args.split, corpus).states)
        for limit in args.max_seq_len:
            print(
                f"{root.name:24} {limit:7d} {len(premises):9d} {np.mean(premises > limit):7.1%} "
                f"{np.median(premises):6.0f} {np.percentile(premises, 99):6.0f} {len(states):8d} "
                f"{np.mean(states > limit):7.1%} {np.median(states):6.0f} {np.percentile(states, 99):6.0f}"
            )


if __name__ == "__main__":
    run(main)
