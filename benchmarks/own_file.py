"""How many annotated premises lie in the theorem's own file: what the dense ranking's own-file bonus rests on.

    python -m benchmarks.own_file DATASET [DATASET ...] [--split-dir random]

For each dataset and split: the annotated premises found in the corpus, the share of them in the theorem's
own file (above the theorem, so accessible), the states with at least one there, and the median number of
premises accessible in the own file against the median accessible in all (leanagent/models/locality.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.arguments import benchmark_parser, run
from leanagent.corpus.corpus import Corpus
from leanagent.corpus.tactics import load_tactic_states


def main() -> None:
    p = benchmark_parser(__doc__)
    p.add_argument("datasets", nargs="+", type=Path, help="dataset folders (corpus.jsonl and SPLIT_DIR/)")
    p.add_argument("--split-dir", default="random")
    args = p.parse_args()
    print(f"{'dataset':28} {'split':5} {'positives':>9} {'own file':>8} {'states':>13} {'own-file acc.':>13} {'all acc.':>9}")
    for root in args.datasets:
        corpus = Corpus.from_jsonl(root / "corpus.jsonl")
        sizes = np.diff(corpus.file_ranges, axis=1)[:, 0]
        for split in ("train", "val", "test"):
            states = load_tactic_states(root / args.split_dir / f"{split}.json", corpus)
            found = own = with_own = with_positive = 0
            own_sizes, all_sizes = [], []
            for file_id, pos_key, positives in zip(states.file_ids, states.pos_keys, states.positives):
                if not positives:
                    continue
                home = corpus.premise_file[positives]
                here = corpus.accessible_pairs(file_id, pos_key, np.asarray(positives)) & (home == file_id)
                found += len(positives)
                own += int(here.sum())
                with_own += int(here.any())
                with_positive += 1
                in_file = len(corpus.accessible_in_file(file_id, pos_key))
                own_sizes.append(in_file)
                all_sizes.append(in_file + int(sizes[corpus.closure[file_id]].sum()))
            share = own / found if found else 0.0
            print(f"{root.name:28} {split:5} {found:9d} {share:8.1%} {with_own:6d}/{with_positive:<6d} "
                  f"{np.median(own_sizes or [0]):13.0f} {np.median(all_sizes or [0]):9.0f}")


if __name__ == "__main__":
    run(main)
