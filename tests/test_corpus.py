import json

import numpy as np
import pytest
import torch

from leanagent.corpus.corpus import Corpus, position_key
from leanagent.errors import LeanAgentError
from tests.conftest import premise, toy_corpus


def load(tmp_path, records):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return Corpus.from_jsonl(path)


def names(corpus, ids):
    return sorted(corpus.names[i] for i in ids)


def test_accessible_premises_follow_imports_transitively_and_positions_in_the_same_file(tmp_path):
    corpus = load(tmp_path, toy_corpus())
    c = corpus.file_index["C.lean"]
    # In C at line 20: all of B and A (transitive), c1 (ends at line 2) but not c2 (line 30), never D.
    assert names(corpus, corpus.accessible_ids(c, position_key([20, 1], "pos"))) == ["a1", "a2", "a3", "b1", "b2", "b3", "c1"]
    b = corpus.file_index["B.lean"]
    assert names(corpus, corpus.accessible_ids(b, position_key([15, 1], "pos"))) == ["a1", "a2", "a3", "b1", "b2"]
    a = corpus.file_index["A.lean"]
    assert names(corpus, corpus.accessible_ids(a, position_key([1, 1], "pos"))) == []


def test_vectorised_mask_equals_the_per_query_rule(tmp_path):
    corpus = load(tmp_path, toy_corpus())
    queries = [(f, position_key([line, 1], "p")) for f in range(corpus.num_files) for line in (1, 4, 11, 25, 40)]
    mask = corpus.accessible_mask(torch.tensor([q[0] for q in queries]), torch.tensor([q[1] for q in queries]))
    for row, (f, pos) in zip(mask, queries):
        assert np.flatnonzero(row.numpy()).tolist() == corpus.accessible_ids(f, pos).tolist()


def test_closure_is_transitive_and_excludes_self(tmp_path):
    corpus = load(tmp_path, toy_corpus())
    idx = corpus.file_index
    assert corpus.closure[idx["C.lean"], idx["A.lean"]]
    assert not corpus.closure[idx["A.lean"], idx["C.lean"]]
    assert not corpus.closure.diagonal().any()
    assert not corpus.closure[:, idx["D.lean"]].any()


def test_locate_by_name_then_by_position(tmp_path):
    corpus = load(tmp_path, toy_corpus())
    assert corpus.names[corpus.locate("B.lean", "b2")] == "b2"
    assert corpus.names[corpus.locate("B.lean", "renamed", [11, 1])] == "b2"
    assert corpus.locate("B.lean", "renamed", [50, 1]) is None
    assert corpus.locate("Nowhere.lean", "b2", [11, 1]) is None


@pytest.mark.parametrize(
    "records, message",
    [
        ([{"path": "A.lean", "imports": ["Missing.lean"], "premises": []}], "imports 'Missing.lean', which is not in the corpus"),
        ([{"path": "A.lean", "imports": ["B.lean"], "premises": []}, {"path": "B.lean", "imports": ["A.lean"], "premises": []}], "import cycle: A.lean -> B.lean -> A.lean"),
        ([{"path": "A.lean", "imports": [], "premises": []}, {"path": "A.lean", "imports": [], "premises": []}], ":2: file 'A.lean' already listed on line 1"),
        ([{"path": "A.lean", "premises": []}], ":1: missing field 'imports'"),
        ([{"path": "", "imports": [], "premises": []}], ":1: field 'path' is empty"),
        ([{"path": "A.lean", "imports": [], "premises": [{"full_name": "x", "code": "theorem x : True", "start": [1, 1]}]}], "premises[0]: missing field 'end'"),
        ([{"path": "A.lean", "imports": [], "premises": [{"full_name": "x", "code": "theorem x : True", "start": [1], "end": [2, 1]}]}], "premises[0].start: expected a position"),
        ([{"path": "A.lean", "imports": [], "premises": [{"full_name": "x", "code": "theorem x : True", "start": [23, 19], "end": [20, 1]}]}], "premises[0].end: [20, 1] is before its start [23, 19]"),
        ([], "the corpus is empty"),
        ([{"path": "A.lean", "imports": [], "premises": []}], "no file of the corpus has a premise"),
        ([{"path": "A.lean", "imports": [], "premises": [{"full_name": "x", "code": "theorem x : True", "start": [2**40, 1], "end": [2**40, 9]}]}], "premises[0].start: line 1099511627776 is out of range"),
    ],
)
def test_bad_corpora_give_one_clear_error(tmp_path, records, message):
    with pytest.raises(LeanAgentError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.").replace("[", r"\[").replace("]", r"\]")):
        load(tmp_path, records)


def test_malformed_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"path": "A.lean", "imports": [], "premises": []}) + "\n{not json\n")
    with pytest.raises(LeanAgentError, match=r"corpus\.jsonl:2: malformed JSON line \(.* at column 2\)$"):
        Corpus.from_jsonl(path)


def test_missing_corpus_file(tmp_path):
    with pytest.raises(LeanAgentError, match="not found"):
        Corpus.from_jsonl(tmp_path / "nope.jsonl")


