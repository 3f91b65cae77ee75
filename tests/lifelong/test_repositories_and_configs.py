"""The bundled split into repositories, and every lifelong config parsing."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from leanagent.errors import LeanAgentError
from leanagent.lifelong.commands import format_table, parse_ablation, parse_lifelong
from leanagent.lifelong.repositories import Repositories, check_splits, resolve_repositories, split_bundled
from leanagent.lifelong.settings import settings_fingerprint
from tests.conftest import BUNDLED, REPO, config_args, premise, shared_data, tactic, theorem, write_dataset


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


def test_a_copy_stopped_halfway_leaves_no_short_corpus_and_the_rerun_completes(tmp_path, monkeypatch):
    import shutil

    real_copy = shutil.copyfile

    def half_then_stopped(src, dst):
        Path(dst).write_bytes(Path(src).read_bytes()[:100])
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "copyfile", half_then_stopped)
    with pytest.raises(KeyboardInterrupt):
        split_bundled(BUNDLED, tmp_path, min_theorems=200)
    assert not list(tmp_path.rglob("*corpus.jsonl*"))  # neither a short corpus.jsonl nor its temporary file
    monkeypatch.setattr(shutil, "copyfile", real_copy)
    repos = split_bundled(BUNDLED, tmp_path, min_theorems=200)
    assert all((path / "corpus.jsonl").read_bytes() == (BUNDLED / "corpus.jsonl").read_bytes() for path in repos.values())


def test_an_edited_bundled_dataset_is_split_again_not_reused(tmp_path):
    """The split was reused whatever the dataset held by then: a fixed or shortened train.json changed nothing."""
    import shutil

    source = tmp_path / "batteries"
    shutil.copytree(BUNDLED, source)
    first = split_bundled(source, tmp_path / "out", min_theorems=200, split="random")
    train = json.loads((source / "random" / "train.json").read_text())
    in_list = [k for k, t in enumerate(train) if t["file_path"].startswith("Batteries/Data/List/")]
    kept = [t for k, t in enumerate(train) if k not in in_list[:10]]  # ten theorems fewer, the same repositories
    (source / "random" / "train.json").write_text(json.dumps(kept))
    again = split_bundled(source, tmp_path / "out", min_theorems=200, split="random")
    assert sorted(again) == sorted(first)
    assert len(json.loads((again["data-list"] / "random" / "train.json").read_text())) == len(in_list) - 10
    pieces = [t["full_name"] for path in again.values() for t in json.loads((path / "random" / "train.json").read_text())]
    assert sorted(pieces) == sorted(t["full_name"] for t in kept)


def test_an_extra_split_folder_neither_changes_the_repositories_nor_loses_theorems(tmp_path):
    """Folders were counted in the first split folder by name: a subset in `aaa/` made 5 repositories 1. A split
    folder without val.json stopped a run that reads another."""
    import shutil

    source = tmp_path / "batteries"
    shutil.copytree(BUNDLED, source)
    subset = [t for t in json.loads((source / "random" / "train.json").read_text())
              if t["file_path"].startswith("Batteries/Data/List/")][:300]
    (source / "aaa").mkdir()
    for part, theorems in (("train", subset), ("val", []), ("test", [])):
        (source / "aaa" / f"{part}.json").write_text(json.dumps(theorems))
    (source / "novel_premises" / "val.json").unlink()  # a split folder the run does not read, damaged
    repos = split_bundled(source, tmp_path / "out", min_theorems=200, split="random")
    assert sorted(repos) == sorted(split_bundled(BUNDLED, tmp_path / "plain", min_theorems=200, split="random"))
    pieces = [t for path in repos.values() for t in json.loads((path / "aaa" / "train.json").read_text())]
    assert len(pieces) == len(subset)
    assert not any((path / "novel_premises").exists() for path in repos.values())


def test_two_folders_with_one_slug_get_two_repositories(tmp_path):
    """`A/B` and `A-B` both became `a-b`: the second overwrote nothing but was reused, and its theorems vanished."""
    corpus = [{"path": p, "imports": [], "premises": []} for p in ("P/A/B/x.lean", "P/A-B/y.lean")]
    theorems = [theorem("P/A/B/x.lean", "ab1", 1, []), theorem("P/A/B/x.lean", "ab2", 2, []),
                theorem("P/A-B/y.lean", "dash1", 1, []), theorem("P/A-B/y.lean", "dash2", 2, [])]
    root = write_dataset(tmp_path / "d", corpus, {"train": theorems})
    repos = split_bundled(root, tmp_path / "out", min_theorems=2)
    names = {slug: sorted(t["full_name"] for t in json.loads((path / "random" / "train.json").read_text()))
             for slug, path in repos.items()}
    assert names == {"a-b": ["dash1", "dash2"], "a-b-2": ["ab1", "ab2"]}


def test_a_damaged_bundled_theorem_is_named_in_the_users_file(tmp_path):
    """It was named in the repository copy under output_dir, at its index there, a folder removed on the way out."""
    import shutil

    source = tmp_path / "batteries"
    shutil.copytree(BUNDLED, source)
    train = json.loads((source / "random" / "train.json").read_text())
    train[5]["traced_tactics"] = None
    (source / "random" / "train.json").write_text(json.dumps(train))
    with pytest.raises(LeanAgentError, match=rf"^{source / 'random' / 'train.json'}: theorem #5 "):
        split_bundled(source, tmp_path / "out", min_theorems=200, split="random")
    assert not (tmp_path / "out").exists()


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
    with pytest.raises(LeanAgentError, match="'missing': .* does not exist"):
        resolve_repositories(Repositories(data_root=str(tmp_path), names=["missing"], bundled=None), tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(LeanAgentError, match="empty has no corpus.jsonl"):
        resolve_repositories(Repositories(data_root=str(tmp_path), names=["empty"], bundled=None), tmp_path)


@pytest.mark.parametrize("names, fragment", [
    (["repoA", "./repoA"], "'./repoA' must be a folder inside data_root"),
    (["../repoA"], "'../repoA' must be a folder inside data_root"),
    (["repoA", "repoA/"], "'repoA' and 'repoA/' are the same folder"),
    (["repoA", "link"], "'repoA' and 'link' are the same folder"),
])
def test_one_repository_under_two_names_is_refused(tmp_path, names, fragment):
    """It used to run two stages on the same data and score them as two repositories."""
    (tmp_path / "repoA").mkdir()
    (tmp_path / "repoA" / "corpus.jsonl").write_text("")
    (tmp_path / "link").symlink_to("repoA")
    with pytest.raises(LeanAgentError, match=re.escape(fragment)):
        resolve_repositories(Repositories(data_root=str(tmp_path), names=names), tmp_path)
    (tmp_path / "owner" / "repo").mkdir(parents=True)  # owner/repo, as LeanAgent names repositories, is a name
    (tmp_path / "owner" / "repo" / "corpus.jsonl").write_text("")
    assert list(resolve_repositories(Repositories(data_root=str(tmp_path), names=["owner/repo", "repoA"]), tmp_path)) == ["owner/repo", "repoA"]


NO_TRACES = "repository 'bad' has no theorem with traced tactics"


@pytest.mark.parametrize("part, content, fragment", [
    ("val", [], NO_TRACES), ("val", [{"full_name": "t", "traced_tactics": []}], NO_TRACES),
    ("val", [theorem("A.lean", "t", 1, [tactic("s", [("Elsewhere.lean", "p")])])], "none of its 1 tactic states has a premise"),
    ("test", [theorem("A.lean", "t", 1, [tactic("s", [("A.lean", "p")])])], "none of the premises its 1 tactic states name is accessible"),
    ("train", [theorem("A.lean", "t", 1, [tactic("s", [("Elsewhere.lean", "p")])])], "no training examples \\(no traced tactic has a premise"),
    ("train", [{**theorem("A.lean", "t", 1, [tactic("s", [("A.lean", "p")])]), "traced_tactics": [{"tactic": "simp"}]}],
     r"traced_tactics\[0\]"),
], ids=["val-empty", "val-untraced", "val-premises-outside-the-corpus", "test-premise-below-the-theorem",
        "train-premises-outside-the-corpus", "train-malformed-tactic"])
def test_a_repository_without_usable_splits_is_refused_before_any_stage(tmp_path, capsys, part, content, fragment):
    from leanagent.cli import main
    from leanagent.lifelong.runner import LifelongRun
    from leanagent.lifelong.settings import LifelongSettings

    corpus = [{"path": "A.lean", "imports": [], "premises": [premise("p", 1, 2)]}]
    traced = [theorem("A.lean", "t", 5, [tactic("s", [("A.lean", "p")])])]  # p ends above t: accessible
    for name in ("good", "bad"):
        write_dataset(tmp_path / "data" / name, corpus, {"train": traced, "val": traced, "test": traced})
    (tmp_path / "data" / "bad" / "random" / f"{part}.json").write_text(json.dumps(content))
    spec = Repositories(data_root=str(tmp_path / "data"), names=["good", "bad"], bundled=None)
    repos = resolve_repositories(spec, tmp_path)
    assert list(check_splits({"good": repos["good"]}, "random")["good"]["val"]) == traced
    with pytest.raises(LeanAgentError, match=f"bad/random/{part}.json: .*{fragment}"):
        check_splits(repos, "random")
    if "no training examples" in fragment:  # a merge_all stage trains on the earlier repositories' examples too
        assert check_splits(repos, "random", train_alone=False)["bad"]["train"] == content
    out = tmp_path / "out"
    with pytest.raises(LeanAgentError, match=f"bad/random/{part}.json: .*{fragment}"):
        LifelongRun(LifelongSettings(output_dir=str(out), repositories=spec)).run()
    assert not out.exists()  # refused before anything is written
    with pytest.raises(SystemExit) as stopped:  # the curriculum of a run that would be refused is refused too
        main(["curriculum", *config_args(["lifelong.yaml"]), f"--repositories.data_root={tmp_path / 'data'}",
              "--repositories.names=[good, bad]", "--repositories.bundled=null", f"--output_dir={out}"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert stopped.value.code == 2 and len(errors) == 1 and re.search(f"bad/random/{part}.json: .*{fragment}", errors[0]), errors
    assert not out.exists()


LIFELONG_CONFIGS = {"lifelong.yaml": ["lifelong.yaml"], "lifelong_mathlib": ["lifelong.yaml", "recipes/lifelong_mathlib.yaml"]}


@pytest.mark.parametrize("name", list(LIFELONG_CONFIGS))
def test_lifelong_configs_parse(name):
    settings = parse_lifelong(config_args(LIFELONG_CONFIGS[name]))
    assert settings.order == "curriculum" and settings.construction == "single_repo"
    assert settings.ewc.form == "leanagent" and settings.ewc.gamma == 0.0  # LeanAgent's EWC, whether on or off
    from leanagent.lifelong.settings import config_list

    for config in [*config_list(settings.retrieval_config), *config_list(settings.fisher_config)]:
        assert (REPO / config).is_file(), config
    flipped = str(not settings.ewc.enabled).lower()
    variant = parse_lifelong([*config_args(LIFELONG_CONFIGS[name]), "--construction=merge_all", f"--ewc.enabled={flipped}"])
    assert variant.construction == "merge_all" and variant.ewc.enabled is not settings.ewc.enabled
    assert settings_fingerprint(variant) != settings_fingerprint(settings)


def test_mathlib_config_names_the_shared_slices():
    settings = parse_lifelong(config_args(LIFELONG_CONFIGS["lifelong_mathlib"]))
    assert settings.repositories.names == ["mathlib-logic", "mathlib-data-nat", "mathlib-data-list", "mathlib-data-set", "mathlib-group"]


def test_mathlib_config_resolves_against_the_shared_slices():
    settings = parse_lifelong(config_args(LIFELONG_CONFIGS["lifelong_mathlib"]))
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


def _fit_checkpoint(path: Path, finished: bool, best: Path | None = None) -> Path:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    callbacks = {"ModelCheckpoint{}": {"best_model_path": str(best)}} if best else {}
    torch.save({"state_dict": {}, "epoch": 0, "global_step": 3, "callbacks": callbacks,
                "leanagent_fit": {"start_epoch": 0, "start_step": 0, "max_epochs": 1, "finished": finished}}, path)
    return path


def test_a_stage_finds_its_checkpoints_where_the_retrieval_config_writes_them(tmp_path):
    """configs/recipes/mathlib.yaml names its logger retrieval_mathlib, so it writes checkpoints/retrieval_mathlib:
    a stage of that recipe must find its fit's progress (to resume) and its last and best checkpoints there."""
    from leanagent.lifelong.runner import LifelongRun, checkpoint_folder
    from leanagent.lifelong.settings import LifelongSettings

    config = [str(REPO / "configs" / "retrieval.yaml"), str(REPO / "configs" / "recipes" / "mathlib.yaml")]
    assert checkpoint_folder(config) == Path("checkpoints/retrieval_mathlib")
    run = LifelongRun(LifelongSettings(output_dir=str(tmp_path / "out"), retrieval_config=config))
    stage = tmp_path / "out" / "stages" / "00-a"
    folder = stage / "fit" / "checkpoints" / "retrieval_mathlib"
    _fit_checkpoint(folder / "last.ckpt", finished=False)
    assert run._fit_progress(stage) == "interrupted"
    best = _fit_checkpoint(folder / "epoch=0.ckpt", finished=False)
    _fit_checkpoint(folder / "last.ckpt", finished=True, best=best)
    assert run._fit_progress(stage) == "finished"
    assert run._handover_checkpoint(0, stage, None) == stage / "best.ckpt"


