"""LeanAgent's "Merge All" datasets: one benchmark folder that is the union of several.

Progressive training on merged data must not train on a theorem that an earlier stage
tested on, or the lifelong metrics measure memorisation. `merge_datasets` writes the union
of LeanDojo-format datasets with these rules:

Corpus (``corpus.jsonl``)
  * Files are deduplicated by ``path``. A file listed identically by several sources is
    written once as the first source has it. If records for a path differ, the merged
    record has the union of imports (first record's order, new ones appended) and the
    union of premises, deduplicated by (path, full_name) with the first occurrence winning,
    stably sorted by ``start`` position, and one warning names such a file and two of its sources
    (a dependency traced at two commits). Other keys come from the first record. Premises that
    every reader skips, as ReProver's loader does (a null ``full_name``, ...), are not checked
    and are left out of such a union.
  * Every import must name a file of the merged corpus and imports must not form a
    cycle; otherwise LeanAgentError names the corpus line that lists the offending import.
  * Files are written in topological order (imports first); among files whose imports are
    all written, the first seen goes first, so an already-sorted corpus keeps its order.

Theorems (each split folder, e.g. ``random/``, merged on its own)
  * Deduplicated by (file_path, full_name). The record is the one from the last source
    that has the theorem (LeanAgent uses the most recently added repository's copy); its
    position is where it was first seen. `MergeStats.repeated_theorems` counts them, and the
    `merge` command prints the count.
  * Its split is the strictest it has in any source: test > val > train. A theorem that
    any source tests on is never trained on, and one any source validates on is never
    trained on either. For ``novel_premises`` this keeps theorems out of train but does not
    re-establish that test premises are unused in train across sources.

Nothing else (metadata, attribution, other folders) is copied; ``merged_from.json`` records the
sha256 of every source file read (leanagent/corpus/provenance.py), so a model trained on the merge
names the data behind it. The result is built in a temporary folder beside ``out_dir`` and renamed
into place only when complete, so an error leaves no ``out_dir`` (and, with ``overwrite=True``, the
previous one intact). A merge killed outright (SIGKILL, a lost machine) leaves those hidden folders behind;
the next merge into the same ``out_dir`` removes them, and puts back an earlier merge that a kill caught
between its two renames. Merges beside each other take turns, so one's leftovers are never another's work.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leanagent.corpus.corpus import Corpus, premise_fields, skipped_premise
from leanagent.corpus.import_order import ImportCycle, imports_first
from leanagent.corpus.provenance import write_manifest
from leanagent.corpus.tactics import read_theorems, tactic_states
from leanagent.errors import LeanAgentError
from leanagent.io import (
    atomic_open, folder_lock, iter_jsonl, missing_error, missing_folders, remove_empty_folders, temporary_names, write_json,
)

log = logging.getLogger("leanagent")

DEFAULT_SPLITS = ("random", "novel_premises")
SPLIT_FILES = ("train", "val", "test")
_RANK = {name: rank for rank, name in enumerate(SPLIT_FILES)}

__all__ = ["DEFAULT_SPLITS", "MergeStats", "merge_datasets"]


@dataclass(frozen=True)
class MergeStats:
    """What a merge wrote, for logs and sanity checks.

    `merged_files`: paths written as a union because their records differed between
    sources (or repeated a premise or import); `kept_out_of_train[split]`: theorems that a
    source had in train but another source had in val or test, so they left train;
    `repeated_theorems[split]`: theorems (file_path, full_name) given more than once, kept once.
    """

    files: int
    premises: int
    merged_files: int
    theorems: dict[str, dict[str, int]] = field(default_factory=dict)
    kept_out_of_train: dict[str, int] = field(default_factory=dict)
    repeated_theorems: dict[str, int] = field(default_factory=dict)


@dataclass
class _File:
    """First record of a path plus the union so far; `rebuild` once the union differs from it."""

    record: dict[str, Any]
    imports: list[str]
    premises: dict[str, dict[str, Any]]
    import_origin: dict[str, str]
    rebuild: bool = False
    origin: Path | None = None  # the source of `record`
    differs_in: Path | None = None  # the first other source that lists the file otherwise


def _check_corpus_record(rec: Any, where: str) -> None:
    if not isinstance(rec, dict) or not isinstance(rec.get("path"), str) or not rec["path"]:
        raise LeanAgentError(f"{where}: corpus line needs a non-empty string 'path'")
    imports = rec.get("imports")
    if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
        raise LeanAgentError(f"{where}: 'imports' of {rec['path']} must be a list of paths")
    premises = rec.get("premises")
    if not isinstance(premises, list):
        raise LeanAgentError(f"{where}: 'premises' of {rec['path']} must be a list")
    for k, p in enumerate(premises):
        if skipped_premise(p) is None:  # every reader skips the others, as ReProver's loader does (a null full_name, ...)
            # the fit's corpus reader's rule: a merge that copied the record would fail there, naming the merged file
            premise_fields(p, f"{where}: premises[{k}] of {rec['path']}")


def _read_corpora(sources: list[Path]) -> dict[str, _File]:
    files: dict[str, _File] = {}
    for src in sources:
        corpus = src / "corpus.jsonl"
        listed: dict[str, int] = {}  # one source lists a file once; several sources may share it
        for lineno, rec in iter_jsonl(corpus):
            where = f"{corpus}:{lineno}"
            _check_corpus_record(rec, where)
            path = rec["path"]
            if path in listed:
                raise LeanAgentError(f"{where}: file '{path}' already listed on line {listed[path]}")
            listed[path] = lineno
            seen = files.get(path)
            if seen is None:
                seen = files[path] = _File(record=rec, imports=[], premises={}, import_origin={}, origin=src)
            elif rec == seen.record:
                continue
            else:
                seen.rebuild = True
                seen.differs_in = seen.differs_in or src
            for imp in rec["imports"]:
                if imp in seen.import_origin:
                    seen.rebuild = True
                else:
                    seen.imports.append(imp)
                    seen.import_origin[imp] = where
            for p in rec["premises"]:
                if skipped_premise(p) is not None:
                    continue  # left out of a rebuilt record; a record written as it came keeps it
                if p["full_name"] in seen.premises:
                    seen.rebuild = True
                else:
                    seen.premises[p["full_name"]] = p
    return files


def _warn_differing(files: dict[str, _File]) -> None:
    """Sources that list a shared file otherwise (a dependency at another commit) are merged as a union that
    neither traced; one line says so, as the datasets may not belong together."""
    differing = [(path, f) for path, f in files.items() if f.differs_in is not None]
    if differing:
        path, f = differing[0]
        log.warning(
            "merge: %d file(s) shared by the sources are listed differently by them (e.g. %s in %s and %s); each is "
            "written as the union of their imports and premises, the first source's premise for a name both list",
            len(differing), path, f.origin, f.differs_in,
        )


def _topological_order(files: dict[str, _File]) -> list[str]:
    """Imports before importers, in first-seen order; rejects dangling imports and cycles."""
    for path, f in files.items():
        for imp in f.imports:
            if imp not in files:
                raise LeanAgentError(
                    f"{f.import_origin[imp]}: {path} imports {imp}, which is in none of the merged corpora"
                )
    try:
        return imports_first({path: f.imports for path, f in files.items()})
    except ImportCycle as cycle:
        importer, imported = cycle.files[-2:]  # the import that closes the cycle
        raise LeanAgentError(
            f"{files[importer].import_origin[imported]}: import cycle in merged corpus: " + " -> ".join(cycle.files)
        ) from None


def check_mergeable(sources: list[Path]) -> None:
    """The corpora of all `sources` merge (no import cycle, no import that none of them holds): a merge_all run
    checks it before its first stage, since its last stage merges them all. Earlier stages merge fewer: a
    cycle there is one here too."""
    _topological_order(_read_corpora(sources))


def _merged_record(f: _File) -> dict[str, Any]:
    if not f.rebuild:
        return f.record
    premises = sorted(f.premises.values(), key=lambda p: tuple(p["start"]))
    return {**f.record, "imports": f.imports, "premises": premises}


def _merge_split(sources: list[Path], split: str, read: dict[Path, list]) -> tuple[dict[str, list[dict]], int, int]:
    """Theorem lists of one split folder (its files' theorems in `read`), how many were kept out of train, and
    how many were given more than once."""
    best: dict[tuple[str, str], list] = {}
    repeated: set[tuple[str, str]] = set()  # theorems, not their extra copies: one given three times counts once
    for src in sources:
        for part in SPLIT_FILES:
            path = src / split / f"{part}.json"
            for k, thm in enumerate(read[path]):
                if not isinstance(thm, dict) or not all(
                    isinstance(thm.get(key), str) for key in ("file_path", "full_name")
                ):
                    raise LeanAgentError(f"{path}: theorem #{k} needs string 'file_path' and 'full_name'")
                key = (thm["file_path"], thm["full_name"])
                if key in best:
                    repeated.add(key)
                entry = best.setdefault(key, [_RANK[part], thm, False])
                entry[0] = max(entry[0], _RANK[part])
                entry[1] = thm
                entry[2] = entry[2] or part == "train"
    out = {part: [thm for rank, thm, _ in best.values() if rank == _RANK[part]] for part in SPLIT_FILES}
    moved = sum(1 for rank, _, was_train in best.values() if was_train and rank > _RANK["train"])
    return out, moved, len(repeated)


def _check_theorems(sources: list[Path], read: dict[Path, list], merged_corpus: Path) -> None:
    """Every source theorem (`read`: split file -> its theorems) as a fit of the merge will read it (its file in
    the merged corpus, its tactics well formed), so that an error names the source file and its index there."""
    if not any(read.values()):
        return
    label = "the merged corpus of " + ", ".join(str(src) for src in sources)
    try:
        corpus = Corpus.from_jsonl(merged_corpus)
    except LeanAgentError as e:  # not the temporary file's name: it is gone once the merge is refused
        raise LeanAgentError(str(e).replace(str(merged_corpus), label)) from None
    corpus.source = label
    for path, theorems in read.items():
        tactic_states(theorems, corpus, path)


def _split_files(sources: list[Path], splits: list[str]) -> list[Path]:
    return [src / name / f"{part}.json" for src in sources for name in splits for part in SPLIT_FILES]


def _source_files(sources: list[Path], splits: list[str]) -> list[Path]:
    """Every file the merge reads, for its manifest."""
    return [src / "corpus.jsonl" for src in sources] + _split_files(sources, splits)


def _open_permissions(root: Path) -> None:
    """Temp files are private (0600/0700); a dataset should get the usual umask permissions."""
    umask = os.umask(0)
    os.umask(umask)
    for folder, _, names in os.walk(root):
        os.chmod(folder, 0o777 & ~umask)
        for name in names:
            os.chmod(os.path.join(folder, name), 0o666 & ~umask)


def _split_names(split: str | Sequence[str]) -> list[str]:
    names = [split] if isinstance(split, str) else list(split)
    if not names or not all(isinstance(s, str) and s and "/" not in s and s not in (".", "..") for s in names):
        raise LeanAgentError(f"split must name one or more split folders (e.g. 'random'), got {split!r}")
    return list(dict.fromkeys(names))


def _check_replaceable(out_dir: Path) -> None:
    """`overwrite` replaces an earlier merge, nothing else: not a file, not a folder without a corpus (such as
    `data/` or the project itself), not a dataset that no merge wrote, not the folder the command runs in."""
    if not out_dir.is_dir():
        raise LeanAgentError(f"output folder {out_dir} is a file: write the merge elsewhere")
    if not (out_dir / "corpus.jsonl").is_file():
        raise LeanAgentError(f"output folder {out_dir} is not a dataset (no corpus.jsonl): overwrite replaces only an earlier merge")
    if not (out_dir / "merged_from.json").is_file():  # a dataset of its own (metadata, other splits): not ours to delete
        raise LeanAgentError(f"output folder {out_dir} is a dataset but not a merge (no merged_from.json): "
                             "overwrite replaces only an earlier merge; write the merge elsewhere")
    if out_dir.resolve() in (Path.cwd(), *Path.cwd().parents):
        raise LeanAgentError(f"output folder {out_dir} holds the current folder: write the merge elsewhere")


def _clear_leftovers(out_dir: Path) -> None:
    """Remove the temporary folders of merges into `out_dir` that were killed; a previous merge that a kill
    caught between moving it aside and moving the new one in goes back to `out_dir`. Call under the lock."""
    ours = temporary_names(f".{out_dir.name}.", r"\.(tmp|old)")
    try:
        beside = list(out_dir.parent.iterdir())
    except OSError:
        return
    for p in beside:
        if not ours.fullmatch(p.name) or p.is_symlink() or not p.is_dir():
            continue
        previous = p / "previous"
        if p.suffix == ".old" and previous.is_dir() and not out_dir.exists():
            try:
                os.replace(previous, out_dir)
            except OSError as e:
                log.warning("cannot put back %s from %s (%s): left as it is", out_dir, previous, e.strerror or e)
                continue
            log.warning("put back %s: a merge that was replacing it was killed before it finished", out_dir)
        shutil.rmtree(p, ignore_errors=True)


def merge_datasets(
    sources: list[Path],
    out_dir: Path,
    split: str | Sequence[str] = DEFAULT_SPLITS,
    *,
    overwrite: bool = False,
) -> MergeStats:
    """Write the union of `sources` to `out_dir` (rules in the module docstring)."""
    sources = [Path(s) for s in sources]
    out_dir = Path(out_dir)
    splits = _split_names(split)
    if not sources:
        raise LeanAgentError("merge needs at least one source dataset")
    for path in (out_dir, *sources):
        try:
            path.resolve(strict=False)
        except (RuntimeError, OSError) as e:  # a symlink loop, a path too long
            raise missing_error(path, "", f"{path}: cannot resolve the path ({e})") from None
    seen: dict[Path, Path] = {}
    for src in sources:
        if src.is_file():
            raise LeanAgentError(f"source {src} is a file, not a dataset folder (corpus.jsonl and split folders)")
        if not src.is_dir():
            raise missing_error(src, "source ", f"source dataset folder not found: {src}")
        if src.resolve() in seen:  # the union would equal the one folder: a slip for another dataset
            raise LeanAgentError(f"source {src} is given twice (also as {seen[src.resolve()]}): give each dataset once")
        seen[src.resolve()] = src
        if src.resolve() == out_dir.resolve():
            raise LeanAgentError(f"output folder {out_dir} is also a source: write the merge elsewhere")
        if out_dir.resolve() in src.resolve().parents:
            raise LeanAgentError(f"output folder {out_dir} contains the source {src}: write the merge elsewhere")
        if src.resolve() in out_dir.resolve().parents:  # it would plant a dataset inside one it reads
            raise LeanAgentError(f"output folder {out_dir} is inside the source {src}: write the merge elsewhere")
        for name in splits:
            if not (src / name).is_dir():
                has = sorted(p.name for p in src.iterdir() if (p / "train.json").is_file())
                raise LeanAgentError(f"split {name!r}: source {src} has no such split folder"
                                     + (f" (it has {', '.join(has)}; choose with --split)" if has else ""))
    with folder_lock(out_dir.parent, "merge"):  # one merge at a time beside out_dir
        _clear_leftovers(out_dir)
        return _merge(sources, out_dir, splits, overwrite)


def _merge(sources: list[Path], out_dir: Path, splits: list[str], overwrite: bool) -> MergeStats:
    if out_dir.exists() and not overwrite:
        raise LeanAgentError(f"output folder already exists: {out_dir} (remove it or allow overwriting)")
    if out_dir.exists():
        _check_replaceable(out_dir)

    files = _read_corpora(sources)
    order = _topological_order(files)
    _warn_differing(files)
    read = {path: read_theorems(path) for path in _split_files(sources, splits)}  # once, for the merge and its check
    theorems = {}
    kept_out = {}
    repeated = {}
    for name in splits:
        theorems[name], kept_out[name], repeated[name] = _merge_split(sources, name, read)

    created = missing_folders(out_dir.parent)  # removed again if the merge fails: it leaves nothing behind
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".tmp"))
    except OSError as e:
        remove_empty_folders(created)
        raise LeanAgentError(f"output folder {out_dir}: cannot create it ({e.strerror or type(e).__name__})") from None
    try:
        with atomic_open(tmp / "corpus.jsonl", "w", encoding="utf-8") as f:
            for path in order:
                f.write(json.dumps(_merged_record(files[path]), ensure_ascii=False) + "\n")
        _check_theorems(sources, read, tmp / "corpus.jsonl")
        for name, parts in theorems.items():
            for part, thms in parts.items():
                write_json(tmp / name / f"{part}.json", thms)
        write_manifest(tmp, _source_files(sources, splits))
        _open_permissions(tmp)
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".old"))
            try:
                os.replace(out_dir, old / "previous")
                try:
                    os.replace(tmp, out_dir)
                except BaseException:
                    os.replace(old / "previous", out_dir)
                    raise
            finally:
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_empty_folders(created)
        raise

    return MergeStats(
        files=len(order),
        premises=sum(len(f.premises) for f in files.values()),
        merged_files=sum(f.rebuild for f in files.values()),
        theorems={n: {part: len(thms) for part, thms in parts.items()} for n, parts in theorems.items()},
        kept_out_of_train=kept_out,
        repeated_theorems=repeated,
    )
