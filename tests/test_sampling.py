import json
from collections import Counter

import numpy as np
import pytest

from leanagent.corpus.corpus import Corpus, position_key
from leanagent.data.negatives import NegativeSampler
from tests.conftest import BUNDLED, toy_corpus


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in toy_corpus()))
    return Corpus.from_jsonl(path)


def pid(corpus, name):
    return corpus.names.index(name)


def test_negatives_are_accessible_distinct_and_never_the_positive(corpus):
    sampler = NegativeSampler(corpus, num_negatives=3, num_in_file=1)
    c, pos = corpus.file_index["C.lean"], position_key([20, 1], "p")
    accessible = set(corpus.accessible_ids(c, pos).tolist())
    positive = pid(corpus, "b2")
    for seed in range(200):
        negatives = sampler.sample(c, pos, positive, np.random.default_rng(seed))
        assert len(negatives) == 3 and (negatives >= 0).all()
        assert len(set(negatives.tolist())) == 3
        assert positive not in negatives
        assert set(negatives.tolist()) <= accessible
        in_file = [n for n in negatives if corpus.premise_file[n] == corpus.file_index["B.lean"]]
        assert len(in_file) == 1  # exactly num_in_file from the positive's file (B has b1, b3 too)


def test_no_negative_is_any_positive_of_the_state(corpus):
    """A state in C at line 40 with positives a1 a2 b1 b2 c1 leaves a3, b3 and c2 as its only negatives."""
    sampler = NegativeSampler(corpus, num_negatives=3, num_in_file=1, num_hard=1)
    c, pos = corpus.file_index["C.lean"], position_key([40, 1], "p")
    positives = [pid(corpus, n) for n in ("a1", "a2", "b1", "b2", "c1")]
    rest = {pid(corpus, n) for n in ("a3", "b3", "c2")}
    pool = np.array([pid(corpus, "a2"), pid(corpus, "b3"), -1])  # a2, another positive, is in the mined pool
    for seed in range(50):
        for positive in positives:
            negatives = sampler.sample(c, pos, positive, np.random.default_rng(seed), pool, positives=positives)
            assert set(negatives.tolist()) == rest, (seed, positive, negatives)
            assert negatives[0] == pid(corpus, "b3")  # the hard one, not the positive a2


def test_every_accessible_candidate_can_be_drawn_uniformly(corpus):
    """Out-of-file draws cover the union of imported ranges and own-file premises, each about equally often."""
    sampler = NegativeSampler(corpus, num_negatives=1, num_in_file=0)
    c, pos = corpus.file_index["C.lean"], position_key([40, 1], "p")
    positive = pid(corpus, "b2")
    counts = Counter(int(sampler.sample(c, pos, positive, np.random.default_rng(s))[0]) for s in range(3000))
    expected = {pid(corpus, n) for n in ("a1", "a2", "a3", "c1", "c2")}  # not B (the positive's file), not D
    assert set(counts) == expected
    assert min(counts.values()) > 3000 / len(expected) * 0.8


def test_too_few_accessible_premises_are_padded_not_fatal(corpus):
    sampler = NegativeSampler(corpus, num_negatives=5, num_in_file=2)
    b, pos = corpus.file_index["B.lean"], position_key([15, 1], "p")  # accessible: a1 a2 a3 b1 b2
    negatives = sampler.sample(b, pos, pid(corpus, "a2"), np.random.default_rng(0))
    real = negatives[negatives >= 0]
    assert len(real) == 4 and (negatives == -1).sum() == 1
    assert set(real.tolist()) == {pid(corpus, n) for n in ("a1", "a3", "b1", "b2")}
    a = corpus.file_index["A.lean"]
    lonely = sampler.sample(a, position_key([3, 1], "p"), pid(corpus, "a1"), np.random.default_rng(0))
    assert lonely.tolist() == [-1] * 5  # before line 3, a1 is the only premise and it is the positive


def test_same_rng_seed_gives_same_negatives(corpus):
    sampler = NegativeSampler(corpus, 3, 1)
    c, pos = corpus.file_index["C.lean"], position_key([20, 1], "p")
    draw = lambda: sampler.sample(c, pos, pid(corpus, "a1"), np.random.default_rng([7, 0, 3])).tolist()
    assert draw() == draw()


def test_on_real_data_negatives_match_the_brute_force_definition():
    corpus = Corpus.from_jsonl(BUNDLED / "corpus.jsonl")
    sampler = NegativeSampler(corpus, num_negatives=3, num_in_file=1)
    theorems = json.loads((BUNDLED / "random" / "val.json").read_text())
    rng = np.random.default_rng(0)
    checked = 0
    for t in theorems[:60]:
        f, pos = corpus.file_index[t["file_path"]], position_key(t["start"], "p")
        accessible = set(corpus.accessible_ids(f, pos).tolist())
        for tac in t["traced_tactics"]:
            for prov in tac["annotated_tactic"][1]:
                positive = corpus.locate(prov["def_path"], prov["full_name"])
                if positive is None:
                    continue
                negatives = sampler.sample(f, pos, positive, rng)
                real = negatives[negatives >= 0].tolist()
                assert set(real) <= accessible and positive not in real
                assert len(real) == min(3, len(accessible - {positive}))
                checked += 1
    assert checked > 20
