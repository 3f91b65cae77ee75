import json
import shutil
from pathlib import Path

import pytest

import leanagent.lifelong.merge as merge_module
from leanagent.errors import LeanAgentError
from leanagent.lifelong.merge import merge_datasets
from tests.conftest import shared_data



def premise(name: str, line: int) -> dict:
    return {
        "full_name": name, "code": f"theorem {name}", "start": [line, 1], "end": [line, 20],
        "kind": "commanddeclaration",
    }  # fmt: skip


def corpus_file(path: str, imports: list[str], premises: list[dict]) -> dict:
    return {"path": path, "imports": imports, "premises": premises}


def thm(file_path: str, name: str, note: str = "") -> dict:
    return {
        "url": "u", "commit": "c", "file_path": file_path, "full_name": name, "start": [1, 1], "end": [2, 1],
        "traced_tactics": [
            {"tactic": f"simp{note}", "annotated_tactic": ["simp", []], "state_before": "s", "state_after": "no goals"}
        ],
    }  # fmt: skip


def write_dataset(root: Path, corpus: list[dict], splits: dict[str, dict[str, list]]) -> Path:
    root.mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    for split, parts in splits.items():
        (root / split).mkdir()
        for part in ("train", "val", "test"):
            (root / split / f"{part}.json").write_text(json.dumps(parts.get(part, [])))
    return root


@pytest.fixture
def sources(tmp_path):
    src = tmp_path / "src"
    a = write_dataset(
        src / "a",
        [
            corpus_file("Init.lean", [], [premise("init1", 1), premise("init2", 5)]),
            corpus_file("A.lean", ["Init.lean"], [premise("a1", 1)]),
        ],
        {"random": {"train": [thm("A.lean", "A1"), thm("A.lean", "Shared")], "val": [thm("A.lean", "A2")],
                    "test": [thm("A.lean", "Leak")]}},
    )  # fmt: skip
    b = write_dataset(
        src / "b",
        [
            # Same path as a's Init.lean, different content: one shared premise, one new.
            corpus_file("Init.lean", [], [premise("init1", 1), premise("init3", 3)]),
            corpus_file("B.lean", ["Init.lean"], [premise("b1", 1)]),
        ],
        {"random": {"train": [thm("A.lean", "Leak"), thm("B.lean", "B1")], "val": [thm("A.lean", "Shared")],
                    "test": [thm("B.lean", "B2")]}},
    )  # fmt: skip
    c = write_dataset(
        src / "c",
        [
            corpus_file("Init.lean", [], [premise("init1", 1), premise("init2", 5)]),
            corpus_file("A.lean", ["Init.lean"], [premise("a1", 1)]),
            corpus_file("C.lean", ["A.lean", "B.lean"], [premise("c1", 1)]),
        ],
        {"random": {"train": [thm("C.lean", "C1"), thm("A.lean", "A1", note="-from-c")]}},
    )
    return [a, b, c]


def names(records: list[dict]) -> list[str]:
    return [r["full_name"] for r in records]


def read_merged(out: Path, split: str = "random") -> tuple[list[dict], dict[str, list[dict]]]:
    corpus = [json.loads(line) for line in (out / "corpus.jsonl").read_text().splitlines()]
    parts = {p: json.loads((out / split / f"{p}.json").read_text()) for p in ("train", "val", "test")}
    return corpus, parts


