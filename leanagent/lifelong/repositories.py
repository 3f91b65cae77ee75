"""Where a lifelong run's repositories come from: dataset folders on disk, or the bundled dataset split by folder.

Splitting the bundled dataset: a theorem belongs to the repository named by its file's
folder two levels deep (`Batteries/Data/List/Basic.lean` -> `Data/List`) when that folder
holds at least `min_theorems` theorems; otherwise to its top-level folder (`Data`) when the
theorems left there number at least `min_theorems`; all others are pooled into `other`. Each repository keeps every
theorem's original split (train/val/test, in every split folder) and the whole corpus, as
LeanAgent's per-repository datasets carry their dependencies.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from leanagent.corpus.corpus import Corpus
from leanagent.corpus.tactics import read_theorems, require_positives, require_training_examples, tactic_states
from leanagent.errors import LeanAgentError, refuse_repeats
from leanagent.io import atomic_write, file_sha256, missing_error, write_json

SPLIT_FILES = ("train", "val", "test")


@dataclass
class Repositories:
    """Either `data_root` + `names` (dataset folders), or `bundled` (a dataset to split by folder)."""

    data_root: str | None = None
    names: list[str] | None = None
    bundled: str | None = "data/batteries"
    min_theorems: int = 150


def _split_folders(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "train.json").is_file())


def _folder(path: str, depth: int) -> str:
    parts = path.split("/")[1:-1]  # drop the package root and the file name
    return "/".join(parts[:depth])


def _read_located(path: Path) -> list[dict]:
    """A split file whose theorems each name their file: the bundled dataset is split by it."""
    theorems = read_theorems(path)
    for k, thm in enumerate(theorems):
        if not isinstance(thm, dict) or not isinstance(thm.get("file_path"), str):
            raise LeanAgentError(f"{path}: theorem #{k}: expected an object with a string 'file_path'")
    return theorems


def _reference_split(splits: list[str], split: str | None) -> str:
    """The split folder whose theorems are counted per folder: the run's own, else `random`, else the first."""
    if split in splits:
        return split
    return "random" if "random" in splits else splits[0]


def _unique_slugs(names: list[str]) -> dict[str, str]:
    """Folder names for repositories: `Data/List` -> `data-list`; a second name with the same slug (`Data-List`)
    gets `data-list-2` instead of sharing (and overwriting) the first's folder."""
    slugs: dict[str, str] = {}
    for name in names:
        base = name.replace("/", "-").lower()
        slug, n = base, 2
        while slug in slugs.values():
            slug, n = f"{base}-{n}", n + 1
        slugs[name] = slug
    return slugs


def _data_files(splits: list[str]) -> list[str]:
    """The files a dataset folder is read from, relative to it: its corpus and each split folder's three files."""
    return ["corpus.jsonl", *(f"{split}/{part}.json" for split in splits for part in SPLIT_FILES)]


def repository_data(dataset: Path, split: str) -> dict[str, str]:
    """{file: sha256} of what a lifelong stage reads from a repository (its corpus and split files)."""
    return {relative: file_sha256(dataset / relative) for relative in _data_files([split]) if (dataset / relative).is_file()}


def check_same_data(recorded: dict | None, now: dict[str, dict[str, str]], out: Path) -> None:
    """A run resumed on repositories whose files changed since it began would finish on other data than its first
    stages trained and were evaluated on (and continue an interrupted fit on it): refused, as other settings are.
    A state written before the record existed (None) has nothing to compare."""
    if recorded is None or recorded == now:
        return
    for name in sorted(set(recorded) | set(now)):
        before, after = recorded.get(name, {}), now.get(name, {})
        if changed := sorted(f for f in set(before) | set(after) if before.get(f) != after.get(f)):
            raise LeanAgentError(
                f"{out} holds a lifelong run whose repository {name} has changed since it began ({changed[0]} differs): "
                "its finished stages learned from the old files; restore them, or choose another output_dir or delete it"
            )


def _source_fingerprint(dataset: Path, splits: list[str], reference: str, min_theorems: int) -> str:
    """What a split of `dataset` was made from: an edited (or replaced) dataset is split again, not reused."""
    digest = hashlib.sha256(f"{reference}\0{min_theorems}\0".encode())
    for relative in _data_files(splits):
        path = dataset / relative
        digest.update(f"{relative}\0{file_sha256(path) if path.is_file() else '-'}\0".encode())
    return digest.hexdigest()


