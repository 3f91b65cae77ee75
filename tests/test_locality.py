"""The dense ranking's own-file bonus: the mask it applies to, how validation chooses it, where it travels."""

from __future__ import annotations

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from leanagent.corpus.corpus import Corpus, position_key
from leanagent.data.datamodule import RetrievalDataModule
from leanagent.errors import LeanAgentError
from leanagent.models.loading import load_retriever
from leanagent.models.locality import BIAS_GRID, best_bias, combined_by_bias, rescore_with_bias, with_bias
from leanagent.models.retriever import PremiseRetriever
from tests.conftest import write_subset


def test_own_file_mask_is_the_part_of_accessible_in_the_states_own_file(toy_dataset):
    corpus = Corpus.from_jsonl(toy_dataset / "corpus.jsonl")
    file_ids = torch.tensor([corpus.file_index[p] for p in ("A.lean", "B.lean", "C.lean", "C.lean")])
    pos_keys = torch.tensor([position_key([line, 1], "test") for line in (10, 15, 1, 100)])
    own = corpus.own_file_mask(file_ids, pos_keys)
    accessible = corpus.accessible_mask(file_ids, pos_keys)
    assert not (own & ~accessible).any()
    for row, (f, key) in enumerate(zip(file_ids.tolist(), pos_keys.tolist())):
        expected = [i for i in corpus.accessible_ids(f, key) if corpus.premise_file[i] == f]
        assert np.flatnonzero(own[row].numpy()).tolist() == expected
    assert own[1].sum() == 2  # b1 and b2 end above line 15, b3 below it
    assert own[2].sum() == 0  # nothing of C.lean above its first line


def _batch():
    """Two states over six premises; 0-2 are each state's own file. The positive (premise 1) ranks third by cosine."""
    scores = torch.tensor([[0.50, 0.58, 0.55, 0.70, 0.65, 0.10]] * 2)
    own = torch.zeros(2, 6, dtype=torch.bool)
    own[:, :3] = True
    accessible = torch.ones(2, 6, dtype=torch.bool)
    return scores, own, accessible


def test_the_bonus_chosen_is_the_smallest_that_ranks_own_file_positives_first():
    scores, own, accessible = _batch()
    sums, counted = combined_by_bias(scores, own, accessible, torch.tensor([[1], [1]]), num_retrieved=3)
    assert counted == 2
    # Cosine gap to the best other-file premise is 0.12: 0.15 is the first grid value that puts premise 1 first.
    assert best_bias(sums) == 0.15
    # Where the positive lies in another file, any bonus only pushes own-file premises above it: 0.
    sums, _ = combined_by_bias(scores, own, accessible, torch.tensor([[4], [4]]), num_retrieved=3)
    assert best_bias(sums) == 0.0
    assert best_bias(torch.tensor([1.0, float("nan")] + [0.0] * (len(BIAS_GRID) - 2))) == 0.0


def test_with_bias_adds_the_bonus_to_own_file_premises_only_and_rescoring_keeps_it():
    scores, own, _ = _batch()
    biased = with_bias(scores.clone(), own, 0.2)
    assert torch.allclose(biased - scores, own.float() * 0.2)
    # The float32 re-scoring of a bf16 head returns cosines; the bonus is put back and the head re-sorted.
    ids = torch.tensor([[3, 4, 1, 2, 0, 5]] * 2)

    def rescore(i, s):
        return i, scores.gather(1, i)

    new_ids, new_scores = rescore_with_bias(rescore, own, 0.2, ids, scores.gather(1, ids))
    assert new_ids[0].tolist() == [1, 2, 3, 0, 4, 5]
    assert torch.all(new_scores[:, :-1] >= new_scores[:, 1:])


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    files = ("Batteries/Data/UnionFind/Basic.lean", "Batteries/Data/UnionFind/Lemmas.lean")
    return write_subset(tmp_path_factory.mktemp("locality") / "unionfind", n_train=8, n_eval=8, files=files)


def _trainer() -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)


