import json

import numpy as np
import pytest

from leanagent.corpus.corpus import Corpus, position_key
from leanagent.data.datamodule import RetrievalDataModule
from leanagent.data.hard_negatives import mine_hard_negatives
from leanagent.data.negatives import NegativeSampler
from leanagent.corpus.tactics import TacticStates
from leanagent.errors import LeanAgentError
from leanagent.retrieval.bm25 import BM25Index
from tests.conftest import premise, toy_corpus


def lexical_corpus(tmp_path) -> Corpus:
    """B imports A; premise texts chosen so that BM25's order for a query about `foo bar` is known."""
    records = [
        {"path": "A.lean", "imports": [], "premises": [
            premise("a_foo_bar", 1, 2, "theorem a_foo_bar : foo bar baz"),
            premise("a_foo", 3, 4, "theorem a_foo : foo qux"),
            premise("a_none", 5, 6, "theorem a_none : zzz"),
        ]},
        {"path": "B.lean", "imports": ["A.lean"], "premises": [
            premise("b_foo_bar_early", 1, 2, "theorem b_foo_bar_early : foo bar"),
            premise("b_late", 50, 51, "theorem b_late : foo bar bar bar"),
        ]},
        {"path": "C.lean", "imports": [], "premises": [premise("c_foo_bar", 1, 2, "theorem c_foo_bar : foo bar")]},
    ]
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return Corpus.from_jsonl(path)


def states_of(corpus: Corpus, rows: list[tuple[str, str, int, list[str]]]) -> TacticStates:
    states = TacticStates()
    for text, path, line, positives in rows:
        states.states.append(text)
        states.file_ids.append(corpus.file_index[path])
        states.pos_keys.append(position_key([line, 1], "p"))
        states.positives.append([corpus.names.index(n) for n in positives])
        states.theorem_names.append("t")
        states.tactic_indices.append(0)
    return states


def test_pools_hold_accessible_lexical_matches_best_first_without_any_positive(tmp_path):
    corpus = lexical_corpus(tmp_path)
    # Two tactics share one state: the positive of either is excluded from the shared pool.
    states = states_of(corpus, [("⊢ foo bar", "B.lean", 20, ["a_foo_bar"]), ("⊢ foo bar", "B.lean", 20, ["a_foo"])])
    pools = mine_hard_negatives(BM25Index(corpus), corpus, states, pool=4)
    names = [[corpus.names[i] for i in row if i >= 0] for row in pools]
    # b_late comes after the state (same file, line 50), C is not imported, a_none shares no term.
    assert names[0] == names[1] == ["b_foo_bar_early"]
    assert (pools[:, 1:] == -1).all()


def test_hard_negatives_come_first_and_nothing_repeats(tmp_path):
    corpus = Corpus.from_jsonl(_toy(tmp_path))
    sampler = NegativeSampler(corpus, num_negatives=4, num_in_file=1, num_hard=2)
    c, pos = corpus.file_index["C.lean"], position_key([40, 1], "p")
    ids = {n: corpus.names.index(n) for n in corpus.names}
    pool = np.array([ids["a1"], ids["b3"], ids["b2"], -1])  # b2 is the positive: never drawn
    accessible = set(corpus.accessible_ids(c, pos).tolist())
    seen_hard = set()
    for seed in range(100):
        negatives = sampler.sample(c, pos, ids["b2"], np.random.default_rng(seed), pool)
        assert set(negatives[:2].tolist()) == {ids["a1"], ids["b3"]}
        seen_hard.update(negatives[:2].tolist())
        real = negatives[negatives >= 0].tolist()
        assert len(real) == len(set(real)) == 4 and ids["b2"] not in real and set(real) <= accessible
    without = NegativeSampler(corpus, num_negatives=4, num_in_file=1)
    assert sampler.sample(c, pos, ids["b2"], np.random.default_rng(0), None).tolist() == \
        without.sample(c, pos, ids["b2"], np.random.default_rng(0)).tolist()


def _toy(tmp_path):
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in toy_corpus()))
    return path


