import numpy as np
import pytest
import torch

from leanagent.data.datamodule import RetrievalDataModule
from leanagent.data.samplers import UnpaddedDistributedSampler
from leanagent.errors import LeanAgentError
from tests.conftest import tactic, theorem, toy_corpus, write_dataset


def datamodule(root, **kwargs):
    return RetrievalDataModule(data_path=str(root / "random"), corpus_path=str(root / "corpus.jsonl"), max_seq_len=32, **kwargs)


def test_labels_mark_every_positive_of_a_query_not_only_its_own(toy_dataset):
    dm = datamodule(toy_dataset, num_negatives=2, num_in_file_negatives=1)
    pairs = dm.train_pairs
    assert len(pairs) == 4  # t1 tactic 0 has two positives, the others one each
    batch = dm.collate_train([pairs[i] for i in range(len(pairs))])
    corpus = dm.corpus
    candidates = torch.cat([torch.tensor([pairs[i]["positive"]] + pairs[i]["negatives"].tolist()) for i in range(4)])
    for q in range(4):
        state = pairs[q]["state"]
        positives = set(dm.states("train").positives[state])
        for j, c in enumerate(candidates.tolist()):
            assert batch["labels"][q, j].item() == float(c in positives and c >= 0), (q, j, corpus.names[c])
    # Query 0 and 1 share a state with positives {a1, c1}: each one's positive is a positive of the other.
    assert batch["labels"][0, 3] == 1.0 and batch["labels"][1, 0] == 1.0
    assert batch["cand_valid"].tolist() == (candidates >= 0).tolist()
    assert batch["query_ids"].shape[0] == 4 and batch["cand_ids"].shape[0] == 12


def test_negatives_depend_on_seed_epoch_and_index_only(toy_dataset):
    dm = datamodule(toy_dataset)
    first = [dm.train_pairs[i]["negatives"].tolist() for i in range(4)]
    again = [datamodule(toy_dataset).train_pairs[i]["negatives"].tolist() for i in reversed(range(4))][::-1]
    assert first == again

    other_seed = datamodule(toy_dataset, seed=1)
    draws = lambda d: [d.train_pairs[i]["negatives"].tolist() for i in range(4)]
    assert any(draws(datamodule(toy_dataset, seed=s)) != first for s in range(1, 6))
    assert draws(other_seed) == draws(datamodule(toy_dataset, seed=1))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_negatives": 2, "num_in_file_negatives": 3}, r"num_in_file_negatives \(3\) must lie between 0 and data.num_negatives \(2\)"),
        ({"num_negatives": 0}, "num_negatives must be at least 1"),
        ({"batch_size": 0}, "batch_size must be positive"),
        ({"predict_splits": ["dev"]}, "unknown split"),
        ({"predict_splits": ["val", "test", "val"]}, "data.predict_splits: val given more than once"),
    ],
)
def test_inconsistent_settings_are_rejected(toy_dataset, kwargs, message):
    with pytest.raises(LeanAgentError, match=message):
        datamodule(toy_dataset, **kwargs)


def test_missing_paths_are_rejected(tmp_path, toy_dataset):
    with pytest.raises(LeanAgentError, match="data.corpus_path not found"):
        RetrievalDataModule(data_path=str(toy_dataset / "random"), corpus_path=str(tmp_path / "none.jsonl"))
    with pytest.raises(LeanAgentError, match="data.data_path is not a folder"):
        RetrievalDataModule(data_path=str(tmp_path / "none"), corpus_path=str(toy_dataset / "corpus.jsonl"))


def test_missing_split_file(toy_dataset):
    (toy_dataset / "random" / "val.json").unlink()
    with pytest.raises(LeanAgentError, match="val split not found"):
        datamodule(toy_dataset).states("val")


def test_empty_training_split_is_an_error(tmp_path):
    no_premises = [theorem("B.lean", "t", 15, [tactic("s", [])])]
    root = write_dataset(tmp_path / "d", toy_corpus(), {"train": no_premises})
    with pytest.raises(LeanAgentError, match=r"train\.json: no training examples"):
        datamodule(root).train_pairs


def test_eval_batches_carry_all_positives_and_positions(toy_dataset):
    dm = datamodule(toy_dataset)
    batch = next(iter(dm.eval_dataloader("test")))
    assert batch["index"].tolist() == [0, 1]
    assert batch["positives"][0].tolist()[0] == dm.corpus.names.index("b3")
    assert (batch["positives"][1] == -1).all()  # the tactic without premises