def test_a_retrieval_config_without_a_checkpoint_folder_is_refused(tmp_path):
    from leanagent.lifelong.runner import checkpoint_folder

    bare = tmp_path / "bare.yaml"
    bare.write_text("trainer:\n  callbacks:\n    - class_path: pytorch_lightning.callbacks.ModelCheckpoint\n")
    with pytest.raises(LeanAgentError, match="names no ModelCheckpoint callback with a dirpath"):
        checkpoint_folder(bare)
    absolute = tmp_path / "absolute.yaml"
    absolute.write_text("trainer:\n  callbacks:\n    - class_path: leanagent.callbacks.checkpoints.ModelCheckpoint\n"
                        "      init_args: {dirpath: /tmp/x}\n")
    with pytest.raises(LeanAgentError, match="is absolute"):
        checkpoint_folder(absolute)


def test_a_composed_retrieval_config_takes_the_checkpoint_folder_of_its_last_callback_list(tmp_path):
    """configs/recipes/lifelong_mathlib.yaml composes retrieval.yaml with an overlay: the overlay's callbacks, if it
    lists any, replace the base's (as a later --config does), otherwise the base's stand."""
    from leanagent.lifelong.runner import checkpoint_folder

    base = REPO / "configs" / "retrieval.yaml"
    overlay = REPO / "configs" / "recipes" / "project.yaml"
    assert checkpoint_folder([str(base), str(overlay)]) == checkpoint_folder(base) == Path("checkpoints/retrieval")
    own = tmp_path / "own.yaml"
    own.write_text("trainer:\n  callbacks:\n    - class_path: leanagent.callbacks.checkpoints.ModelCheckpoint\n"
                   "      init_args: {dirpath: checkpoints/own}\n")
    assert checkpoint_folder([str(base), str(own)]) == Path("checkpoints/own")
    assert checkpoint_folder([str(own), str(overlay)]) == Path("checkpoints/own")


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"metric_window": 0}, "metric_window must be a positive integer"),
        ({"eval_batch_size": 0}, "eval_batch_size must be a positive integer"),
        ({"epochs_per_repo": 0}, "epochs_per_repo must be a positive integer"),
        ({"eval_precision": "foo"}, "eval_precision must be one of"),
        ({"ewc": {"enabled": True, "ewc_lambda": -1.0}}, "ewc.ewc_lambda must be a finite non-negative number"),
        ({"ewc": {"gamma": float("nan")}}, "ewc.gamma must be a finite non-negative number"),
        ({"ewc": {"enabled": True}, "fisher_config": "nothing.yaml"}, "fisher_config: nothing.yaml is not a file"),
    ],
)
def test_settings_used_after_stages_are_refused_before_the_first(tmp_path, change, fragment):
    """The report's window and the evaluations come after every stage's fit: a bad value must not cost a stage."""
    from dataclasses import replace

    from leanagent.lifelong.runner import LifelongRun
    from leanagent.lifelong.settings import EWCSettings, LifelongSettings

    ewc = EWCSettings(**change.pop("ewc", {}))
    settings = replace(LifelongSettings(output_dir=str(tmp_path / "out"), retrieval_config=str(REPO / "configs" / "retrieval.yaml")),
                       ewc=ewc, **change)
    with pytest.raises(LeanAgentError, match=fragment):
        LifelongRun(settings)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", [{"not": "a list"}, [{"full_name": "t"}], [{"file_path": 5}]], ids=["object", "no-path", "int-path"])
