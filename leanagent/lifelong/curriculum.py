"""LeanAgent's curriculum: learn repositories with many easy theorems first (paper Section 3).

A theorem's complexity is e^S with S its number of tactic steps (``len(traced_tactics)``).
A theorem without a proof (no traced tactics, or a ``sorry``/``admit`` tactic) has
complexity +inf. The 33rd and 67th percentiles p33, p67 are taken over every theorem of
every repository (all of train/val/test of one split folder, each repository's records
counted once per repository), and each theorem is

    easy    if complexity <= p33
    medium  if p33 < complexity <= p67
    hard    if complexity > p67, or if it has no proof (whatever the thresholds are).

The boundaries are inclusive below, as in LeanAgent's code. A strict ``< p33`` would be
degenerate: most benchmark theorems have one tactic (on the lifelong Mathlib slices
as well), so p33 = p67 = e^1 and no theorem would be easy. A consequence worth knowing:
on such data medium is empty and "easy" means "one tactic step".

Percentiles use linear interpolation between order statistics (numpy's default method)
with +inf values kept in the sample: they count towards the rank, and a percentile that
falls on or interpolates towards +inf is +inf. Repositories are then ordered by their
number of easy theorems, most first; ties keep the order the repositories were given in.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leanagent.errors import LeanAgentError
from leanagent.lifelong.repositories import SPLIT_FILES, read_splits

_NO_PROOF_TACTIC = re.compile(r"\b(sorry|admit)\b")

__all__ = [
    "RepoDifficulty",
    "Curriculum",
    "has_proof",
    "theorem_complexity",
    "classify_complexity",
    "compute_curriculum",
    "format_curriculum",
]


@dataclass(frozen=True)
class RepoDifficulty:
    """Theorem counts of one repository; `unproved` is the part of `hard` that has no proof."""

    easy: int = 0
    medium: int = 0
    hard: int = 0
    unproved: int = 0

    @property
    def total(self) -> int:
        return self.easy + self.medium + self.hard


@dataclass(frozen=True)
class Curriculum:
    """Thresholds, per-repository counts and the training order they imply."""

    split: str
    p33: float
    p67: float
    counts: dict[str, RepoDifficulty]
    order: list[str]


def has_proof(theorem: dict[str, Any]) -> bool:
    """False for no traced tactics or a sorry/admit tactic: nothing to learn a proof from."""
    tactics = theorem["traced_tactics"]
    return bool(tactics) and not any(_NO_PROOF_TACTIC.search(str(t.get("tactic", ""))) for t in tactics)


def theorem_complexity(theorem: dict[str, Any]) -> float:
    """e^S for S tactic steps; +inf without a proof (and past float range, S >= 710)."""
    steps = len(theorem["traced_tactics"])
    return math.exp(steps) if has_proof(theorem) and steps < 710 else math.inf


def classify_complexity(complexity: float, p33: float, p67: float, proved: bool = True) -> str:
    """'easy' (<= p33), 'medium' (<= p67) or 'hard'; unproved theorems are always hard."""
    if not proved:
        return "hard"
    if complexity <= p33:
        return "easy"
    if complexity <= p67:
        return "medium"
    return "hard"


def _percentile(sorted_values: list[float], q: float) -> float:
    h = (len(sorted_values) - 1) * q / 100
    lo = math.floor(h)
    frac = h - lo
    a = sorted_values[lo]
    if frac == 0:
        return a
    b = sorted_values[lo + 1]
    if math.isinf(b):
        return math.inf
    return a + frac * (b - a)


def compute_curriculum(
    repos: dict[str, Path], split: str = "random", theorems: dict[str, dict[str, list[dict]]] | None = None
) -> Curriculum:
    """Thresholds over all repositories' theorems, per-repo easy/medium/hard, and the order. `theorems` is what
    `check_splits` already read; without it the split files are read here."""
    if not repos:
        raise LeanAgentError("curriculum needs at least one repository")
    loaded = theorems or {name: read_splits(name, Path(root), split) for name, root in repos.items()}
    per_repo = {
        name: [(theorem_complexity(t), has_proof(t)) for part in SPLIT_FILES for t in loaded[name][part]] for name in repos
    }
    everything = sorted(c for items in per_repo.values() for c, _ in items)
    if not everything:
        raise LeanAgentError(
            f"no theorems in split folder {split!r} of any repository: "
            + ", ".join(f"{n} ({Path(p) / split})" for n, p in repos.items())
        )
    p33, p67 = _percentile(everything, 33), _percentile(everything, 67)
    counts = {}
    for name, items in per_repo.items():
        tally = {"easy": 0, "medium": 0, "hard": 0}
        for complexity, proved in items:
            tally[classify_complexity(complexity, p33, p67, proved)] += 1
        counts[name] = RepoDifficulty(**tally, unproved=sum(not proved for _, proved in items))
    order = sorted(repos, key=lambda n: -counts[n].easy)
    return Curriculum(split=split, p33=p33, p67=p67, counts=counts, order=order)


def _threshold(p: float) -> str:
    return "inf" if math.isinf(p) else f"{p:.4g} (S = {math.log(p):.2f})"


def format_curriculum(c: Curriculum) -> str:
    """The curriculum as a plain-text table, in training order."""
    total = sum(rc.total for rc in c.counts.values())
    header = ("#", "repository", "easy", "medium", "hard", "no proof", "total")
    rows = [
        (str(i), name, *(str(v) for v in (rc.easy, rc.medium, rc.hard, rc.unproved, rc.total)))
        for i, name in enumerate(c.order, start=1)
        for rc in [c.counts[name]]
    ]
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            cell.ljust(w) if k == 1 else cell.rjust(w) for k, (cell, w) in enumerate(zip(cells, widths))
        ).rstrip()

    return "\n".join(
        [
            f"Curriculum of {len(c.order)} repositories, split {c.split!r}, {total} theorems",
            f"complexity e^S (S = tactic steps, no proof = inf): p33 = {_threshold(c.p33)}, "
            f"p67 = {_threshold(c.p67)}",
            "easy: <= p33, medium: <= p67, hard: > p67 or no proof (counted in hard)",
            "",
            line(header),
            *(line(r) for r in rows),
        ]
    )
