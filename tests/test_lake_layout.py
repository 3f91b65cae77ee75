"""A traced project keeps its dependencies under `.lake/packages/` and Lean's own files at absolute toolchain
paths. Paths are only keys: such a layout must load, resolve and rank exactly like the same files at plain paths."""

import json
from pathlib import Path

import numpy as np
import torch

from leanagent.data.datamodule import RetrievalDataModule

BUNDLED = Path(__file__).resolve().parents[1] / "data" / "batteries"
TOOLCHAIN = "/root/.elan/toolchains/leanprover--lean4---v4.9.0/src/lean/"


def lake_path(path: str) -> str:
    """Batteries/Data/* as a dependency of the project, Batteries/Lean/* as toolchain files, the rest the project's."""
    if path.startswith("Batteries/Data/"):
        return ".lake/packages/batteries/" + path
    if path.startswith("Batteries/Lean/"):
        return TOOLCHAIN + path
    return path


def write_lake_copy(root: Path) -> None:
    (root / "random").mkdir(parents=True)
    with open(BUNDLED / "corpus.jsonl", encoding="utf-8") as src, open(root / "corpus.jsonl", "w", encoding="utf-8") as out:
        for line in src:
            record = json.loads(line)
            record["path"] = lake_path(record["path"])
            record["imports"] = [lake_path(p) for p in record["imports"]]
            out.write(json.dumps(record) + "\n")
    theorems = json.loads((BUNDLED / "random" / "val.json").read_text(encoding="utf-8"))
    for theorem in theorems:
        theorem["file_path"] = lake_path(theorem["file_path"])
        for tactic in theorem["traced_tactics"]:
            for premise in tactic["annotated_tactic"][1]:
                premise["def_path"] = lake_path(premise["def_path"])
    (root / "random" / "val.json").write_text(json.dumps(theorems), encoding="utf-8")


def load(root: Path) -> RetrievalDataModule:
    return RetrievalDataModule(data_path=str(root / "random"), corpus_path=str(root / "corpus.jsonl"))


def test_dependencies_under_lake_packages_and_toolchain_paths_rank_like_plain_paths(tmp_path):
    write_lake_copy(tmp_path)
    plain, lake = load(BUNDLED), load(tmp_path)
    moved = sum(p != lake_path(p) for p in plain.corpus.paths)
    assert moved > len(plain.corpus.paths) // 4 and any(p.startswith(TOOLCHAIN) for p in lake.corpus.paths)

    a, b = plain.states("val"), lake.states("val")
    assert a.states == b.states and b.unresolved == a.unresolved
    names_a, names_b = np.asarray(plain.corpus.names), np.asarray(lake.corpus.names)
    assert [sorted(names_a[p]) for p in a.positives] == [sorted(names_b[p]) for p in b.positives]
    assert sum(map(len, b.positives)) > 0

    def accessible(dm: RetrievalDataModule, s) -> torch.Tensor:
        return dm.corpus.accessible_mask(torch.tensor(s.file_ids), torch.tensor(s.pos_keys))

    mask_a, mask_b = accessible(plain, a), accessible(lake, b)
    # Premise ids may be numbered in another order: compare names, state by state.
    for i in range(len(a)):
        assert sorted(names_a[mask_a[i].numpy()]) == sorted(names_b[mask_b[i].numpy()]), a.theorem_names[i]

    def top10(dm: RetrievalDataModule, s, mask: torch.Tensor) -> list[list[str]]:
        scores = dm.bm25_index.scores(s.states).float().masked_fill(~mask, float("-inf"))
        names = np.asarray(dm.corpus.names)
        # Sorted within the ten: equal scores may come out in either file order.
        return [sorted(names[row.numpy()]) for row in scores.topk(10, dim=1).indices]

    assert top10(plain, a, mask_a) == top10(lake, b, mask_b)
    # The hybrid weight is keyed to the premises, so it carries over between the two layouts.
    assert plain.corpus.premise_set_key == lake.corpus.premise_set_key
