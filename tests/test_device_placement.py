"""Device placement without a GPU: every tensor the evaluation path creates must live where its inputs do.

`tests/device_check.OnFakeDevice` marks the model's parameters and the batches Lightning moves to the
device, and fails an op that mixes them with a host tensor of one or more dimensions, as CUDA does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from leanagent.data.datamodule import RetrievalDataModule
from leanagent.models.retriever import PremiseRetriever
from leanagent.retrieval.fusion import HYBRID_GRID, choose_weight
from tests.conftest import premise, tactic, theorem, toy_corpus, write_dataset
from tests.device_check import DeviceMismatch, OnFakeDevice, mark


def test_the_fake_device_refuses_what_cuda_refuses():
    on_device = torch.ones(3)
    mark(on_device)
    with OnFakeDevice():
        assert float((on_device * torch.tensor(2.0)).sum()) == 6.0  # a 0-dim host tensor is allowed, as on CUDA
        assert float((on_device * torch.ones(3, device=on_device.device)).sum()) == 3.0
        with pytest.raises(DeviceMismatch):
            on_device * torch.ones(3)


def _per_example_on_device() -> dict[float, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = (torch.rand(50, 3, generator=g) > 0.5).float() * torch.tensor([100.0, 100.0, 1.0])
    per_example = {w: base.clone() for w in HYBRID_GRID}
    per_example[0.5] = torch.ones(50, 3) * torch.tensor([100.0, 100.0, 1.0])
    for values in per_example.values():
        mark(values)
    return per_example


def test_choose_weight_runs_on_the_device_of_its_inputs():
    per_example = _per_example_on_device()
    with OnFakeDevice():
        assert choose_weight(per_example) == 0.5


def _toy_with_larger_val(toy: Path, tmp_path: Path) -> Path:
    """The toy dataset plus eight validation states whose one accessible premise is their positive: every
    ranking is then equally good, so choosing the weight compares every weight's examples with BM25's."""
    corpus = [*toy_corpus(), {"path": "E.lean", "imports": [], "premises": [premise("e1", 1, 2)]}]
    val = [theorem("E.lean", f"v{i}", 40, [tactic(f"⊢ v{i}", [("E.lean", "e1")])]) for i in range(8)]
    train = json.loads((toy / "random" / "train.json").read_text())
    return write_dataset(tmp_path / "toy-val", corpus, {"train": train, "val": val, "test": val})


def _datamodule(dataset: Path) -> RetrievalDataModule:
    return RetrievalDataModule(data_path=str(dataset / "random"), corpus_path=str(dataset / "corpus.jsonl"),
                               max_seq_len=64, num_hard_negatives=0)


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_the_evaluation_path_keeps_every_tensor_on_the_model_device(toy_dataset, tmp_path, stage):
    pl.seed_everything(0)
    # predict ranks by `retrieval` alone: dense, so that the corpus is embedded there too.
    model = PremiseRetriever(model_name="byt5-tiny", max_seq_len=64, num_retrieved=10,
                             retrieval="dense" if stage == "predict" else "hybrid")
    for tensor in [*model.parameters(), *model.buffers()]:
        mark(tensor)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    # Validation chooses the hybrid weight, which needs a split of more than one state.
    datamodule = _datamodule(_toy_with_larger_val(toy_dataset, tmp_path) if stage == "validate" else toy_dataset)
    with OnFakeDevice():
        if stage == "validate":
            trainer.validate(model, datamodule=datamodule, verbose=False)
        elif stage == "test":
            trainer.test(model, datamodule=datamodule, verbose=False)
        else:
            trainer.predict(model, datamodule=datamodule)
    assert model.corpus_embeddings is not None and getattr(model.corpus_embeddings, "_on_fake_device", False)