def _datamodule(dataset) -> RetrievalDataModule:
    return RetrievalDataModule(data_path=str(dataset / "random"), corpus_path=str(dataset / "corpus.jsonl"), max_seq_len=64)


def test_validation_chooses_the_bonus_the_dense_ranking_uses_and_checkpoints_carry_it(small, tmp_path):
    pl.seed_everything(0)
    model = PremiseRetriever(max_seq_len=64, num_retrieved=20)
    trainer = _trainer()
    logged = trainer.validate(model, datamodule=_datamodule(small), verbose=False)[0]
    assert model.locality_bias in BIAS_GRID and logged["locality_bias_val"] == pytest.approx(model.locality_bias)
    combined = lambda log: log["Recall@1_val"] + log["Recall@10_val"] + 100 * log["MRR_val"]
    # The same weights without the bonus (locality off keeps the model's own, 0) rank no better on val.
    plain = PremiseRetriever(max_seq_len=64, num_retrieved=20, locality=False)
    plain.load_state_dict(model.state_dict())
    logged_plain = trainer.validate(plain, datamodule=_datamodule(small), verbose=False)[0]
    assert plain.locality_bias == 0.0 and logged_plain["locality_bias_val"] == 0.0
    assert combined(logged) >= combined(logged_plain)
    # test uses the model's bonus as it is: set by hand, it moves the plain (dense) metrics and not BM25's;
    # with locality off it is kept but not used.
    model.locality_bias = plain.locality_bias = 0.35
    tested = trainer.test(model, datamodule=_datamodule(small), verbose=False)[0]
    tested_plain = trainer.test(plain, datamodule=_datamodule(small), verbose=False)[0]
    assert tested["locality_bias_test"] == pytest.approx(0.35) and tested_plain["locality_bias_test"] == 0.0
    assert tested["Recall@10_test/bm25"] == tested_plain["Recall@10_test/bm25"]
    test_combined = lambda log: log["Recall@1_test"] + log["Recall@10_test"] + 100 * log["MRR_test"]
    assert test_combined(tested) != test_combined(tested_plain)

    model.locality_bias = 0.35  # a value validation never chooses here, so the round trip is observable
    path = tmp_path / "biased.ckpt"
    trainer.save_checkpoint(path)
    assert torch.load(path, weights_only=True)["locality_bias"] == 0.35
    assert load_retriever(path).locality_bias == 0.35
    # test uses the stored bonus, and does not choose another.
    restored = load_retriever(path)
    retested = trainer.test(restored, datamodule=_datamodule(small), verbose=False)[0]
    assert restored.locality_bias == 0.35 and retested["Recall@10_test"] == tested["Recall@10_test"]
    checkpoint = torch.load(path, weights_only=True)
    del checkpoint["locality_bias"]
    torch.save(checkpoint, tmp_path / "older.ckpt")
    assert load_retriever(tmp_path / "older.ckpt").locality_bias == 0.0
    checkpoint["locality_bias"] = "high"
    torch.save(checkpoint, tmp_path / "bad.ckpt")
    with pytest.raises(LeanAgentError, match=r"bad\.ckpt.*'locality_bias' must be a finite number"):
        load_retriever(tmp_path / "bad.ckpt")


def test_a_large_bonus_puts_every_own_file_premise_first_in_what_predict_writes(small):
    pl.seed_everything(0)
    model = PremiseRetriever(max_seq_len=64, num_retrieved=20, retrieval="dense")
    model.locality_bias = 10.0
    datamodule = _datamodule(small)
    trainer = _trainer()
    predicted = trainer.predict(model, datamodule=datamodule)
    batch = next(iter(datamodule.predict_dataloader()))
    own = datamodule.corpus.own_file_mask(batch["file_ids"], batch["pos_keys"])
    retrieved = predicted[0]["retrieved"][: len(own)]
    checked = 0
    for row in range(len(own)):
        n = int(own[row].sum())
        if n:
            assert own[row, retrieved[row, :n]].all() and not own[row, retrieved[row, n:].clamp(min=0)][retrieved[row, n:] >= 0].any()
            checked += 1
    assert checked