def test_a_malformed_bundled_dataset_is_one_error(tmp_path, content):
    corpus = [{"path": "P/A/x.lean", "imports": [], "premises": []}]
    root = write_dataset(tmp_path / "d", corpus, {"train": [theorem("P/A/x.lean", "a", 1, [])]})
    (root / "random" / "val.json").write_text(json.dumps(content))
    with pytest.raises(LeanAgentError, match=r"d/random/val.json: (expected a JSON list|theorem #0: expected an object with a string 'file_path')"):
        split_bundled(root, tmp_path / "out", min_theorems=1)
    assert not (tmp_path / "out").exists()


def test_a_bundled_dataset_refused_before_stage_0_leaves_no_output_dir(tmp_path):
    """Its repositories are written under output_dir before their splits are checked: a refused new run takes them back."""
    from leanagent.lifelong.runner import LifelongRun
    from leanagent.lifelong.settings import LifelongSettings

    corpus = [{"path": p, "imports": [], "premises": [premise("p", 1, 2)]} for p in ("P/A/x.lean", "P/B/y.lean")]
    traced = lambda path, name: theorem(path, name, 5, [tactic("s", [(path, "p")])])
    root = write_dataset(tmp_path / "d", corpus, {"train": [traced("P/A/x.lean", "a"), traced("P/B/y.lean", "b")],
                                                  "val": [traced("P/A/x.lean", "a2")], "test": [traced("P/A/x.lean", "a3")]})
    out = tmp_path / "results" / "out"
    spec = Repositories(bundled=str(root), min_theorems=1)
    with pytest.raises(LeanAgentError, match="repository 'b' has no theorem with traced tactics in its val split"):
        LifelongRun(LifelongSettings(output_dir=str(out), repositories=spec)).run()
    assert not (tmp_path / "results").exists()