def _check_source(dataset: Path, split: str, theorems: dict[str, list]) -> None:
    """The run's split of the bundled dataset (`theorems`, as read), checked as a fit reads it, before it is split:
    an error names the user's file and its theorem's index there, not a copy under output_dir that a refused run
    removes."""
    corpus = Corpus.from_jsonl(dataset / "corpus.jsonl")
    for part in SPLIT_FILES:
        path = dataset / split / f"{part}.json"
        _require_tactic_lists(theorems[part], path)
        tactic_states(theorems[part], corpus, path)


def split_bundled(dataset: Path, out_root: Path, min_theorems: int, split: str | None = None) -> dict[str, Path]:
    """Write one dataset folder per repository under `out_root` (idempotent: same input, same output).
    Folders are counted in `split` (the run's split folder; `random` or the first when not given)."""
    splits = _split_folders(dataset)
    if not splits:
        raise LeanAgentError(f"{dataset}: no split folder with train.json")
    reference = _reference_split(splits, split)
    # Another split folder that lacks val or test is left out, not an error in a run that never reads it.
    splits = [s for s in splits if s == reference or all((dataset / s / f"{part}.json").is_file() for part in SPLIT_FILES)]
    located = {(s, part): _read_located(dataset / s / f"{part}.json") for s in splits for part in SPLIT_FILES}
    if split is not None:
        _check_source(dataset, reference, {part: located[reference, part] for part in SPLIT_FILES})
    paths = [t["file_path"] for part in SPLIT_FILES for t in located[reference, part]]
    deep = Counter(_folder(p, 2) for p in paths)
    is_deep = lambda path: bool(_folder(path, 2)) and deep[_folder(path, 2)] >= min_theorems
    rest = Counter(_folder(p, 1) for p in paths if not is_deep(p))

    def repository(path: str) -> str:
        if is_deep(path):
            return _folder(path, 2)
        if _folder(path, 1) and rest[_folder(path, 1)] >= min_theorems:
            return _folder(path, 1)
        return "other"

    # Every split folder's theorems find a repository (a file only another split folder has goes to `other`).
    names = sorted({repository(t["file_path"]) for theorems in located.values() for t in theorems})
    parts: dict[tuple[str, str], dict[str, list]] = {}
    for key, theorems in located.items():
        by_repository: dict[str, list] = {name: [] for name in names}
        for t in theorems:
            by_repository[repository(t["file_path"])].append(t)
        parts[key] = by_repository
    fingerprint = _source_fingerprint(dataset, splits, reference, min_theorems)
    out: dict[str, Path] = {}
    for name, slug in _unique_slugs(names).items():
        target = out_root / slug
        done = target / "done.json"
        if done.is_file() and _read_done(done) == {"folder": name, "fingerprint": fingerprint}:
            out[slug] = target
            continue
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        atomic_write(target / "corpus.jsonl", lambda tmp: shutil.copyfile(dataset / "corpus.jsonl", tmp))
        for (split_folder, part), by_repository in parts.items():
            write_json(target / split_folder / f"{part}.json", by_repository[name])
        write_json(done, {"source": str(dataset), "folder": name, "min_theorems": min_theorems,
                          "reference_split": reference, "fingerprint": fingerprint})
        out[slug] = target
    return out