def test_bundled_corpus_loads_with_consistent_ranges():
    from tests.conftest import BUNDLED

    corpus = Corpus.from_jsonl(BUNDLED / "corpus.jsonl")
    assert len(corpus) == 3139 and corpus.num_files == 192
    lo, hi = corpus.file_ranges.T
    assert (hi - lo).sum() == len(corpus)
    assert all((corpus.premise_file[l:h] == f).all() for f, (l, h) in enumerate(corpus.file_ranges))


def test_premises_reprover_skips_are_skipped_and_counted_in_one_warning(tmp_path, caplog):
    records = [{"path": "A.lean", "imports": [], "premises": [
        premise("a1", 1, 2),
        {"full_name": None, "code": "instance : Foo := x", "start": [3, 1], "end": [3, 9]},
        {"full_name": "_private.user__.n", "code": "x", "start": [4, 1], "end": [4, 9]},
        {"full_name": "[Even, Odd]", "code": "mutual ...", "start": [5, 1], "end": [5, 9]},
        {"full_name": "empty", "code": "", "start": [6, 1], "end": [6, 9]},
        premise("a2", 7, 8),
    ]}]
    with caplog.at_level("WARNING", logger="leanagent"):
        corpus = load(tmp_path, records)
    assert corpus.names == ["a1", "a2"]
    warnings = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(warnings) == 1 and "skipped 4 premise(s)" in warnings[0] and "1 null full_name" in warnings[0]


def test_a_name_twice_in_one_file_is_warned_about(tmp_path, caplog):
    records = [{"path": "A.lean", "imports": [], "premises": [premise("a1", 1, 2), premise("a1", 3, 4), premise("a2", 5, 6)]},
               {"path": "B.lean", "imports": [], "premises": [premise("a1", 1, 2)]}]  # another file's a1 is another premise
    with caplog.at_level("WARNING", logger="leanagent"):
        corpus = load(tmp_path, records)
    assert len(corpus) == 4
    warnings = [r.getMessage() for r in caplog.records if "listed twice" in r.getMessage()]
    assert len(warnings) == 1 and "1 name(s) are listed twice" in warnings[0] and "a1 in A.lean" in warnings[0]
    first, second = corpus.locate("A.lean", "a1", [1, 5]), corpus.locate("A.lean", "a1", [3, 5])
    assert (corpus.start_keys[first], corpus.start_keys[second]) == (position_key([1, 1], ""), position_key([3, 1], ""))
    assert corpus.locate("A.lean", "a1") == second  # without a position: the last, as before
    assert corpus.locate("B.lean", "a1", [1, 5]) == 3 and corpus.locate("A.lean", "a2", [9, 9]) == 2


def test_premises_are_embedded_in_reprovers_serialized_form():
    from leanagent.corpus.corpus import serialize_premise

    assert serialize_premise("Nat.add_comm", "theorem add_comm (n m : ℕ) : n + m = m + n") == (
        "theorem <a>Nat.add_comm</a> (n m : ℕ) : n + m = m + n")
    assert serialize_premise("Foo.bar", "def _root_.Foo.bar := 1") == "def <a>Foo.bar</a> := 1"
    assert serialize_premise("List.«term_~_»", "notation:50 «term_~_» => Perm") == "notation:50 <a>List.«term_~_»</a> => Perm"
    assert serialize_premise("x.y", "no name here") == "no name here"


def test_unreadable_inputs_give_one_error_naming_the_file(tmp_path, monkeypatch):
    bad = tmp_path / "corpus.jsonl"
    bad.write_bytes(b'{"path": "A.lean", "imports": [], "premises": []}\n{"path": "B\xff.lean"}\n')
    with pytest.raises(LeanAgentError, match=r"corpus.jsonl:2: not UTF-8 text"):
        Corpus.from_jsonl(bad)
    with pytest.raises(LeanAgentError, match="is a folder, not a file"):
        Corpus.from_jsonl(tmp_path)
    from leanagent.io import require_file

    with pytest.raises(LeanAgentError, match="data.corpus_path: /dev/null is not a regular file"):
        require_file("/dev/null", "data.corpus_path")
    with pytest.raises(LeanAgentError, match="data.corpus_path not found: "):
        require_file(tmp_path / "missing.jsonl", "data.corpus_path")
    good = tmp_path / "good.jsonl"
    good.write_text('{"path": "A.lean", "imports": [], "premises": []}\n')
    import pathlib

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(pathlib.Path, "open", denied)  # root ignores chmod, so refuse the read itself
    with pytest.raises(LeanAgentError, match=r"good.jsonl: cannot read \(Permission denied\)"):
        Corpus.from_jsonl(good)


def test_import_order_puts_imports_first_and_breaks_ties_by_listing_order():
    from leanagent.corpus.import_order import ImportCycle, imports_first

    assert imports_first({"A": [], "B": ["A"], "C": [], "D": ["B"]}) == ["A", "B", "C", "D"]  # already in order: kept
    assert imports_first({"X": ["Z"], "Y": [], "Z": []}) == ["Y", "Z", "X"]
    with pytest.raises(ImportCycle) as cycle:
        imports_first({"Other": [], "Q": ["R"], "R": ["P"], "P": ["Q"]})
    assert cycle.value.files == ["Q", "R", "P", "Q"]  # from the first listed file of the cycle, each importing the next