def _two_repositories(root: Path) -> Repositories:
    corpus = [{"path": "A.lean", "imports": [], "premises": [premise("p", 1, 2)]}]
    traced = [theorem("A.lean", "t", 5, [tactic("s", [("A.lean", "p")])])]
    for name in ("one", "two"):
        write_dataset(root / name, corpus, {"train": traced, "val": traced, "test": traced})
    return Repositories(data_root=str(root), names=["one", "two"], bundled=None)


def test_an_import_cycle_across_repositories_is_refused_before_stage_0_of_a_merge_all_run(tmp_path):
    """Each repository alone is fine; merged, B and C import each other. The first merge that saw it was a later
    stage's, after stage 0 had trained and been evaluated (hours into a real run)."""
    from leanagent.lifelong.runner import LifelongRun
    from leanagent.lifelong.settings import LifelongSettings

    traced = lambda path: [theorem(path, f"t-{path}", 5, [tactic("s", [(path, "p")])])]
    for name, (importer, imported) in (("one", ("C.lean", "B.lean")), ("two", ("B.lean", "C.lean"))):
        corpus = [{"path": imported, "imports": [], "premises": [premise("p", 1, 2)]},
                  {"path": importer, "imports": [imported], "premises": [premise("p", 1, 2)]}]
        write_dataset(tmp_path / "data" / name, corpus, {part: traced(importer) for part in ("train", "val", "test")})
    spec = Repositories(data_root=str(tmp_path / "data"), names=["one", "two"], bundled=None)
    out = tmp_path / "out"
    with pytest.raises(LeanAgentError, match=r"corpus\.jsonl:\d+: import cycle in merged corpus: "):
        LifelongRun(LifelongSettings(output_dir=str(out), repositories=spec, order="given", construction="merge_all")).run()
    assert not out.exists()  # no stage ran


