"""BM25-mined hard negatives: accessible premises that BM25 ranks high for a state but that it does not use.

Random negatives are mostly easy: a premise about lists rarely looks like one a goal about orders
needs. The premises BM25 puts at the top are the near misses a retriever must learn to rank below
the right one, and the ones hybrid ranking starts from. Mined once per training split (every rank
mines the same pools, the computation is deterministic), then sampled per item and epoch.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from leanagent.data.corpus import Corpus
from leanagent.data.tactics import TacticStates
from leanagent.retrieval.bm25 import BM25Index, masked_topk

log = logging.getLogger("leanagent")


def mine_hard_negatives(
    index: BM25Index, corpus: Corpus, states: TacticStates, pool: int, chunk: int = 256
) -> np.ndarray:
    """[num_states, pool] premise ids, best BM25 score first, -1 where a state has fewer candidates.

    A candidate is accessible to the state (as in evaluation), is none of its positives and has a
    positive BM25 score: a premise sharing no term with the state is no harder than a random one.
    """
    out = np.full((len(states), pool), -1, dtype=np.int64)
    if pool == 0 or len(states) == 0:
        return out
    # States repeat (every tactic of a theorem shares one): each distinct (text, file, position) is scored once.
    keys = list(zip(states.states, states.file_ids, states.pos_keys))
    first: dict[tuple, int] = {}
    rows = np.asarray([first.setdefault(key, i) for i, key in enumerate(keys)])
    unique = np.unique(rows)
    used: dict[int, list[int]] = {}
    for row, ids in zip(rows.tolist(), states.positives):
        used.setdefault(row, []).extend(ids)
    for start in range(0, len(unique), chunk):
        ids = unique[start : start + chunk]
        scores = index.scores([states.states[i] for i in ids])
        file_ids = torch.tensor([states.file_ids[i] for i in ids], dtype=torch.long)
        pos_keys = torch.tensor([states.pos_keys[i] for i in ids], dtype=torch.long)
        allowed = corpus.accessible_mask(file_ids, pos_keys) & (scores > 0)
        # Positives of every tactic sharing the state are excluded, not only the first one's.
        for j, i in enumerate(ids.tolist()):
            allowed[j, used[i]] = False
        top_ids, _ = masked_topk(scores, allowed, pool, in_place=True)
        out[ids, : top_ids.shape[1]] = top_ids.numpy()
    out = out[rows]
    log.info(
        "hard negatives: BM25 pools of %d mined for %d states (%d distinct); %.1f candidates per state on average",
        pool, len(states), len(unique), float((out >= 0).sum(axis=1).mean()),
    )
    return out
