"""Under DDP every rank reads the same files: what the readers warn about is printed once, by rank 0."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from leanagent.console import SameOnEveryRank
from leanagent.corpus.tactics import warn_shared_theorems


@pytest.mark.parametrize("env, printed", [({}, True), ({"LOCAL_RANK": "0"}, True), ({"LOCAL_RANK": "1"}, False),
                                          ({"RANK": "2", "LOCAL_RANK": "0"}, False), ({"RANK": "0", "LOCAL_RANK": "1"}, True)])
def test_a_readers_warning_is_printed_by_global_rank_0_alone_and_rank_lines_by_every_rank(env, printed, tmp_path, monkeypatch):
    for name in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    shown: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: shown.append(record.getMessage())  # type: ignore[method-assign]
    handler.addFilter(SameOnEveryRank())
    logger = logging.getLogger("leanagent")
    logger.addHandler(handler)
    try:
        split = SimpleNamespace(theorem_keys={("A.lean", "t", (1, 1))})
        warn_shared_theorems("val", {"val": split, "train": split}, tmp_path)  # a theorem in both: a warning
        logging.getLogger("leanagent").warning("rank N: a line of this rank's own")
    finally:
        logger.removeHandler(handler)
    assert any("also in train.json" in line for line in shown) == printed, shown
    assert "rank N: a line of this rank's own" in shown
