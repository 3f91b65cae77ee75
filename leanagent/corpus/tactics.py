"""Tactic states and their positive premises, read from a split file (`train.json`, `val.json`, ...)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np

from leanagent.corpus.corpus import Corpus, _field, position_key
from leanagent.errors import LeanAgentError
from leanagent.io import read_json

log = logging.getLogger("leanagent.corpus")  # rank 0 alone prints it (leanagent/console.py)


@dataclass
class TacticStates:
    """One row per traced tactic: the state it starts from and every premise its annotation names.

    Annotations the corpus cannot resolve are counted, not kept: `unresolved` (outside the corpus) and
    `skipped` (a premise the corpus reader skipped, as ReProver's does). `unreachable` counts kept positives
    that are not accessible from their state (its file neither imports them nor lists them above it): they stay,
    counted as misses as in ReProver, and `reachable_states` counts the states with a positive that is.
    A theorem given twice in one split (same file, name and start) is read once; `repeated` counts the rest and
    `first_repeated` names the first, so a concatenated split neither trains nor scores it twice.
    """

    states: list[str] = field(default_factory=list)
    file_ids: list[int] = field(default_factory=list)
    pos_keys: list[int] = field(default_factory=list)
    positives: list[list[int]] = field(default_factory=list)
    theorem_names: list[str] = field(default_factory=list)
    tactic_indices: list[int] = field(default_factory=list)
    unresolved: int = 0
    skipped: int = 0
    unreachable: int = 0
    reachable_states: int = 0
    repeated: int = 0
    first_repeated: str = ""
    theorem_keys: set[tuple[str, str, int]] = field(default_factory=set, repr=False)  # (file, name, start)
    _positives_array: np.ndarray | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.states)

    def extend(self, other: TacticStates) -> None:
        for name in ("states", "file_ids", "pos_keys", "positives", "theorem_names", "tactic_indices"):
            getattr(self, name).extend(getattr(other, name))
        for name in ("unresolved", "skipped", "unreachable", "reachable_states", "repeated"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.first_repeated = self.first_repeated or other.first_repeated
        self.theorem_keys |= other.theorem_keys

    def positives_array(self) -> np.ndarray:
        """Positives padded with -1 to a [N, max] array, so batches can test membership without sets."""
        if self._positives_array is None or len(self._positives_array) != len(self):
            width = max([len(p) for p in self.positives] + [1])
            out = np.full((len(self), width), -1, dtype=np.int64)
            for i, ids in enumerate(self.positives):
                out[i, : len(ids)] = ids
            self._positives_array = out
        return self._positives_array


def read_theorems(split_file: str | os.PathLike) -> list:
    """A split file (train.json, ...): LeanDojo's JSON list of theorems, whose fields each reader checks."""
    theorems = read_json(split_file)
    if not isinstance(theorems, list):
        raise LeanAgentError(f"{split_file}: expected a JSON list of theorems")
    return theorems


def load_tactic_states(split_file: str | os.PathLike, corpus: Corpus) -> TacticStates:
    """Read every traced tactic of a split; annotations pointing outside the corpus are counted, not fatal."""
    return tactic_states(read_theorems(split_file), corpus, split_file)


def tactic_states(theorems: list, corpus: Corpus, split_file: str | os.PathLike) -> TacticStates:
    """`load_tactic_states` of theorems already read from `split_file` (which errors name)."""
    out = TacticStates()
    seen = out.theorem_keys
    for t, theorem in enumerate(theorems):
        where = f"{split_file}: theorem [{t}]"
        file_path = _field(theorem, "file_path", str, where)
        name = _field(theorem, "full_name", str, where)
        where = f"{split_file}: theorem [{t}] '{name}'"
        file_id = corpus.file_index.get(file_path)
        if file_id is None:
            raise LeanAgentError(f"{where}: its file '{file_path}' is not in the corpus {corpus.source}")
        pos = position_key(_field(theorem, "start", list, where), f"{where}.start")
        if (file_path, name, pos) in seen:
            out.repeated += 1
            out.first_repeated = out.first_repeated or f"theorem [{t}] '{name}' of {file_path}"
            continue
        seen.add((file_path, name, pos))
        for k, tactic in enumerate(_field(theorem, "traced_tactics", list, where)):
            twhere = f"{where}.traced_tactics[{k}]"
            state = _field(tactic, "state_before", str, twhere)
            annotated = _field(tactic, "annotated_tactic", list, twhere)
            if len(annotated) != 2 or not isinstance(annotated[1], list):
                raise LeanAgentError(f"{twhere}: 'annotated_tactic' must be [text, [premises]]")
            positives: list[int] = []
            for j, provenance in enumerate(annotated[1]):
                pwhere = f"{twhere}.annotated_tactic[1][{j}]"
                premise_id = corpus.locate(
                    _field(provenance, "def_path", str, pwhere),
                    _field(provenance, "full_name", str, pwhere),
                    provenance.get("def_pos"),
                )
                if premise_id is None:
                    if (provenance["def_path"], provenance["full_name"]) in corpus.skipped_names:
                        out.skipped += 1
                    else:
                        out.unresolved += 1
                elif premise_id not in positives:
                    positives.append(premise_id)
            out.states.append(state)
            out.file_ids.append(file_id)
            out.pos_keys.append(pos)
            out.positives.append(positives)
            out.theorem_names.append(name)
            out.tactic_indices.append(k)
    _count_reachable(out, corpus)
    return out


def _count_reachable(states: TacticStates, corpus: Corpus) -> None:
    rows = np.repeat(np.arange(len(states)), [len(p) for p in states.positives])
    if not len(rows):
        return
    premise_ids = np.fromiter((p for ps in states.positives for p in ps), dtype=np.int64, count=len(rows))
    file_ids = np.asarray(states.file_ids, dtype=np.int64)[rows]
    pos_keys = np.asarray(states.pos_keys, dtype=np.int64)[rows]
    reachable = corpus.accessible_pairs(file_ids, pos_keys, premise_ids)
    states.unreachable = int((~reachable).sum())
    states.reachable_states = len(np.unique(rows[reachable]))


def warn_shared_theorems(split: str, loaded: dict[str, TacticStates], folder: str | os.PathLike) -> None:
    """A theorem of val or test that train also holds (a hand-made or concatenated split): its figures then
    score what the model trained on. One warning, once both splits are read; LeanDojo's splits never share one."""
    pairs = [(split, "train")] if split in ("val", "test") else [("val", "train"), ("test", "train")] if split == "train" else []
    for evaluated, trained in pairs:
        if evaluated in loaded and trained in loaded and (shared := loaded[evaluated].theorem_keys & loaded[trained].theorem_keys):
            file_path, name, _ = min(shared)
            log.warning("%s: %d theorem(s) of %s.json are also in train.json (first: '%s' of %s): its figures score "
                        "theorems the model trained on", folder, len(shared), evaluated, name, file_path)


def warn_unresolved(states: TacticStates, what: str) -> None:
    """One summary line per kind instead of one warning per annotation, as real LeanDojo data has many."""
    if states.repeated:
        log.warning("%s: read %d theorem(s) once that the file gives again with the same file, name and start "
                    "(first: %s)", what, states.repeated, states.first_repeated)
    if states.unresolved:
        log.warning(
            "%s: skipped %d premise annotation(s) that point outside the corpus", what, states.unresolved
        )
    if states.skipped:
        log.warning(
            "%s: skipped %d premise annotation(s) that name premises the corpus reader skipped (empty code, ...)",
            what, states.skipped,
        )
    if states.unreachable:
        log.warning(
            "%s: %d annotated premise(s) are not accessible from their theorem (its file neither imports them nor "
            "lists them above it): retrieval cannot find them, so they count as misses, as in ReProver",
            what, states.unreachable,
        )


def require_training_examples(states: TacticStates, split_file: str | os.PathLike, corpus_source: str | os.PathLike) -> None:
    """A train split none of whose tactics names a premise of the corpus has nothing to learn from."""
    if not any(states.positives):
        raise LeanAgentError(
            f"{split_file}: no training examples (no traced tactic has a premise annotation found in the corpus "
            f"{corpus_source})"
        )


def require_positives(states: TacticStates, split_file: str | os.PathLike, corpus_source: str | os.PathLike) -> None:
    """An evaluated split none of whose states names a premise of the corpus, or one accessible from the state,
    scores 0 for any model: checkpoint selection, early stopping and hybrid's weight would run on zeros, so it is
    refused instead."""
    if len(states) and not any(states.positives):
        outside = f"; {states.unresolved} annotation(s) point outside it" if states.unresolved else ""
        raise LeanAgentError(
            f"{split_file}: none of its {len(states)} tactic states has a premise annotation found in the corpus "
            f"{corpus_source}{outside}, so every Recall@k would be 0: is the corpus the one traced with this split?"
        )
    if len(states) and not states.reachable_states:
        raise LeanAgentError(
            f"{split_file}: none of the premises its {len(states)} tactic states name is accessible from the theorem "
            f"in the corpus {corpus_source} (the theorem's file neither imports them nor lists them above it), so every "
            f"Recall@k would be 0: are the corpus's 'imports' complete?"
        )