@pytest.mark.parametrize(
    "state, fragment",
    [([], "a list, not an object"), ({"order": ["one", "two"]}, "'stages' and 'order' must be lists"),
     ({"order": ["one", "two"], "stages": [{"index": 0, "repository": "one", "checkpoint": "c", "val": {}}]}, "stages[0].test is missing"),
     ({"order": ["one", "two"], "stages": [{"index": 1, "repository": "two", "checkpoint": "c", "test": {"two": {}}, "val": {}}]},
      "stages[0] is not stage 0"),
     ({"order": ["one", "two"], "stages": [], "start_weights": "leanagent-base"}, "'start_weights' must be null or an object"),
     ({"order": ["one", "two"], "stages": [], "data": {"one": ["corpus.jsonl"]}}, "'data' must map each repository")],
    ids=["list", "no-stages", "stage-without-test", "stage-out-of-order", "start-weights-a-name", "data-a-list"],
)
def test_a_damaged_state_json_is_refused_and_kept(tmp_path, state, fragment):
    """A resumed run read state.json's fields only in the report, after the remaining stages (an AttributeError,
    a KeyError); the user's file is left as it was."""
    from leanagent.lifelong.runner import LifelongRun
    from leanagent.lifelong.settings import LifelongSettings

    spec = _two_repositories(tmp_path / "data")
    out = tmp_path / "out"
    out.mkdir()
    (out / "state.json").write_text(json.dumps(state))
    with pytest.raises(LeanAgentError, match=r"state\.json: .*" + fragment.replace("[", r"\[").replace("]", r"\]")):
        LifelongRun(LifelongSettings(output_dir=str(out), repositories=spec, order="given")).run()
    assert json.loads((out / "state.json").read_text()) == state


