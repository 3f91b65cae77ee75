import json

import pytest

from leanagent.corpus.corpus import Corpus
from leanagent.corpus.tactics import load_tactic_states
from leanagent.errors import LeanAgentError
from tests.conftest import tactic, theorem, toy_corpus, write_dataset


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
