"""Negative premises for contrastive training, drawn without listing accessible premises.

A query's accessible premises are the id ranges of its imported files plus some premises
of its own file. Sampling k of them is drawing k distinct offsets into that union of
ranges, so each draw costs O(k log files) however large the accessible set is.
"""

from __future__ import annotations

import numpy as np

from leanagent.data.corpus import Corpus


class NegativeSampler:
    """ReProver's scheme: up to `num_in_file` negatives from the positive's file, the rest from elsewhere."""

    def __init__(self, corpus: Corpus, num_negatives: int, num_in_file: int) -> None:
        self.corpus = corpus
        self.num_negatives = num_negatives
        self.num_in_file = num_in_file
        self._imported_ranges: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def imported_ranges(self, file_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(importable file ids, their first premise ids, cumulative sizes) for a query file, cached."""
        if file_id not in self._imported_ranges:
            files = np.flatnonzero(self.corpus.closure[file_id])
            ranges = self.corpus.file_ranges[files]
            self._imported_ranges[file_id] = (files, ranges[:, 0], np.cumsum(ranges[:, 1] - ranges[:, 0]))
        return self._imported_ranges[file_id]

    def sample(self, file_id: int, pos_key: int, positive: int, rng: np.random.Generator) -> np.ndarray:
        """`num_negatives` premise ids, padded with -1 where the query has too few accessible premises."""
        corpus = self.corpus
        pos_file = int(corpus.premise_file[positive])
        own = corpus.accessible_in_file(file_id, pos_key)
        files, firsts, cumsizes = self.imported_ranges(file_id)

        if pos_file == file_id:
            in_file = own[own != positive]
        elif corpus.closure[file_id, pos_file]:
            lo, hi = corpus.file_ranges[pos_file]
            in_file = np.arange(lo, hi)
            in_file = in_file[in_file != positive]
        else:
            in_file = np.empty(0, dtype=np.int64)
        take_in = min(self.num_in_file, len(in_file))
        chosen_in = rng.choice(in_file, size=take_in, replace=False) if take_in else in_file[:0]

        # Out-of-file candidates: imported ranges without the positive's file, then the own-file ones.
        sizes = np.diff(cumsizes, prepend=0)
        skip = np.flatnonzero(files == pos_file)
        skip_at = int(cumsizes[skip[0]] - sizes[skip[0]]) if len(skip) else 0
        skip_size = int(sizes[skip[0]]) if len(skip) else 0
        imported_total = int(cumsizes[-1]) - skip_size if len(cumsizes) else 0
        own_out = own if pos_file != file_id else own[:0]
        total = imported_total + len(own_out)
        take_out = min(self.num_negatives - take_in, total)
        offsets = rng.choice(total, size=take_out, replace=False) if take_out else np.empty(0, dtype=np.int64)
        from_imported = offsets[offsets < imported_total]
        from_imported = from_imported + np.where(from_imported >= skip_at, skip_size, 0)
        block = np.searchsorted(cumsizes, from_imported, side="right")
        within = from_imported - (cumsizes[block] - sizes[block]) if len(block) else from_imported
        chosen_out = np.concatenate([firsts[block] + within, own_out[offsets[offsets >= imported_total] - imported_total]])

        out = np.full(self.num_negatives, -1, dtype=np.int64)
        chosen = np.concatenate([chosen_in, chosen_out]).astype(np.int64)
        out[: len(chosen)] = chosen
        return out