@pytest.mark.parametrize("setups, fragment", [("[]", "has no setup"),
                                             ('[{"name": "x", "order": "given", "construction": "single_repo", "ewc": false},'
                                              ' {"name": "x", "order": "curriculum", "construction": "single_repo", "ewc": false}]',
                                              "setups: x given more than once"),
                                             ('[{"name": "a/", "order": "given", "construction": "single_repo", "ewc": false}]',
                                              "name 'a/' must be one folder name"),
                                             ('[{"name": "..", "order": "given", "construction": "single_repo", "ewc": false}]',
                                              "name '..' must be one folder name")],
                         ids=["none", "same-name", "a-slash", "parent"])
def test_ablation_setups_are_checked_before_the_first_run(setups, fragment):
    with pytest.raises(LeanAgentError, match=fragment):
        parse_ablation([*config_args(["lifelong_ablation.yaml"]), f"--setups={setups}"])


def test_curriculum_refuses_an_output_dir_it_cannot_write(tmp_path, capsys):
    from leanagent.cli import main

    (tmp_path / "afile").write_text("x")
    with pytest.raises(SystemExit) as stopped:
        main(["curriculum", *config_args(["lifelong.yaml"]), f"--output_dir={tmp_path / 'afile' / 'x'}"])
    assert stopped.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "output_dir" in errors[0] and "not writable" in errors[0], errors


@pytest.mark.parametrize("command", ["curriculum", "lifelong"])
def test_a_split_the_bundled_dataset_lacks_is_named_before_anything_is_written(tmp_path, capsys, command):
    """It used to be found in the first repository's folder that the split had just written."""
    from leanagent.cli import main

    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stopped:
        main([command, *config_args(["lifelong.yaml"]), f"--repositories.bundled={BUNDLED}", f"--output_dir={out}", "--split=nosuch"])
    assert stopped.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: split: {BUNDLED} has no split folder 'nosuch' with a train.json (it has novel_premises, random)"]
    assert not out.exists()


def test_an_owner_slash_repo_name_is_one_stage_folder(tmp_path):
    from leanagent.lifelong.runner import LifelongRun
    from leanagent.lifelong.settings import LifelongSettings

    run = LifelongRun(LifelongSettings(output_dir=str(tmp_path / "out")))
    assert run._stage_dir(1, "owner/repo") == tmp_path / "out" / "stages" / "01-owner-repo"
