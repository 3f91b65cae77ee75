"""The premise corpus: Lean files as an import DAG, premises as flat arrays.

Premises get global ids in corpus order, so every file owns one contiguous id range.
Accessibility (ReProver's rule: defined earlier in the same file, or anywhere in a
transitively imported file) then reduces to a file-level closure matrix plus a
position test inside the query's own file, which vectorises over all premises.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
from collections import Counter

import numpy as np
import torch

from leanagent.corpus.import_order import ImportCycle, imports_first
from leanagent.errors import LeanAgentError
from leanagent.io import iter_jsonl

log = logging.getLogger("leanagent.corpus")  # rank 0 alone prints it (leanagent/console.py)

_LINE = 1 << 24
_MAX_LINE = 1 << 38
MARK_START, MARK_END = "<a>", "</a>"


def skip_reason(full_name: object, code: object) -> str | None:
    """Why ReProver's loader drops a premise (null name, AST debris, mutual block, empty code), or None."""
    if full_name is None:
        return "null full_name"
    if isinstance(full_name, str) and "user__.n" in full_name:
        return "'user__.n' name"
    if code == "":
        return "empty code"
    if isinstance(full_name, str) and full_name.startswith("[") and full_name.endswith("]"):
        return "mutual definition"
    return None


def serialize_premise(full_name: str, code: str) -> str:
    """ReProver's `Premise.serialize()`: the code with the premise's own name marked as <a>name</a>.

    Published ReProver/LeanAgent retrievers were trained on this form. The name is marked where it
    appears as `_root_.name`, else at the first suffix of its dotted form (longest first) that follows
    whitespace, optionally in «guillemets».
    """
    marked = f"{MARK_START}{full_name}{MARK_END}"
    code = code.replace(f"_root_.{full_name}", marked)
    fields = full_name.split(".")
    for i in range(len(fields)):
        suffix = re.escape(".".join(fields[i:]))
        replaced = re.sub(rf"(?<=\s)«?{suffix}»?", lambda _: marked, code)
        if replaced != code:
            return replaced
    return code


def position_key(pos: object, where: str) -> int:
    """Encode a Lean (line, column) as one comparable integer."""
    if (
        not isinstance(pos, (list, tuple))
        or len(pos) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in pos)
    ):
        raise LeanAgentError(f"{where}: expected a position [line, column], got {pos!r}")
    line, col = pos
    if col >= _LINE:
        raise LeanAgentError(f"{where}: column {col} is out of range")
    if line >= _MAX_LINE:  # the key is an int64 in the accessibility masks
        raise LeanAgentError(f"{where}: line {line} is out of range")
    return line * _LINE + col


def _field(record: object, name: str, kind: type | tuple[type, ...], where: str):
    if not isinstance(record, dict):
        raise LeanAgentError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if name not in record:
        raise LeanAgentError(f"{where}: missing field '{name}'")
    value = record[name]
    if not isinstance(value, kind):
        raise LeanAgentError(f"{where}: field '{name}' has the wrong type ({type(value).__name__})")
    return value


def skipped_premise(premise: object) -> str | None:
    """Why a corpus entry is skipped as ReProver's loader skips it, or None; a missing `full_name` is no reason
    (`premise_fields` refuses it), a null one is."""
    named = isinstance(premise, dict) and "full_name" in premise
    return skip_reason(premise["full_name"], premise.get("code")) if named else None


def premise_fields(premise: object, where: str) -> tuple[str, str, int, int]:
    """(full_name, code, start key, end key) of a corpus premise that is not skipped, or one error naming the field:
    the corpus reader's rule, which `merge` applies to its sources too."""
    name, code = _field(premise, "full_name", str, where), _field(premise, "code", str, where)
    start = position_key(_field(premise, "start", list, where), f"{where}.start")
    end = position_key(_field(premise, "end", list, where), f"{where}.end")
    if end < start:  # which premises a theorem can use is decided by these positions
        raise LeanAgentError(f"{where}.end: {premise['end']} is before its start {premise['start']}")
    return name, code, start, end