@pytest.mark.parametrize("size, world", [(10, 3), (2, 4), (9, 3), (0, 2)])
def test_unpadded_sampler_covers_each_index_exactly_once(size, world):
    dataset = list(range(size))
    shards = [list(UnpaddedDistributedSampler(dataset, num_replicas=world, rank=r)) for r in range(world)]
    assert sorted(i for s in shards for i in s) == list(range(size))
    assert [len(UnpaddedDistributedSampler(dataset, world, r)) for r in range(world)] == [len(s) for s in shards]


def test_byte_tokenizer_matches_byt5_and_truncates_keeping_eos():
    from leanagent.data.token_store import TokenTable
    from leanagent.models.tokenizer import ByteTokenizer

    ids, mask = TokenTable(*ByteTokenizer().encode_ragged(["ab", "é" + "x" * 10], max_len=5)).gather_numpy(np.arange(2))
    lengths = mask.sum(axis=1)
    assert ids[0].tolist() == [ord("a") + 3, ord("b") + 3, 1, 0, 0] and lengths[0] == 3
    assert ids[1].tolist() == [0xC3 + 3, 0xA9 + 3, ord("x") + 3, ord("x") + 3, 1] and lengths[1] == 5


def test_every_rank_gets_an_evaluation_batch_even_when_examples_are_fewer_than_ranks():
    shards = [list(UnpaddedDistributedSampler(list(range(1)), num_replicas=3, rank=r, never_empty=True)) for r in range(3)]
    assert shards == [[0], [0], [0]]  # the duplicates are counted once (results are stored by example index)
    assert [list(UnpaddedDistributedSampler(list(range(5)), 2, r, never_empty=True)) for r in range(2)] == [[0, 2, 4], [1, 3]]
    assert list(UnpaddedDistributedSampler(list(range(1)), num_replicas=2, rank=1)) == []  # the Fisher's exact shards


def test_corpus_embeddings_are_recomputed_when_the_weights_change(toy_dataset):
    from leanagent.models.retriever import PremiseRetriever

    torch.manual_seed(0)
    model = PremiseRetriever(model_name="byt5-tiny", max_seq_len=32)
    other = PremiseRetriever(model_name="byt5-tiny", max_seq_len=32)
    dm = datamodule(toy_dataset)

    class FakeTrainer:
        datamodule = dm
        world_size, global_rank = 1, 0

    model._trainer = FakeTrainer()
    model.all_gather = None
    model._ensure_corpus_embeddings()
    first = model.corpus_embeddings
    model._ensure_corpus_embeddings()
    assert model.corpus_embeddings is first  # same weights, same corpus: reused
    model.load_state_dict(other.state_dict())  # another checkpoint, same global step
    model._ensure_corpus_embeddings()
    assert not torch.allclose(model.corpus_embeddings, first)


def test_fisher_shards_have_equal_length_and_mark_their_padding():
    shards = [list(UnpaddedDistributedSampler(list(range(5)), 2, r, equal_length=True)) for r in range(2)]
    assert shards == [[0, 2, 4], [1, 3, -2]]  # -2 is a copy of item 1, marked as padding
    real = sorted(i for shard in shards for i in shard if i >= 0)
    assert real == [0, 1, 2, 3, 4]


def test_a_padding_copy_is_the_same_item_marked(toy_dataset):
    pairs = datamodule(toy_dataset).train_pairs
    copy = pairs[-1 - 1]
    assert copy["padding"] is True and copy["index"] == 1 and "padding" not in pairs[1]
    assert (copy["negatives"] == pairs[1]["negatives"]).all()


def _served(loader) -> list[tuple[list[int], list[list[int]]]]:
    """Each batch's pair indices and candidate token ids (the negatives drawn for it)."""
    return [(b["index"].tolist(), b["cand_ids"].tolist()) for b in loader]


def test_a_loader_with_workers_serves_the_epoch_set_after_iter_was_called(toy_dataset):
    """Lightning calls iter() on the training loader before set_epoch (and on a resumed epoch never again):
    worker processes must still get that epoch's order, negatives and mid-epoch skip."""
    expected_loader = datamodule(toy_dataset, batch_size=1, num_hard_negatives=0).train_dataloader()
    expected_loader.sampler.set_epoch(3)
    expected_loader.sampler.skip, expected_loader.sampler.skip_epoch = 1, 3
    expected = _served(expected_loader)
    assert len(expected) == 3  # four pairs, one skipped

    loader = datamodule(toy_dataset, batch_size=1, num_hard_negatives=0, num_workers=1).train_dataloader()
    loader.sampler.skip, loader.sampler.skip_epoch = 1, 3
    iterator = iter(loader)  # as Lightning's setup_data does, before the epoch is known
    loader.sampler.set_epoch(3)
    assert [(b["index"].tolist(), b["cand_ids"].tolist()) for b in iterator] == expected


