"""The bundled split into repositories, and every lifelong config parsing."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from leanagent.errors import LeanAgentError
from leanagent.lifelong.cli import format_table, parse_ablation, parse_lifelong
from leanagent.lifelong.repositories import Repositories, resolve_repositories, split_bundled
from leanagent.lifelong.runner import settings_fingerprint
from tests.conftest import BUNDLED, REPO, shared_data, tactic, theorem, toy_corpus, write_dataset


def test_bundled_split_keeps_every_theorem_once_with_its_split(tmp_path):
    repos = split_bundled(BUNDLED, tmp_path, min_theorems=200)
    assert sorted(repos) == ["data", "data-list", "data-string", "other", "recycling-rbtree"]
    for split in ("train", "val", "test"):
        original = json.loads((BUNDLED / "random" / f"{split}.json").read_text())
        pieces = [t for path in repos.values() for t in json.loads((path / "random" / f"{split}.json").read_text())]
        assert Counter((t["file_path"], t["full_name"]) for t in pieces) == Counter((t["file_path"], t["full_name"]) for t in original)
    data_list = json.loads((repos["data-list"] / "random" / "train.json").read_text())
    assert data_list and all(t["file_path"].startswith("Batteries/Data/List/") for t in data_list)
    data = json.loads((repos["data"] / "random" / "test.json").read_text())
    assert not any(t["file_path"].startswith(("Batteries/Data/List/", "Batteries/Data/String/")) for t in data)
    assert (repos["other"] / "corpus.jsonl").read_bytes() == (BUNDLED / "corpus.jsonl").read_bytes()


def test_small_folders_pool_into_other(tmp_path):
    corpus = [{"path": p, "imports": [], "premises": []} for p in ("P/A/x.lean", "P/A/y.lean", "P/B/z.lean", "P/top.lean")]
    theorems = [theorem("P/A/x.lean", "a1", 1, [tactic("s", [])]), theorem("P/A/y.lean", "a2", 1, []),
                theorem("P/B/z.lean", "b", 1, []), theorem("P/top.lean", "t", 1, [])]
    root = write_dataset(tmp_path / "d", corpus, {"train": theorems})
    repos = split_bundled(root, tmp_path / "out", min_theorems=2)
    assert sorted(repos) == ["a", "other"]
    names = lambda r: [t["full_name"] for t in json.loads((repos[r] / "random" / "train.json").read_text())]
    assert names("a") == ["a1", "a2"] and names("other") == ["b", "t"]


def test_data_root_repositories_must_exist(tmp_path):
    with pytest.raises(LeanAgentError, match="has no corpus.jsonl"):
        resolve_repositories(Repositories(data_root=str(tmp_path), names=["missing"], bundled=None), tmp_path)


@pytest.mark.parametrize("name", ["lifelong.yaml", "lifelong_mathlib.yaml"])
def test_lifelong_configs_parse(name):
    settings = parse_lifelong(["--config", str(REPO / "configs" / name)])
    assert settings.order == "curriculum" and settings.construction == "single_repo"
    assert settings.epochs_per_repo == 1 and settings.ewc.enabled is False
    from leanagent.lifelong.runner import config_list

    for config in [*config_list(settings.retrieval_config), *config_list(settings.fisher_config)]:
        assert (REPO / config).is_file(), config
    variant = parse_lifelong(["--config", str(REPO / "configs" / name), "--construction=merge_all", "--ewc.enabled=true"])
    assert variant.construction == "merge_all" and variant.ewc.enabled
    assert settings_fingerprint(variant) != settings_fingerprint(settings)


def test_mathlib_config_names_the_shared_slices():
    settings = parse_lifelong(["--config", str(REPO / "configs" / "lifelong_mathlib.yaml")])
    assert settings.repositories.names == ["mathlib-logic", "mathlib-data-nat", "mathlib-data-list", "mathlib-data-set", "mathlib-group"]


def test_mathlib_config_resolves_against_the_shared_slices():
    settings = parse_lifelong(["--config", str(REPO / "configs" / "lifelong_mathlib.yaml")])
    shared = shared_data("lifelong")
    repos = resolve_repositories(Repositories(data_root=str(shared), names=settings.repositories.names, bundled=None), REPO)
    assert list(repos) == settings.repositories.names


def test_ablation_config_covers_every_combination_of_table_4():
    ablation = parse_ablation(["--config", str(REPO / "configs" / "lifelong_ablation.yaml")])
    combos = {(s.order, s.construction, s.ewc) for s in ablation.setups}
    assert len(combos) == len(ablation.setups) == 8
    assert ("curriculum", "single_repo", False) in combos  # LeanAgent itself
    assert (REPO / ablation.base).is_file()


def test_format_table_aligns_columns():
    text = format_table([{"setup": "a", "FM": 1.23456}, {"setup": "longer", "FM": -2.0}])
    lines = text.splitlines()
    assert lines[1].endswith("1.235") and lines[2].endswith("-2.000") and len({len(l) for l in lines}) == 1