def test_datamodule_mixes_mined_negatives_into_training_batches(mini_dataset):
    dm = RetrievalDataModule(
        data_path=str(mini_dataset / "random"), corpus_path=str(mini_dataset / "corpus.jsonl"),
        num_negatives=3, num_in_file_negatives=1, num_hard_negatives=2, hard_negative_pool=8,
    )
    pairs = dm.train_pairs
    assert pairs.hard_pools is not None and pairs.hard_pools.shape == (len(dm.states("train")), 8)
    hits = 0
    for index in range(len(pairs)):
        item = pairs[index]
        pool = pairs.hard_pools[item["state"]]
        hits += int(np.isin(item["negatives"][:2], pool[pool >= 0]).all())
        assert not np.isin(item["negatives"], dm.states("train").positives[item["state"]]).any()
    assert hits >= len(pairs) // 2
    items = [pairs[i] for i in range(4)]
    batch = dm.collate_train(items)
    assert batch["cand_ids"].shape[0] == 4 * 4
    # Query i's own positive is candidate 4 i, and a candidate is labelled 1 exactly when it is one of i's positives.
    candidates = batch["cand_premises"].tolist()
    for i, item in enumerate(items):
        positives = set(dm.states("train").positives[item["state"]])
        expected = [float(c in positives) for c in candidates]
        assert batch["labels"][i].tolist() == expected and expected[4 * i] == 1.0


def test_no_negative_is_another_positive_of_the_same_state(toy_dataset):
    """t1's first state has positives a1 and c1: the pair for a1 draws two negatives outside A from
    b1 b2 b3 c1, so a sampler blind to the state's other positives drew c1 in about half its items."""
    dm = RetrievalDataModule(data_path=str(toy_dataset / "random"), corpus_path=str(toy_dataset / "corpus.jsonl"),
                             num_negatives=3, num_in_file_negatives=1, num_hard_negatives=0, max_seq_len=32)
    pairs, states = dm.train_pairs, dm.states("train")
    several = [i for i in range(len(pairs)) if len(states.positives[pairs[i]["state"]]) > 1]
    assert len(several) >= 2
    drawn = set()
    for epoch in range(20):
        pairs.epoch = epoch
        for index in several:
            item = pairs[index]
            real = item["negatives"][item["negatives"] >= 0].tolist()
            assert not set(real) & set(states.positives[item["state"]]), (epoch, index, real)
            drawn.update(real)
    assert len(drawn) >= 3  # negatives were really drawn, not all padding


@pytest.mark.parametrize("hard, pool, message", [(4, 32, "num_hard_negatives"), (2, 1, "hard_negative_pool")])
def test_bad_hard_negative_settings_are_refused(mini_dataset, hard, pool, message):
    with pytest.raises(LeanAgentError, match=message):
        RetrievalDataModule(
            data_path=str(mini_dataset / "random"), corpus_path=str(mini_dataset / "corpus.jsonl"),
            num_negatives=3, num_hard_negatives=hard, hard_negative_pool=pool,
        )


@pytest.mark.parametrize("cache", ["folder", "off"])
def test_hard_negatives_are_mined_once_per_node_and_read_by_the_other_ranks(mini_dataset, tmp_path, monkeypatch, cache):
    """Every rank used to mine the same pools; with the token cache one process mines, the others load its file."""
    import leanagent.data.hard_negatives as hard_negatives

    monkeypatch.setenv("LEANAGENT_TOKEN_CACHE", str(tmp_path / "cache") if cache == "folder" else "off")
    mined: list[int] = []
    original = hard_negatives.mine_hard_negatives
    monkeypatch.setattr(hard_negatives, "mine_hard_negatives", lambda *a, **k: mined.append(1) or original(*a, **k))

    def pools(**kwargs) -> np.ndarray:
        dm = RetrievalDataModule(data_path=str(mini_dataset / "random"), corpus_path=str(mini_dataset / "corpus.jsonl"),
                                 max_seq_len=32, **kwargs)
        return dm.train_pairs.hard_pools

    first, second = pools(), pools()  # two ranks of a node
    assert np.array_equal(first, second) and (first >= 0).any()
    assert len(mined) == (1 if cache == "folder" else 2)
    assert pools(hard_negative_pool=8).shape[1] == 8  # another pool size is other pools
    assert len(mined) == (2 if cache == "folder" else 3)
    if cache == "folder":
        dm = RetrievalDataModule(data_path=str(mini_dataset / "random"), corpus_path=str(mini_dataset / "corpus.jsonl"), max_seq_len=32)
        assert np.array_equal(first, original(dm.bm25_index, dm.corpus, dm.states("train"), 32))