class Corpus:
    """All premises of a LeanDojo `corpus.jsonl`, with the import closure of every file."""

    def __init__(
        self,
        paths: list[str],
        imports: list[list[int]],
        names: list[str],
        codes: list[str],
        premise_file: np.ndarray,
        start_keys: np.ndarray,
        end_keys: np.ndarray,
        source: str = "<memory>",
    ) -> None:
        self.source = source
        self.paths = paths
        self.file_index = {p: i for i, p in enumerate(paths)}
        self.imports = imports
        self.names = names
        self.codes = codes
        self.premise_file = premise_file.astype(np.int64)
        self.start_keys = start_keys.astype(np.int64)
        self.end_keys = end_keys.astype(np.int64)
        counts = np.bincount(self.premise_file, minlength=len(paths))
        self.file_ranges = np.stack([np.cumsum(counts) - counts, np.cumsum(counts)], axis=1)
        if not np.all(np.diff(self.premise_file) >= 0):
            raise ValueError("premises must be grouped by file in corpus order")
        self._by_name = {(paths[f], n): i for i, (f, n) in enumerate(zip(self.premise_file.tolist(), names))}
        # (file, name) pairs listed more than once: locate() tells them apart by position where it can
        self._ambiguous: set[tuple[str, str]] = set()
        if len(self._by_name) < len(names):
            listed = Counter((paths[f], n) for f, n in zip(self.premise_file.tolist(), names))
            self._ambiguous = {key for key, count in listed.items() if count > 1}
        self.closure = self._import_closure()
        # (path, full_name) of premises the reader skipped (empty code, ...): an annotation naming one is no error
        self.skipped_names: set[tuple[str, str]] = set()
        self._torch_cache: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike) -> Corpus:
        paths: list[str] = []
        raw_imports: list[tuple[int, list[str]]] = []
        names: list[str] = []
        codes: list[str] = []
        premise_file: list[int] = []
        starts: list[int] = []
        ends: list[int] = []
        seen: dict[str, int] = {}
        skipped: dict[str, int] = {}
        skipped_names: set[tuple[str, str]] = set()
        for lineno, record in iter_jsonl(path):
            where = f"{path}:{lineno}"
            file_path = _field(record, "path", str, where)
            if not file_path:  # no theorem or import can name it; merge refuses it the same way
                raise LeanAgentError(f"{where}: field 'path' is empty")
            file_imports = _field(record, "imports", list, where)
            premises = _field(record, "premises", list, where)
            if file_path in seen:
                raise LeanAgentError(f"{where}: file '{file_path}' already listed on line {seen[file_path]}")
            seen[file_path] = lineno
            if not all(isinstance(i, str) for i in file_imports):
                raise LeanAgentError(f"{where}: field 'imports' must be a list of paths")
            file_id = len(paths)
            paths.append(file_path)
            raw_imports.append((lineno, file_imports))
            for k, premise in enumerate(premises):
                reason = skipped_premise(premise)
                if reason is not None:
                    skipped[reason] = skipped.get(reason, 0) + 1
                    if isinstance(premise["full_name"], str):
                        skipped_names.add((file_path, premise["full_name"]))
                    continue
                name, code, start, end = premise_fields(premise, f"{where}: premises[{k}]")
                names.append(name)
                codes.append(code)
                starts.append(start)
                ends.append(end)
                premise_file.append(file_id)
        if not paths:
            raise LeanAgentError(f"{path}: the corpus is empty")
        if skipped:
            details = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items()))
            log.warning("%s: skipped %d premise(s) as ReProver does (%s)", path, sum(skipped.values()), details)
        for (lineno, file_imports), file_path in zip(raw_imports, paths):
            for imported in file_imports:
                if imported not in seen:
                    raise LeanAgentError(
                        f"{path}:{lineno}: '{file_path}' imports '{imported}', which is not in the corpus"
                    )
        index = {p: i for i, p in enumerate(paths)}
        imports = [[index[i] for i in file_imports] for _, file_imports in raw_imports]
        try:
            corpus = cls(
                paths, imports, names, codes,
                np.asarray(premise_file, dtype=np.int64),
                np.asarray(starts, dtype=np.int64),
                np.asarray(ends, dtype=np.int64),
                source=str(path),
            )
        except ImportCycle as cycle:
            raise LeanAgentError(f"{path}: import cycle: {' -> '.join(cycle.files)}") from None
        corpus.skipped_names = skipped_names
        if not names:
            raise LeanAgentError(f"{path}: no file of the corpus has a premise (every 'premises' list is empty or skipped)")
        if corpus._ambiguous:
            example = min(corpus._ambiguous)
            log.warning("%s: %d name(s) are listed twice or more in one file (e.g. %s in %s); an annotation of such a "
                        "name is resolved by its def_pos, or else to the last of them", path, len(corpus._ambiguous),
                        example[1], example[0])
        return corpus

    def __len__(self) -> int:
        return len(self.names)

    @functools.cached_property
    def premise_set_key(self) -> str:
        """Identifies the premises (names and code), whatever order or file layout the corpus came in.

        What a hybrid weight is chosen for: a re-serialised or merged corpus with the same premises keeps it.
        """
        digest = hashlib.sha256()
        for entry in sorted(f"{name}\x00{code}" for name, code in zip(self.names, self.codes)):
            digest.update(entry.encode())
            digest.update(b"\x01")
        return digest.hexdigest()

    def premise_texts(self, form: str = "serialized") -> list[str]:
        """What the encoder reads for each premise: ReProver's serialized form, or the raw code."""
        if form == "code":
            return list(self.codes)
        return [serialize_premise(name, code) for name, code in zip(self.names, self.codes)]

    @property
    def num_files(self) -> int:
        return len(self.paths)

    def _import_closure(self) -> np.ndarray:
        """closure[f, g] is True when file f imports g directly or transitively (never f itself)."""
        n = len(self.paths)
        try:
            order = imports_first(dict(enumerate(self.imports)))
        except ImportCycle as cycle:
            raise ImportCycle([self.paths[f] for f in cycle.files]) from None
        closure = np.zeros((n, n), dtype=bool)
        for f in order:
            for g in self.imports[f]:
                closure[f] |= closure[g]
                closure[f, g] = True
        return closure

    def locate(self, def_path: str, full_name: str, def_pos: object = None) -> int | None:
        """Find an annotated premise by name in its file, falling back to the position (ReProver's rule); a name
        the file lists twice is told apart by the position too."""
        found = self._by_name.get((def_path, full_name))
        ambiguous = found is not None and (def_path, full_name) in self._ambiguous
        if (found is not None and not ambiguous) or def_pos is None:
            return found
        file_id = self.file_index.get(def_path)
        if file_id is None:
            return None
        try:
            key = position_key(def_pos, "def_pos")
        except LeanAgentError:
            return found
        lo, hi = self.file_ranges[file_id]
        inside = lo + np.flatnonzero((self.start_keys[lo:hi] <= key) & (key <= self.end_keys[lo:hi]))
        if ambiguous:
            inside = [i for i in inside if self.names[i] == full_name]
            return int(inside[0]) if len(inside) else found
        return int(inside[0]) if len(inside) else None

    def accessible_in_file(self, file_id: int, pos_key: int) -> np.ndarray:
        """Ids of premises of `file_id` that end before `pos_key`."""
        lo, hi = self.file_ranges[file_id]
        return lo + np.flatnonzero(self.end_keys[lo:hi] <= pos_key)

    def accessible_pairs(self, file_ids: np.ndarray | int, pos_keys: np.ndarray | int, premise_ids: np.ndarray) -> np.ndarray:
        """For each (file, position, premise) triple, whether the premise is accessible there: imported by the
        file, or above the position in the file itself (the rule of `accessible_mask`, one premise a row; a
        single file and position apply to every premise)."""
        home = self.premise_file[premise_ids]
        return self.closure[file_ids, home] | ((home == file_ids) & (self.end_keys[premise_ids] <= pos_keys))

    def accessible_ids(self, file_id: int, pos_key: int) -> np.ndarray:
        """All premise ids accessible at a position; for tests and tools, not the hot path."""
        return np.flatnonzero(self.accessible_pairs(file_id, pos_key, np.arange(len(self))))

    def accessible_mask(self, file_ids: torch.Tensor, pos_keys: torch.Tensor, own_file: torch.Tensor | None = None) -> torch.Tensor:
        """[B, num_premises] boolean mask of the premises each query may use, computed on the queries' device;
        `own_file`, the queries' `own_file_mask` where the caller has it already, is not computed again."""
        closure, premise_file, _ = self._on_device(file_ids.device)
        own_file = self.own_file_mask(file_ids, pos_keys) if own_file is None else own_file
        return closure[file_ids][:, premise_file] | own_file

    def own_file_mask(self, file_ids: torch.Tensor, pos_keys: torch.Tensor) -> torch.Tensor:
        """[B, num_premises] the premises of each query's own file above its position (a subset of `accessible_mask`)."""
        _, premise_file, end_keys = self._on_device(file_ids.device)
        return (premise_file[None, :] == file_ids[:, None]) & (end_keys[None, :] <= pos_keys[:, None])

    def _on_device(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        if device not in self._torch_cache:
            self._torch_cache[device] = (
                torch.from_numpy(self.closure).to(device),
                torch.from_numpy(self.premise_file).to(device),
                torch.from_numpy(self.end_keys).to(device),
            )
        return self._torch_cache[device]
