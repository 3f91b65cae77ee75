"""How leanagent's log lines reach the terminal: one `[leanagent]` handler on stderr, and which rank says what.

Under DDP every rank runs the same command on the same files, so a warning about an input file came once
per rank. Records of `leanagent.corpus` (the corpus and split readers) are printed by rank 0 alone; lines
that differ per rank say "rank N" and stay.
"""

from __future__ import annotations

import logging
import os
import sys

READERS = "leanagent.corpus"


def process_rank() -> str:
    """This process's global rank as the launcher set it (torchrun: RANK; Lightning's own launcher: LOCAL_RANK)."""
    return os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))


class SameOnEveryRank(logging.Filter):
    """Drops, on ranks other than 0, what every rank reads alike (the READERS' records)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == READERS or record.name.startswith(READERS + ".")) or process_rank() == "0"


def setup_logging() -> None:
    """Idempotent: the CLI calls it once per command, and a lifelong run calls the CLI once per stage."""
    logger = logging.getLogger("leanagent")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[leanagent] %(message)s"))
        handler.addFilter(SameOnEveryRank())
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