def test_merge_counts_and_contents(sources, tmp_path):
    out = tmp_path / "merged"
    stats = merge_datasets(sources, out, split="random")
    # files Init, A, B, C; premises init1, init2, init3, a1, b1, c1; only Init.lean differed
    assert (stats.files, stats.premises, stats.merged_files) == (4, 6, 1)
    # 10 theorem records, 7 distinct; Shared (train in a, val in b) and Leak (test in a,
    # train in b) leave train
    assert stats.theorems == {"random": {"train": 3, "val": 2, "test": 2}}
    assert stats.kept_out_of_train == {"random": 2}
    assert stats.repeated_theorems == {"random": 3}

    corpus, parts = read_merged(out)
    assert [f["path"] for f in corpus] == ["Init.lean", "A.lean", "B.lean", "C.lean"]
    init = corpus[0]
    assert names(init["premises"]) == ["init1", "init3", "init2"]  # union, by start line 1, 3, 5
    assert corpus[1] == corpus_file("A.lean", ["Init.lean"], [premise("a1", 1)])

    assert names(parts["train"]) == ["A1", "B1", "C1"]
    assert names(parts["val"]) == ["Shared", "A2"]
    assert names(parts["test"]) == ["Leak", "B2"]
    # the copy from the most recently added source wins
    assert parts["train"][0]["traced_tactics"][0]["tactic"] == "simp-from-c"
    assert sorted(p.name for p in out.iterdir()) == ["corpus.jsonl", "merged_from.json", "random"]


def test_a_file_the_sources_list_differently_is_named_in_one_warning(sources, tmp_path, caplog):
    a, b, c = sources
    with caplog.at_level("WARNING", logger="leanagent"):
        twin = tmp_path / "twin"
        shutil.copytree(a, twin)
        merge_datasets([a, twin], tmp_path / "same", split="random")  # every file shared, alike
    assert "listed differently" not in caplog.text
    with caplog.at_level("WARNING", logger="leanagent"):
        merge_datasets(sources, tmp_path / "merged", split="random")
    warned = [r.getMessage() for r in caplog.records if "listed differently" in r.getMessage()]
    assert warned == [f"merge: 1 file(s) shared by the sources are listed differently by them (e.g. Init.lean in {a} and "
                      f"{b}); each is written as the union of their imports and premises, the first source's premise "
                      "for a name both list"]


def test_the_merge_records_the_sha256_of_every_source_file_it_read(sources, tmp_path):
    import hashlib

    from leanagent.corpus.provenance import merged_from

    (sources[0] / "novel_premises").mkdir(exist_ok=True)  # a split not asked for is not read, so not recorded
    (sources[0] / "novel_premises" / "train.json").write_text("[]")
    merge_datasets(sources, tmp_path / "merged", split="random")
    recorded = merged_from(tmp_path / "merged")
    read = [src / "corpus.jsonl" for src in sources] + [
        src / "random" / f"{part}.json" for src in sources for part in ("train", "val", "test")]
    assert recorded == {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in read if p.is_file()}
    assert merged_from(sources[0]) == {}  # not a merge


def test_no_test_or_val_theorem_of_any_source_is_trained_on(sources, tmp_path):
    merge_datasets(sources, tmp_path / "merged", split="random")
    _, parts = read_merged(tmp_path / "merged")
    key = lambda t: (t["file_path"], t["full_name"])  # noqa: E731
    train = {key(t) for t in parts["train"]}
    held_out = {key(t) for t in parts["val"] + parts["test"]}
    assert not train & held_out
    for src in sources:
        for part in ("val", "test"):
            for t in json.loads((src / "random" / f"{part}.json").read_text()):
                assert key(t) in held_out


def test_import_dag_is_valid_and_topological(tmp_path):
    # The source lists an importer before its import; the merge writes imports first.
    src = write_dataset(
        tmp_path / "s",
        [corpus_file("Z.lean", ["Y.lean"], []), corpus_file("Y.lean", ["X.lean"], []), corpus_file("X.lean", [], [])],
        {"random": {}},
    )
    merge_datasets([src], tmp_path / "out", split="random")
    corpus, _ = read_merged(tmp_path / "out")
    order = [f["path"] for f in corpus]
    assert order == ["X.lean", "Y.lean", "Z.lean"]
    for f in corpus:
        assert all(order.index(i) < order.index(f["path"]) for i in f["imports"])


