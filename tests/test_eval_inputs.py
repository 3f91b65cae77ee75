"""Evaluation reads text as the checkpoint was trained; predict and its writer do no needless work."""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
import torch

from leanagent.data.datamodule import RetrievalDataModule
from leanagent.models.retriever import PremiseRetriever


def _trainer() -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)


def _datamodule(dataset: Path) -> RetrievalDataModule:
    return RetrievalDataModule(data_path=str(dataset / "random"), corpus_path=str(dataset / "corpus.jsonl"), max_seq_len=64)


def test_lifelong_evaluation_reads_text_as_the_checkpoint_was_trained(retriever_checkpoint, toy_dataset, tmp_path, monkeypatch):
    """A model trained on raw premise code (data.premise_text: code, max_seq_len 48) must be evaluated on raw
    code cut at 48 tokens, not on the defaults' serialized text."""
    import leanagent.lifelong.evaluation as evaluation

    checkpoint = torch.load(retriever_checkpoint, weights_only=True)
    checkpoint["datamodule_hyper_parameters"] = {"premise_text": "code", "max_seq_len": 48, "model_name": "byt5-tiny",
                                                 "data_path": "elsewhere", "eval_batch_size": 7}
    path = tmp_path / "code.ckpt"
    torch.save(checkpoint, path)
    built: list[RetrievalDataModule] = []

    class Recorded(RetrievalDataModule):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(evaluation, "RetrievalDataModule", Recorded)
    evaluation.evaluate_splits(path, {"toy": (toy_dataset / "random", toy_dataset / "corpus.jsonl")}, ("val", "test"),
                               eval_batch_size=16, num_retrieved=10)
    (datamodule,) = built
    assert (datamodule.premise_text, datamodule.max_seq_len, datamodule.eval_batch_size) == ("code", 48, 16)
    assert datamodule.data_path == toy_dataset / "random"


def test_predict_at_hybrid_weight_zero_does_not_embed_the_corpus(toy_dataset, monkeypatch):
    """Hybrid with no weight chosen for this corpus is BM25: embedding every premise would be wasted work."""
    pl.seed_everything(0)
    model = PremiseRetriever(max_seq_len=64, num_retrieved=5, retrieval="hybrid")
    calls: list[int] = []
    original = PremiseRetriever.embed_corpus
    monkeypatch.setattr(PremiseRetriever, "embed_corpus", lambda self: calls.append(1) or original(self))
    predicted = _trainer().predict(model, datamodule=_datamodule(toy_dataset))
    assert calls == [] and model.corpus_embeddings is None
    assert predicted and (predicted[0]["retrieved"][:, 0] >= 0).any()  # BM25 still retrieved premises


def test_the_prediction_writer_gathers_to_rank_zero_only(monkeypatch, tmp_path):
    """Every rank sending every other rank all its predictions costs world_size times the traffic and memory
    that writing them on rank 0 needs."""
    from types import SimpleNamespace

    import leanagent.callbacks.predictions as predictions

    calls: list[tuple] = []

    def gather_object(obj, object_gather_list=None, dst=0):
        calls.append(("gather_object", dst, object_gather_list is not None))
        if object_gather_list is not None:
            object_gather_list[:] = [obj, [(5, [2], [0.5])]]

    fake = SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, gather_object=gather_object,
                           all_gather_object=lambda *a, **k: calls.append(("all_gather_object",)))
    monkeypatch.setattr(predictions, "dist", fake)
    written: list = []
    monkeypatch.setattr(predictions.PremisePredictionWriter, "_write", staticmethod(lambda path, dm, rows: written.append(rows)))
    batch = {"index": torch.tensor([3]), "retrieved": torch.tensor([[1]]), "scores": torch.tensor([[0.9]])}
    writer = predictions.PremisePredictionWriter(output_path=str(tmp_path / "p.jsonl"))
    for rank in (1, 0):
        trainer = SimpleNamespace(world_size=2, global_rank=rank, log_dir=str(tmp_path), datamodule=None)
        writer.write_on_epoch_end(trainer, None, [[batch]], None)
    assert calls == [("gather_object", 0, False), ("gather_object", 0, True)]
    assert written == [[(3, [1], [0.8999999761581421]), (5, [2], [0.5])]]
