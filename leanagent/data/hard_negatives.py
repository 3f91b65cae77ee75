"""Mined hard negatives: accessible premises that a ranker puts high for a state but that it does not use.

Random negatives are mostly easy: a premise about lists rarely looks like one a goal about orders
needs. The premises a ranker puts at the top are the near misses a retriever must learn to rank below
the right one. The ranker is BM25 (what hybrid ranking starts from) or the encoder a fit starts from
(`data.hard_negatives_by: encoder`, leanagent/models/encoder_negatives.py): its own near misses, which
it is the one to correct. Mined once per training split and node: the first process writes the pools
to the token cache (`shared_hard_negatives`, same folder, lock and atomic rename as
leanagent/data/token_store.py) and the node's other ranks read them, as every rank would otherwise mine
the same pools; then sampled per item and epoch.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from leanagent.corpus.corpus import Corpus
from leanagent.corpus.tactics import TacticStates
from leanagent.data.token_store import _locked, default_cache_dir
from leanagent.io import atomic_open
from leanagent.models.data_contract import Ranker
from leanagent.retrieval.bm25 import BM25Index, masked_topk

log = logging.getLogger("leanagent")


class BM25Ranker:
    name, min_score = "BM25", 0.0  # a premise sharing no term with the state is no harder than a random one

    def __init__(self, index: BM25Index) -> None:
        self.scores = index.scores


def mine_hard_negatives(
    index: BM25Index | Ranker, corpus: Corpus, states: TacticStates, pool: int, chunk: int = 256
) -> np.ndarray:
    """[num_states, pool] premise ids, best score first, -1 where a state has fewer candidates.

    A candidate is accessible to the state (as in evaluation), is none of its positives and scores above
    the ranker's `min_score`. `index` is a `Ranker`, or a BM25 index (ranked as `BM25Ranker`).
    """
    ranker = BM25Ranker(index) if isinstance(index, BM25Index) else index
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
        scores = ranker.scores([states.states[i] for i in ids]).float()
        file_ids = torch.tensor([states.file_ids[i] for i in ids], dtype=torch.long)
        pos_keys = torch.tensor([states.pos_keys[i] for i in ids], dtype=torch.long)
        allowed = corpus.accessible_mask(file_ids, pos_keys) & (scores > ranker.min_score)
        # Positives of every tactic sharing the state are excluded, not only the first one's.
        for j, i in enumerate(ids.tolist()):
            allowed[j, used[i]] = False
        top_ids, _ = masked_topk(scores, allowed, pool, in_place=True)
        out[ids, : top_ids.shape[1]] = top_ids.numpy()
    out = out[rows]
    log.info(
        "hard negatives: %s pools of %d mined for %d states (%d distinct); %.1f candidates per state on average",
        ranker.name, pool, len(states), len(unique), float((out >= 0).sum(axis=1).mean()),
    )
    return out


def pools_key(states: TacticStates, pool: int, corpus_key: str, ranker_key: str = "bm25") -> str:
    """Everything the pools are made from: the corpus, the states (text, file, position, positives), the
    pool size, the ranker (`ranker_key`: an encoder's weights) and the code that mines them (BM25's
    tokenizer and scoring, accessibility, the mining)."""
    from leanagent.corpus import corpus as corpus_module
    from leanagent.retrieval import bm25

    digest = hashlib.sha256(f"hard-negatives-v1|{pool}|{corpus_key}|{len(states)}|{ranker_key}|".encode())
    for module in (bm25.__file__, corpus_module.__file__, __file__):  # scoring, accessibility, mining
        digest.update(Path(module).read_bytes())
    for text, file_id, pos_key, positives in zip(states.states, states.file_ids, states.pos_keys, states.positives):
        raw = text.encode("utf-8")
        digest.update(len(raw).to_bytes(8, "little") + raw + f"|{file_id}|{pos_key}|{list(positives)}|".encode())
    return digest.hexdigest()


def shared_hard_negatives(
    index: Callable[[], BM25Index | Ranker], corpus: Corpus, states: TacticStates, pool: int, corpus_key: str,
    cache_dir: Path | None | str = "default", ranker_key: str = "bm25",
) -> np.ndarray:
    """`mine_hard_negatives`, done by one process per node: the others wait on its lock and load its file.

    `index` is called only when this process mines (a node's other ranks need no BM25 index for it).
    Without a usable cache folder (`LEANAGENT_TOKEN_CACHE=off`, a read-only disk) each process mines.
    `ranker_key` identifies a ranker other than BM25 (it is part of the cache key).
    """
    folder = default_cache_dir() if cache_dir == "default" else (Path(cache_dir) if cache_dir else None)
    if folder is None:
        return mine_hard_negatives(index(), corpus, states, pool)
    key = pools_key(states, pool, corpus_key, ranker_key)
    path = folder / f"{key}.hard-negatives.npy"
    pools = _load_pools(path, (len(states), pool))
    if pools is not None:
        return pools
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with _locked(folder / f"{key}.lock"):
            pools = _load_pools(path, (len(states), pool))  # mined by another rank while this one waited
            if pools is None:
                pools = mine_hard_negatives(index(), corpus, states, pool)
                _save_pools(path, pools)
        return pools
    except OSError as e:
        log.warning("token cache %s is not usable for hard negatives (%s): mining them here", folder, e.strerror or e)
        return mine_hard_negatives(index(), corpus, states, pool)


def _load_pools(path: Path, shape: tuple[int, int]) -> np.ndarray | None:
    if not path.is_file():
        return None
    try:
        pools = np.load(path, allow_pickle=False)
        if pools.shape != shape or pools.dtype != np.int64:
            raise ValueError(f"shape {pools.shape} {pools.dtype}, expected {shape} int64")
        return pools
    except (OSError, ValueError) as e:
        log.warning("hard-negative cache entry %s is damaged (%s): mining again", path, e)
        path.unlink(missing_ok=True)
        return None


def _save_pools(path: Path, pools: np.ndarray) -> None:
    """Written under a temporary name beside `path` and renamed, so no reader sees half a file."""
    with atomic_open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(pools), allow_pickle=False)
