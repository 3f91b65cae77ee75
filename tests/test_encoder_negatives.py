"""Hard negatives mined by the encoder a fit starts from (`data.hard_negatives_by: encoder`)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from leanagent.data.datamodule import RetrievalDataModule
from leanagent.errors import LeanAgentError
from leanagent.models.retriever import PremiseRetriever
from leanagent.models.tokenizer import ByteTokenizer

SEQ = 32


def _data(dataset, by: str = "encoder", **kwargs) -> RetrievalDataModule:
    return RetrievalDataModule(
        data_path=str(dataset / "random"), corpus_path=str(dataset / "corpus.jsonl"), model_name="byt5-tiny",
        max_seq_len=SEQ, batch_size=4, num_negatives=2, num_in_file_negatives=0, num_hard_negatives=1,
        hard_negative_pool=4, hard_negatives_by=by, **kwargs,
    )


def _fit(model: PremiseRetriever, data: RetrievalDataModule, folder, ckpt_path=None, max_epochs: int = 1) -> pl.Trainer:
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=max_epochs, limit_train_batches=2, limit_val_batches=0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=folder,
    )
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    return trainer


def _embed(encoder: torch.nn.Module, texts: list[str]) -> torch.Tensor:
    tokens, offsets = ByteTokenizer().encode_ragged(texts, SEQ)
    rows = [torch.from_numpy(tokens[a:b].astype(np.int64)) for a, b in zip(offsets[:-1], offsets[1:])]
    ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    mask = (ids != 0).long()
    with torch.no_grad():
        return encoder(ids, mask)


def _model(seed: int = 0) -> PremiseRetriever:
    pl.seed_everything(seed)
    return PremiseRetriever(model_name="byt5-tiny", max_seq_len=SEQ, loss="infonce", lr=5e-2, warmup_steps=0)


def test_pools_are_the_start_encoders_nearest_accessible_non_positives(mini_dataset, tmp_path, monkeypatch):
    """Each state's pool is its top accessible premises by the cosine of the weights the fit started from
    (computed here by the bare encoder, without the module's length-sorted chunks), its positives left out."""
    monkeypatch.setenv("LEANAGENT_TOKEN_CACHE", "off")
    model = _model()
    start = copy.deepcopy(model.encoder).eval()
    data = _data(mini_dataset)
    _fit(model, data, tmp_path)
    assert any(not torch.equal(a, b) for a, b in zip(start.parameters(), model.encoder.parameters()))  # it trained

    pools = data.train_pairs.hard_pools
    corpus, states = data.corpus, data.states("train")
    scores = _embed(start, states.states) @ _embed(start, corpus.premise_texts("serialized")).T
    allowed = corpus.accessible_mask(torch.tensor(states.file_ids), torch.tensor(states.pos_keys))
    same = {}  # tactics that share a state share its exclusions (every one's positives)
    for row, key in enumerate(zip(states.states, states.file_ids, states.pos_keys)):
        same.setdefault(key, set()).update(states.positives[row])
    for row, key in enumerate(zip(states.states, states.file_ids, states.pos_keys)):
        allowed[row, list(same[key])] = False
        expected = scores[row].masked_fill(~allowed[row], float("-inf")).topk(4).indices
        expected = set(expected[torch.isfinite(scores[row, expected]) & allowed[row, expected]].tolist())
        assert set(pools[row][pools[row] >= 0].tolist()) == expected, row
    bm25 = _data(mini_dataset, by="bm25").train_pairs.hard_pools
    assert not np.array_equal(pools, bm25)  # another ranker, other pools


@pytest.mark.slow
def test_a_resumed_fit_mines_with_the_start_weights_not_the_checkpoints(mini_dataset, tmp_path, monkeypatch):
    """Lightning restores `--ckpt_path` after `setup`: the resumed fit mines what the first run mined,
    although the checkpoint's weights rank differently."""
    monkeypatch.setenv("LEANAGENT_TOKEN_CACHE", "off")
    first = _data(mini_dataset)
    trainer = _fit(_model(), first, tmp_path)
    ckpt = tmp_path / "after-one-epoch.ckpt"
    trainer.save_checkpoint(ckpt)
    trained = PremiseRetriever.load_from_checkpoint(ckpt)
    from_trained = _data(mini_dataset)
    _fit(trained, from_trained, tmp_path / "b", max_epochs=2)
    resumed = _data(mini_dataset)
    _fit(_model(), resumed, tmp_path / "c", ckpt_path=str(ckpt), max_epochs=2)
    assert not np.array_equal(first.train_pairs.hard_pools, from_trained.train_pairs.hard_pools)
    assert np.array_equal(first.train_pairs.hard_pools, resumed.train_pairs.hard_pools)


def test_a_train_split_without_examples_fails_before_the_corpus_is_embedded(mini_dataset, tmp_path, monkeypatch):
    import json
    import shutil

    dataset = shutil.copytree(mini_dataset, tmp_path / "d")  # the fixture is shared: change a copy
    train = dataset / "random" / "train.json"
    theorems = json.loads(train.read_text())
    for theorem in theorems:
        for tactic in theorem["traced_tactics"]:
            tactic["annotated_tactic"][1] = []  # no premise to learn from
    train.write_text(json.dumps(theorems))
    model, embedded = _model(), []
    monkeypatch.setattr(model, "embed_corpus", lambda: embedded.append(1))
    with pytest.raises(LeanAgentError, match=r"train\.json: no training examples"):
        _fit(model, _data(dataset), tmp_path)
    assert not embedded


def test_encoder_negatives_need_a_module_that_mines_them(mini_dataset):
    with pytest.raises(LeanAgentError, match="hard_negatives_by is 'encoder'.*bm25"):
        _data(mini_dataset).train_pairs
    with pytest.raises(LeanAgentError, match="data.hard_negatives_by must be"):
        _data(mini_dataset, by="dense")



def test_a_fit_of_another_module_with_encoder_negatives_is_refused_before_it_starts():
    from jsonargparse import Namespace

    from leanagent.models.encoder_negatives import check_miner

    wants = Namespace(hard_negatives_by="encoder", num_hard_negatives=2)
    with pytest.raises(LeanAgentError, match="needs model.class_path .*PremiseRetriever.*FisherInformation"):
        check_miner("leanagent.models.fisher.FisherInformation", wants)
    check_miner("leanagent.models.retriever.PremiseRetriever", wants)
    check_miner("leanagent.models.fisher.FisherInformation", Namespace(hard_negatives_by="bm25", num_hard_negatives=2))
    check_miner("leanagent.models.fisher.FisherInformation", Namespace(hard_negatives_by="encoder", num_hard_negatives=0))


@pytest.mark.slow
def test_two_gloo_ranks_embed_the_corpus_together_and_one_of_them_mines(mini_dataset, tmp_path, monkeypatch):
    """Mining runs in `setup`: both ranks embed their share of the corpus (a collective), then one process of
    the node scores the states under the cache lock and the other reads its pools."""
    from tests.conftest import run_cli, small_fit_args

    cache = tmp_path / "cache"
    monkeypatch.setenv("LEANAGENT_TOKEN_CACHE", str(cache))
    result = run_cli(small_fit_args(mini_dataset, devices=2) + [
        "--data.hard_negatives_by=encoder", "--progressive.epochs_per_repo=1", "--trainer.limit_train_batches=2",
    ], cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("hard negatives: encoder pools of 32 mined") == 1, result.stderr[-3000:]
    assert len(list(cache.glob("*.hard-negatives.npy"))) == 1
