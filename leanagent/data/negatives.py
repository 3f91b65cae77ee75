"""Negative premises for contrastive training, drawn without listing accessible premises.

A query's accessible premises are the id ranges of its imported files plus some premises
of its own file. Sampling k of them is drawing k distinct offsets into that union of
ranges, so each draw costs O(k log files) however large the accessible set is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from leanagent.corpus.corpus import Corpus


class NegativeSampler:
    """ReProver's scheme: up to `num_in_file` negatives from the positive's file, the rest from elsewhere.

    With `num_hard` > 0, that many come first from the query's pool of BM25-mined hard negatives
    (leanagent/data/hard_negatives.py); in-file and random ones fill the rest, none repeating them.
    No negative is any positive premise of the query's state: a state with several positives trains on
    one pair per positive, and the others would otherwise be drawn as that pair's negatives.
    """

    def __init__(self, corpus: Corpus, num_negatives: int, num_in_file: int, num_hard: int = 0) -> None:
        self.corpus = corpus
        self.num_negatives = num_negatives
        self.num_in_file = num_in_file
        self.num_hard = num_hard
        self._imported_ranges: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def imported_ranges(self, file_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(importable file ids, their first premise ids, cumulative sizes) for a query file, cached."""
        if file_id not in self._imported_ranges:
            files = np.flatnonzero(self.corpus.closure[file_id])
            ranges = self.corpus.file_ranges[files]
            self._imported_ranges[file_id] = (files, ranges[:, 0], np.cumsum(ranges[:, 1] - ranges[:, 0]))
        return self._imported_ranges[file_id]

    def sample(
        self, file_id: int, pos_key: int, positive: int, rng: np.random.Generator, hard_pool: np.ndarray | None = None,
        positives: Sequence[int] | np.ndarray = (),
    ) -> np.ndarray:
        """`num_negatives` premise ids, padded with -1 where the query has too few accessible premises.

        `positives` lists every positive premise of the state (`positive` among them or not); none is drawn.
        """
        corpus = self.corpus
        excluded = np.union1d(np.asarray(positives, dtype=np.int64), [positive])
        others = excluded[excluded != positive]  # the state's other positives
        hard = np.empty(0, dtype=np.int64)
        if self.num_hard and hard_pool is not None:
            candidates = hard_pool[(hard_pool >= 0) & ~np.isin(hard_pool, excluded)]
            take = min(self.num_hard, len(candidates))
            hard = rng.choice(candidates, size=take, replace=False) if take else hard
        pos_file = int(corpus.premise_file[positive])
        own = corpus.accessible_in_file(file_id, pos_key)
        files, firsts, cumsizes = self.imported_ranges(file_id)

        if pos_file == file_id:
            in_file = own
        elif corpus.closure[file_id, pos_file]:
            lo, hi = corpus.file_ranges[pos_file]
            in_file = np.arange(lo, hi)
        else:
            in_file = np.empty(0, dtype=np.int64)
        in_file = in_file[~np.isin(in_file, np.concatenate([excluded, hard]))]
        take_in = min(self.num_in_file, len(in_file), self.num_negatives - len(hard))
        chosen_in = rng.choice(in_file, size=take_in, replace=False) if take_in else in_file[:0]

        # Out-of-file candidates: imported ranges without the positive's file, then the own-file ones.
        sizes = np.diff(cumsizes, prepend=0)
        skip = np.flatnonzero(files == pos_file)
        skip_at = int(cumsizes[skip[0]] - sizes[skip[0]]) if len(skip) else 0
        skip_size = int(sizes[skip[0]]) if len(skip) else 0
        imported_total = int(cumsizes[-1]) - skip_size if len(cumsizes) else 0
        own_out = own if pos_file != file_id else own[:0]
        total = imported_total + len(own_out)
        need = self.num_negatives - len(hard) - take_in
        # Drawn with room for the hard ones and other positives they may repeat, which are then dropped.
        rejected = np.concatenate([hard, others])
        take_out = min(need + len(rejected), total)
        offsets = rng.choice(total, size=take_out, replace=False) if take_out else np.empty(0, dtype=np.int64)
        imported = offsets < imported_total
        from_imported = offsets[imported]
        from_imported = from_imported + np.where(from_imported >= skip_at, skip_size, 0)
        block = np.searchsorted(cumsizes, from_imported, side="right")
        within = from_imported - (cumsizes[block] - sizes[block]) if len(block) else from_imported
        chosen_out = np.empty(len(offsets), dtype=np.int64)
        chosen_out[imported] = firsts[block] + within
        chosen_out[~imported] = own_out[offsets[~imported] - imported_total]
        if len(rejected):
            chosen_out = chosen_out[~np.isin(chosen_out, rejected)][:need]

        out = np.full(self.num_negatives, -1, dtype=np.int64)
        chosen = np.concatenate([hard, chosen_in, chosen_out]).astype(np.int64)
        out[: len(chosen)] = chosen
        return out
