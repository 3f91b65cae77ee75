import json

import pytest

from leanagent.corpus.corpus import Corpus
from leanagent.corpus.tactics import TacticStates, load_tactic_states, warn_unresolved
from leanagent.errors import LeanAgentError
from tests.conftest import premise, tactic, theorem, toy_corpus, write_dataset


def test_every_tactic_becomes_a_state_with_its_resolved_positives(toy_dataset):
    corpus = Corpus.from_jsonl(toy_dataset / "corpus.jsonl")
    states = load_tactic_states(toy_dataset / "random" / "train.json", corpus)
    assert len(states) == 3
    assert [sorted(corpus.names[p] for p in ps) for ps in states.positives] == [["a1", "c1"], ["b2"], ["a2"]]
    assert states.unresolved == 1  # Outside.lean/x is skipped and counted, not fatal
    assert states.theorem_names == ["t1", "t1", "t2"] and states.tactic_indices == [0, 1, 0]


def test_theorem_in_a_file_outside_the_corpus_is_an_error(tmp_path):
    root = write_dataset(tmp_path / "d", toy_corpus(), {"train": [theorem("Ghost.lean", "g", 1, [])]})
    corpus = Corpus.from_jsonl(root / "corpus.jsonl")
    with pytest.raises(LeanAgentError, match=r"train\.json: theorem \[0\] 'g': its file 'Ghost\.lean' is not in the corpus"):
        load_tactic_states(root / "random" / "train.json", corpus)


def test_missing_field_is_named(tmp_path):
    bad = theorem("A.lean", "t", 10, [tactic("s", [])])
    del bad["traced_tactics"][0]["state_before"]
    root = write_dataset(tmp_path / "d", toy_corpus(), {"train": [bad]})
    with pytest.raises(LeanAgentError, match=r"traced_tactics\[0\]: missing field 'state_before'"):
        load_tactic_states(root / "random" / "train.json", Corpus.from_jsonl(root / "corpus.jsonl"))


def test_split_file_that_is_not_a_list(tmp_path):
    root = write_dataset(tmp_path / "d", toy_corpus(), {})
    (root / "random" / "train.json").write_text(json.dumps({"theorems": []}))
    with pytest.raises(LeanAgentError, match="expected a JSON list"):
        load_tactic_states(root / "random" / "train.json", Corpus.from_jsonl(root / "corpus.jsonl"))


def test_positives_not_accessible_from_their_theorem_are_kept_and_counted(tmp_path, caplog):
    corpus = toy_corpus()
    corpus[1]["premises"].append({**premise("b_empty", 30, 31), "code": ""})  # skipped by the reader, as ReProver's is
    val = [
        theorem("C.lean", "early", 25, [tactic("s1", [("C.lean", "c2"), ("A.lean", "a1")])]),  # c2 ends at 31, below it
        theorem("D.lean", "alone", 5, [tactic("s2", [("B.lean", "b1")]), tactic("s3", [("B.lean", "b_empty")])]),
    ]
    val[1]["traced_tactics"][1]["annotated_tactic"][1][0]["def_pos"] = [30, 1]  # where b_empty is: no other premise
    root = write_dataset(tmp_path / "d", corpus, {"val": val})
    states = load_tactic_states(root / "random" / "val.json", Corpus.from_jsonl(root / "corpus.jsonl"))
    assert [len(p) for p in states.positives] == [2, 1, 0]  # kept: they count as misses, as in ReProver
    assert (states.unreachable, states.reachable_states) == (2, 1)  # c2 (below the theorem) and b1 (not imported)
    assert (states.skipped, states.unresolved) == (1, 0)  # b_empty is in the corpus file, but skipped
    with caplog.at_level("WARNING", logger="leanagent"):
        warn_unresolved(states, "val.json")
    assert "2 annotated premise(s) are not accessible" in caplog.text
    assert "1 premise annotation(s) that name premises the corpus reader skipped" in caplog.text
    assert "outside the corpus" not in caplog.text


def test_a_theorem_given_twice_in_a_split_is_read_once_and_named(tmp_path, caplog):
    t1 = theorem("C.lean", "t1", 20, [tactic("s1", [("A.lean", "a1")])])
    same_name_elsewhere = theorem("C.lean", "t1", 40, [tactic("s2", [("A.lean", "a2")])])  # another start: kept
    root = write_dataset(tmp_path / "d", toy_corpus(), {"val": [t1, same_name_elsewhere, json.loads(json.dumps(t1))]})
    states = load_tactic_states(root / "random" / "val.json", Corpus.from_jsonl(root / "corpus.jsonl"))
    assert states.states == ["s1", "s2"]
    assert (states.repeated, states.first_repeated) == (1, "theorem [2] 't1' of C.lean")
    predict = TacticStates()  # predict's states are the splits' own, extended into one
    predict.extend(states)
    assert (predict.repeated, predict.first_repeated) == (1, "theorem [2] 't1' of C.lean")
    with caplog.at_level("WARNING", logger="leanagent"):
        warn_unresolved(states, "val.json")
    assert "val.json: read 1 theorem(s) once that the file gives again" in caplog.text
    assert "(first: theorem [2] 't1' of C.lean)" in caplog.text