def test_the_training_loader_follows_the_train_order_the_module_asks_for(toy_dataset):
    from types import SimpleNamespace

    from torch.utils.data import DistributedSampler

    from leanagent.data.samplers import EpochShuffledSampler
    from leanagent.models.data_contract import RetrievalData, TrainOrder

    assert RetrievalData in RetrievalDataModule.__mro__ and not RetrievalDataModule.__abstractmethods__  # all implemented

    class Module:
        def __init__(self, order: TrainOrder) -> None:
            self.order = order

        def train_order(self) -> TrainOrder:
            return self.order

    def sampler(order: TrainOrder | None):
        dm = datamodule(toy_dataset, batch_size=2)
        dm.trainer = SimpleNamespace(lightning_module=Module(order) if order else object(), world_size=2, global_rank=1)
        return dm.train_dataloader().sampler, len(dm.train_pairs)

    in_order, size = sampler(TrainOrder("in_order"))
    assert type(in_order) is DistributedSampler and list(in_order)[: size // 2] == list(range(1, size, 2))[: size // 2]
    single, _ = sampler(TrainOrder("single_pass"))
    assert isinstance(single, UnpaddedDistributedSampler) and len(single) == -(-size // 2)  # padded to equal shards
    resumed, _ = sampler(TrainOrder("shuffled", resume=(3, 1)))
    assert isinstance(resumed, EpochShuffledSampler) and (resumed.skip_epoch, resumed.skip) == (3, 2)  # 1 batch of 2 pairs
    default, _ = sampler(None)  # a module that states no order: shuffled from the start
    assert isinstance(default, EpochShuffledSampler) and default.skip == 0


def test_batches_carry_bm25_scores_of_their_candidates_when_the_module_asks(mini_dataset):
    from types import SimpleNamespace

    from leanagent.models.data_contract import TrainOrder
    from leanagent.models.retriever import PremiseRetriever

    class Module:
        def __init__(self, bm25_scores: bool) -> None:
            self.bm25_scores = bm25_scores

        def train_order(self) -> TrainOrder:
            return TrainOrder("shuffled", bm25_scores=self.bm25_scores)

    def first_batch(bm25_scores: bool):
        dm = datamodule(mini_dataset, batch_size=8, num_negatives=2, num_in_file_negatives=1)
        dm.trainer = SimpleNamespace(lightning_module=Module(bm25_scores), world_size=1, global_rank=0)
        return dm, next(iter(dm.train_dataloader()))

    assert PremiseRetriever("byt5-tiny", bm25_distillation=0.5).train_order().bm25_scores  # what the retriever asks
    assert not PremiseRetriever("byt5-tiny").train_order().bm25_scores
    _, plain = first_batch(False)
    assert "bm25" not in plain
    dm, batch = first_batch(True)
    states = dm.states("train")
    texts = [states.states[int(dm.train_pairs.pairs[i][0])] for i in batch["index"].tolist()]
    full = dm.bm25_index.scores(texts)  # every premise; the batch holds the columns of its candidates
    candidates = batch["cand_premises"]
    assert batch["bm25"].shape == (len(texts), len(candidates))
    for j, c in enumerate(candidates.tolist()):
        expected = full[:, c] if c >= 0 else torch.zeros(len(texts))
        assert torch.allclose(batch["bm25"][:, j], expected), (j, c)
    assert (batch["bm25"] > 0).any()  # Batteries' states share identifiers with some premises


def test_a_test_theorem_that_train_also_holds_is_warned_about_once_both_are_read(toy_dataset, caplog):
    import json

    split = toy_dataset / "random"
    train = json.loads((split / "train.json").read_text())
    test = json.loads((split / "test.json").read_text())
    dm = datamodule(toy_dataset)
    dm.states("test"), dm.states("train"), dm.states("val")
    assert "also in train.json" not in caplog.text  # the toy splits share nothing
    (split / "train.json").write_text(json.dumps(train + test))  # a concatenated split: test leaks into train
    with caplog.at_level("WARNING", logger="leanagent"):
        dm = datamodule(toy_dataset)
        dm.states("test")
        assert "also in train.json" not in caplog.text  # train not read yet
        dm.states("train"), dm.states("val")
    assert caplog.text.count("also in train.json") == 1
    assert "1 theorem(s) of test.json are also in train.json (first: 't4' of B.lean)" in caplog.text