def _read_done(path: Path) -> dict[str, str] | None:
    """A finished split's folder and source fingerprint; None for an unreadable or older record (split again)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return {"folder": record["folder"], "fingerprint": record["fingerprint"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_splits(name: str, root: Path, split: str) -> dict[str, list[dict]]:
    """One repository's train/val/test theorems of a split folder, each with a list of traced tactics: the one
    reader of them that the split check and the curriculum share."""
    if not root.is_dir():
        raise missing_error(root, f"repository {name!r}: ", f"repository {name!r}: dataset folder not found: {root}")
    out = {}
    for part in SPLIT_FILES:
        path = root / split / f"{part}.json"
        out[part] = read_theorems(path)
        _require_tactic_lists(out[part], path)
    return out


def _require_tactic_lists(theorems: list, path: Path) -> None:
    for k, thm in enumerate(theorems):
        tactics = thm.get("traced_tactics") if isinstance(thm, dict) else None
        if not isinstance(tactics, list) or not all(isinstance(t, dict) for t in tactics):
            label = thm.get("full_name", "?") if isinstance(thm, dict) else "?"
            raise LeanAgentError(f"{path}: theorem #{k} ({label}): 'traced_tactics' must be a list of tactic objects")


def check_splits(repos: dict[str, Path], split: str, train_alone: bool = True) -> dict[str, dict[str, list[dict]]]:
    """Each repository needs traced theorems in train (its stage's fit), val (the checkpoint and hybrid's weight)
    and test (its column of the matrix), every tactic well formed, and premises of the repository's corpus in
    val and test, and in train where its stage trains on it alone (`train_alone`; a merge_all stage trains on
    the earlier repositories too): a repository without them is refused before the first stage, not when its
    own stage comes, hours into a run. Returns what it read, for the curriculum."""
    loaded = {}
    for name, root in repos.items():
        loaded[name] = read_splits(name, root, split)
        for part, theorems in loaded[name].items():
            if not any(t["traced_tactics"] for t in theorems):
                raise LeanAgentError(
                    f"{root / split / part}.json: repository {name!r} has no theorem with traced tactics in its {part} split"
                )
        corpus = Corpus.from_jsonl(root / "corpus.jsonl")
        for part in ("train", "val", "test"):  # every tactic as a fit reads it
            path = root / split / f"{part}.json"
            states = tactic_states(loaded[name][part], corpus, path)
            if part != "train":
                require_positives(states, path, corpus.source)
            elif train_alone:
                require_training_examples(states, path, corpus.source)
    return loaded


def resolve_repositories(spec: Repositories, work_dir: Path, split: str | None = None) -> dict[str, Path]:
    """Name -> dataset folder, in the given order (the bundled dataset is split into `work_dir/repositories`).
    `split`, the split folder the run reads, is checked in the bundled dataset before anything is written."""
    if spec.data_root is not None:
        root = Path(spec.data_root)
        if not root.is_dir():
            raise missing_error(root, "repositories.data_root: ", f"repositories.data_root: {root} is not a folder")
        refuse_repeats(list(spec.names or []), "repositories.names", "a repository is one stage")
        if not spec.names:  # a folder with a split but no corpus is a dataset with a file missing, not something else
            for folder in sorted(p for p in root.iterdir() if p.is_dir() and not (p / "corpus.jsonl").is_file()):
                if _split_folders(folder):
                    raise LeanAgentError(f"repositories.data_root: {folder} has split folders but no corpus.jsonl")
        names = spec.names or sorted(p.name for p in root.iterdir() if (p / "corpus.jsonl").is_file())
        for name in names:  # owner/repo is a folder under data_root; ./x, ../x and /x are not names of one
            parts = Path(name).parts
            if not parts or Path(name).is_absolute() or any(p in (".", "..") for p in name.replace("\\", "/").split("/")):
                raise LeanAgentError(f"repositories.names: {name!r} must be a folder inside data_root ({root}), "
                                     "named without '.', '..' or a leading '/'")
        repos = {name: root / name for name in names}
        for name, path in repos.items():
            if not path.is_dir():
                why = "is a file, not a dataset folder" if path.exists() else "does not exist"
                raise missing_error(path, f"repositories.names: {name!r}: ", f"repositories.names: {name!r}: {path} {why}")
            if not (path / "corpus.jsonl").is_file():
                raise LeanAgentError(f"repositories.data_root: {path} has no corpus.jsonl")
        folders: dict[Path, str] = {}
        for name, path in repos.items():  # a link, or a/ and a: one repository under two names
            if (other := folders.setdefault(path.resolve(), name)) != name:
                raise LeanAgentError(f"repositories.names: {other!r} and {name!r} are the same folder "
                                     f"{path.resolve()}; a repository is one stage")
        if not repos:
            raise LeanAgentError(f"repositories.data_root: no dataset folders in {root}")
        return repos
    if spec.bundled is None:
        raise LeanAgentError("repositories: set either data_root (with names) or bundled")
    dataset = Path(spec.bundled)
    if not (dataset / "corpus.jsonl").is_file():
        raise LeanAgentError(f"repositories.bundled: {dataset} has no corpus.jsonl")
    if split is not None and not (dataset / split / "train.json").is_file():
        found = _split_folders(dataset)
        raise LeanAgentError(f"split: {dataset} has no split folder {split!r} with a train.json"
                             + (f" (it has {', '.join(found)})" if found else ""))
    return split_bundled(dataset, work_dir / "repositories", spec.min_theorems, split)