@pytest.mark.parametrize("damage, message", [
    (lambda t: t.update(file_path="Nowhere.lean"), r"theorem \[0\] 'Leak': its file 'Nowhere.lean' is not in the corpus "
                                                   r"the merged corpus of "),
    (lambda t: t.update(traced_tactics=None), r"theorem \[0\] 'Leak'.*traced_tactics"),
], ids=["file-not-in-corpus", "tactics-null"])
def test_a_theorem_a_fit_would_refuse_is_refused_naming_its_source(sources, tmp_path, damage, message):
    """Only corpus records were checked: the merge wrote it, and the fit named the merged file instead."""
    path = sources[1] / "random" / "train.json"
    theorems = json.loads(path.read_text())
    damage(theorems[0])
    path.write_text(json.dumps(theorems))
    before = leftovers(tmp_path)
    with pytest.raises(LeanAgentError, match=rf"^{path}: {message}"):
        merge_datasets(sources, tmp_path / "out", split="random")
    assert leftovers(tmp_path) == before


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_dangling_import_raises_and_writes_nothing(sources, tmp_path):
    bad = write_dataset(
        tmp_path / "src" / "d",
        [corpus_file("D.lean", ["Init.lean"], []), corpus_file("E.lean", ["Missing.lean"], [])],
        {"random": {}},
    )
    before = leftovers(tmp_path)
    with pytest.raises(LeanAgentError, match=r"d/corpus.jsonl:2: E.lean imports Missing.lean, which is in none"):
        merge_datasets([*sources, bad], tmp_path / "merged", split="random")
    assert leftovers(tmp_path) == before


def test_import_cycle_raises(tmp_path):
    src = write_dataset(
        tmp_path / "s",
        [
            corpus_file("P.lean", ["Q.lean"], []),
            corpus_file("Q.lean", ["R.lean"], []),
            corpus_file("R.lean", ["P.lean"], []),
        ],
        {"random": {}},
    )
    cycle = r"s/corpus.jsonl:3: import cycle .*: P.lean -> Q.lean -> R.lean -> P.lean"
    with pytest.raises(LeanAgentError, match=cycle):
        merge_datasets([src], tmp_path / "out", split="random")
    assert not (tmp_path / "out").exists()


def test_failure_while_writing_leaves_no_out_dir(sources, tmp_path, monkeypatch):
    def broken(path, obj):
        raise OSError("disk full")

    monkeypatch.setattr(merge_module, "write_json", broken)
    with pytest.raises(OSError, match="disk full"):
        merge_datasets(sources, tmp_path / "merged", split="random")
    assert leftovers(tmp_path) == ["src"]
    with pytest.raises(OSError, match="disk full"):  # nor the parent folders it made for it
        merge_datasets(sources, tmp_path / "p1" / "p2" / "merged", split="random")
    assert leftovers(tmp_path) == ["src"]


def test_existing_out_dir(sources, tmp_path):
    out = tmp_path / "merged"
    merge_datasets(sources[:1], out, split="random")
    with pytest.raises(LeanAgentError, match="already exists"):
        merge_datasets(sources, out, split="random")
    assert read_merged(out)[0][-1]["path"] == "A.lean"  # untouched
    merge_datasets(sources, out, split="random", overwrite=True)
    assert read_merged(out)[0][-1]["path"] == "C.lean"
    assert leftovers(tmp_path) == ["merged", "src"]
    with pytest.raises(LeanAgentError, match="is also a source"):
        merge_datasets([out], out, split="random", overwrite=True)


