"""How a set of sequences is cut into encoder calls: by length, so that little of each call is padding.

Every call pads its rows to its longest row, and attention costs grow with the square of that width,
so rows of similar length belong together; but every call also has a fixed cost (on a CPU, a small
encoder's step is mostly per-call and per-op overhead). `length_chunks` balances the two exactly.
"""

from __future__ import annotations

import numpy as np


def length_chunks(sorted_lengths: np.ndarray, max_rows: int, call_cost: float) -> list[tuple[int, int]]:
    """Cut rows sorted by ascending length into contiguous (start, stop) chunks of at most `max_rows` rows
    that minimise padded cost + `call_cost` per chunk, by dynamic programming (O(rows x max_rows)).

    A chunk's padded cost is rows x width x (1 + width / 512): tokens, with attention's quadratic
    term weighted as it is for a model whose attention and projection costs per token meet at 512.
    `call_cost` is in the same units (padded tokens at width 0).
    """
    lengths = np.asarray(sorted_lengths, dtype=np.float64)
    count = len(lengths)
    best = np.full(count + 1, np.inf)
    best[0] = 0.0
    cut = np.zeros(count + 1, dtype=np.int64)
    for stop in range(1, count + 1):
        width = lengths[stop - 1]
        per_row = width * (1.0 + width / 512.0)
        starts = np.arange(max(0, stop - max_rows), stop)
        costs = best[starts] + (stop - starts) * per_row + call_cost
        pick = int(np.argmin(costs))
        best[stop], cut[stop] = costs[pick], starts[pick]
    chunks = []
    stop = count
    while stop > 0:
        chunks.append((int(cut[stop]), stop))
        stop = int(cut[stop])
    return chunks[::-1]