def test_a_merge_killed_between_its_renames_is_put_back_and_its_leftovers_removed(sources, tmp_path):
    """SIGKILL skips the cleanup that an exception gets: the hidden folders it leaves are the next merge's to
    clear, and a previous merge moved aside but not yet replaced goes back to --out."""
    out = tmp_path / "merged"
    merge_datasets(sources[:1], out, split="random")
    aside = tmp_path / ".merged.k1ll3d_x.old"
    aside.mkdir()
    out.rename(aside / "previous")
    (tmp_path / ".merged.h4lfdone.tmp" / "random").mkdir(parents=True)
    (tmp_path / ".merged.x.abcdefgh.tmp").mkdir()  # another output's (`merged.x`): not this merge's to remove
    (tmp_path / ".other.abcdefgh.tmp").mkdir()
    with pytest.raises(LeanAgentError, match="already exists"):
        merge_datasets(sources, out, split="random")
    assert read_merged(out)[0][-1]["path"] == "A.lean"  # the earlier merge, back where it was
    assert leftovers(tmp_path) == [".merged.x.abcdefgh.tmp", ".other.abcdefgh.tmp", "merged", "src"]
    merge_datasets(sources, out, split="random", overwrite=True)
    assert read_merged(out)[0][-1]["path"] == "C.lean"


def test_a_previous_merge_left_aside_while_out_exists_is_removed_not_put_back(sources, tmp_path):
    """A kill after the second rename: --out already holds the new merge, so the aside copy is only leftover."""
    out = tmp_path / "merged"
    merge_datasets(sources, out, split="random")
    (tmp_path / ".merged.k1ll3d_x.old" / "previous").mkdir(parents=True)
    merge_datasets(sources[:1], out, split="random", overwrite=True)
    assert read_merged(out)[0][-1]["path"] == "A.lean" and leftovers(tmp_path) == ["merged", "src"]


def test_merges_into_one_folder_take_turns(sources, tmp_path):
    """Each clears the other's leftovers, so one must not run while another writes beside it."""
    import fcntl
    import os
    import threading

    held = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # as a merge into tmp_path/other would hold it
    done = threading.Event()
    worker = threading.Thread(target=lambda: (merge_datasets(sources, tmp_path / "merged", split="random"), done.set()))
    worker.start()
    assert not done.wait(1.0) and not (tmp_path / "merged").exists()
    os.close(held)
    worker.join(60)
    assert done.is_set() and read_merged(tmp_path / "merged")[0][-1]["path"] == "C.lean"


def test_overwrite_replaces_only_an_earlier_merge(sources, tmp_path, monkeypatch):
    """`--overwrite` must not delete what is not a merge: a folder holding a source (`--out data` for a source
    under data/), a folder without a corpus, the folder the command runs in, or a path under a file."""
    src = tmp_path / "src"
    (src / "notes.txt").write_text("keep")
    with pytest.raises(LeanAgentError, match="contains the source"):
        merge_datasets(sources, src, split="random", overwrite=True)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("keep")
    with pytest.raises(LeanAgentError, match="is not a dataset"):
        merge_datasets(sources, plain, split="random", overwrite=True)
    dataset = tmp_path / "dataset"  # a dataset of its own (not one of the sources): replacing it lost its other files
    shutil.copytree(sources[0], dataset)
    (dataset / "metadata.json").write_text("{}")
    before = sorted(str(p.relative_to(dataset)) for p in dataset.rglob("*"))
    with pytest.raises(LeanAgentError, match="is a dataset but not a merge"):
        merge_datasets(sources, dataset, split="random", overwrite=True)
    assert sorted(str(p.relative_to(dataset)) for p in dataset.rglob("*")) == before
    out = tmp_path / "merged"
    merge_datasets(sources, out, split="random")
    monkeypatch.chdir(out)
    with pytest.raises(LeanAgentError, match="holds the current folder"):
        merge_datasets(sources, Path("."), split="random", overwrite=True)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(LeanAgentError, match=r"afile/out: cannot create it"):
        merge_datasets(sources, tmp_path / "afile" / "out", split="random")
    assert (src / "notes.txt").read_text() == "keep" and all(s.is_dir() for s in sources)
    assert sorted(p.name for p in plain.iterdir()) == ["notes.txt"]
    assert leftovers(tmp_path) == ["afile", "dataset", "merged", "plain", "src"]


def test_split_selection(sources, tmp_path):
    # LeanDojo's two split folders by default; these toy sources only have random/.
    with pytest.raises(LeanAgentError, match=r"split 'novel_premises': source .*/a has no such split folder \(it has random; choose with --split\)"):
        merge_datasets(sources, tmp_path / "merged")
    assert not (tmp_path / "merged").exists()
    with pytest.raises(LeanAgentError, match="split must name"):
        merge_datasets(sources, tmp_path / "merged", split=[])
    stats = merge_datasets(sources, tmp_path / "merged", split=["random"])
    assert list(stats.theorems) == ["random"]


def test_malformed_records_are_named(tmp_path):
    bad_premise = write_dataset(tmp_path / "p", [corpus_file("A.lean", [], [{"full_name": "x"}])], {"random": {}})
    with pytest.raises(LeanAgentError, match=r"p/corpus.jsonl:1: premises\[0\] of A.lean: missing field"):
        merge_datasets([bad_premise], tmp_path / "o1", split="random")
    bad_thm = write_dataset(tmp_path / "t", [corpus_file("A.lean", [], [])], {"random": {"val": [{"full_name": "x"}]}})
    with pytest.raises(LeanAgentError, match=r"t/random/val.json: theorem #0 needs"):
        merge_datasets([bad_thm], tmp_path / "o2", split="random")
    with pytest.raises(LeanAgentError, match="at least one source"):
        merge_datasets([], tmp_path / "o3")


@pytest.mark.parametrize("case", ["no-code", "no-end", "no-full_name", "negative-start", "file-listed-twice"])
def test_a_merge_refuses_what_a_fit_would_refuse(tmp_path, case):
    """Copied into the merge, such a record would fail the fit that reads it, naming the merged file, not the source."""
    from leanagent.corpus.corpus import Corpus

    good = premise("p", 1)
    files = {"no-code": [corpus_file("A.lean", [], [{k: v for k, v in good.items() if k != "code"}])],
             "no-end": [corpus_file("A.lean", [], [{k: v for k, v in good.items() if k != "end"}])],
             "no-full_name": [corpus_file("A.lean", [], [good, {k: v for k, v in good.items() if k != "full_name"}])],
             "negative-start": [corpus_file("A.lean", [], [{**good, "start": [-1, 0]}])],
             "file-listed-twice": [corpus_file("A.lean", [], [good]), corpus_file("A.lean", [], [good])]}[case]
    source = write_dataset(tmp_path / "s", files, {"random": {}})
    with pytest.raises(LeanAgentError, match=r"s/corpus.jsonl:\d"):
        Corpus.from_jsonl(source / "corpus.jsonl")  # what a fit says of the source itself
    with pytest.raises(LeanAgentError, match=r"s/corpus.jsonl:\d"):
        merge_datasets([source], tmp_path / "out", split="random")
    assert not (tmp_path / "out").exists()


def test_merge_two_real_lifelong_slices(tmp_path):
    srcs = [shared_data("lifelong", "mathlib-logic"), shared_data("lifelong", "mathlib-group")]
    stats = merge_datasets(srcs, tmp_path / "merged")
    corpora = [[json.loads(line) for line in (s / "corpus.jsonl").read_text().splitlines()] for s in srcs]
    paths = {f["path"] for c in corpora for f in c}
    premises = {(f["path"], p["full_name"]) for c in corpora for f in c for p in f["premises"]}
    assert stats.files == len(paths)
    assert stats.premises == len(premises)
    for split in ("random", "novel_premises"):
        corpus, parts = read_merged(tmp_path / "merged", split)
        assert len(corpus) == len(paths)
        assert sum(len(f["premises"]) for f in corpus) == len(premises)
        for part in ("train", "val", "test"):
            # theorems of the slices are disjoint, so counts add up
            expected = sum(len(json.loads((s / split / f"{part}.json").read_text())) for s in srcs)
            assert len(parts[part]) == stats.theorems[split][part] == expected
        train = {(t["file_path"], t["full_name"]) for t in parts["train"]}
        assert not train & {(t["file_path"], t["full_name"]) for t in parts["test"] + parts["val"]}


def test_merge_command_writes_the_union_and_reports_errors_in_one_line(sources, tmp_path, capsys):
    from leanagent.cli import main

    out = tmp_path / "merged"
    main(["merge", "--out", str(out), str(sources[0]), str(sources[1]), "--split", "[random]"])
    printed = capsys.readouterr().out
    assert "merged 2 datasets" in printed  # a and b both give Leak and Shared, which leave train (test, val in one)
    assert "random: 2 theorem(s) given more than once (same file_path and full_name) were kept once" in printed
    assert "; 2 of them left train for another source's val or test" in printed
    assert (out / "corpus.jsonl").is_file() and (out / "random" / "train.json").is_file()
    assert not (out / "novel_premises").exists()
    with pytest.raises(SystemExit) as stop:
        main(["merge", "--out", str(out), str(sources[0]), "--split", "random"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "already exists" in err and str(out) in err


@pytest.mark.parametrize("split", [["--split", "random"], ["--split", "[random]"]])
def test_the_merge_command_takes_one_split_name_or_a_list(split, sources, tmp_path):
    from leanagent.cli import main

    out = tmp_path / "merged"
    main(["merge", *map(str, sources), "--out", str(out), *split])  # a parse error would exit 2
    assert sorted(p.name for p in out.iterdir()) == ["corpus.jsonl", "merged_from.json", "random"]  # only the split asked for
    assert read_merged(out)[1]["val"]


def test_an_output_folder_inside_a_source_is_refused(sources, tmp_path):
    """It planted a whole merged dataset where the source's own novel_premises split would go."""
    with pytest.raises(LeanAgentError, match="is inside the source"):
        merge_datasets(sources, sources[1] / "novel_premises", split="random")
    assert not (sources[1] / "novel_premises").exists()


def test_an_output_folder_on_a_symlink_loop_is_one_error(tmp_path):
    from leanagent.errors import LeanAgentError
    from leanagent.lifelong.merge import merge_datasets
    from tests.conftest import BUNDLED

    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(LeanAgentError, match="loop is a symbolic link loop"):
        merge_datasets([BUNDLED], loop, split="random")


def test_premises_every_reader_skips_pass_through_a_merge(tmp_path):
    """Real LeanDojo corpora hold premises that ReProver's loader skips (a null full_name); fit reads such a
    corpus with a warning, so merge takes it too."""
    from leanagent.corpus.corpus import Corpus

    null = {"full_name": None, "code": "x", "start": [9, 1], "end": [9, 2], "kind": "x"}
    a = write_dataset(tmp_path / "a", [corpus_file("A.lean", [], [premise("a1", 1), null]),
                                       corpus_file("B.lean", [], [null])], {"random": {}})
    b = write_dataset(tmp_path / "b", [corpus_file("A.lean", [], [premise("a2", 2), null])], {"random": {}})
    stats = merge_datasets([a, b], tmp_path / "m", split="random")
    corpus, _ = read_merged(tmp_path / "m")
    assert names(corpus[0]["premises"]) == ["a1", "a2"]  # A.lean differs between the sources: rebuilt
    assert corpus[1]["premises"] == [null]  # B.lean is written as it came
    assert stats.premises == 2
    assert sorted(Corpus.from_jsonl(tmp_path / "m" / "corpus.jsonl").names) == ["a1", "a2"]


def test_a_theorem_three_sources_give_counts_once_as_repeated(tmp_path):
    srcs = [tmp_path / n for n in "abc"]
    read = {src / "random" / f"{part}.json": ([thm("A.lean", "T"), thm("A.lean", f"own-{src.name}")] if part == "train" else [])
            for src in srcs for part in ("train", "val", "test")}
    out, moved, repeated = merge_module._merge_split(srcs, "random", read)
    assert repeated == 1 and moved == 0 and len(out["train"]) == 4  # T, own-a, own-b, own-c
