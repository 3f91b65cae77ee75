"""The Fisher module against a slow reference, and the Fisher file's checks."""

from __future__ import annotations

import pytorch_lightning as pl
import pytest
import torch

from leanagent.data.datamodule import RetrievalDataModule
from leanagent.errors import LeanAgentError
from leanagent.ewc.fisher_file import load_fisher, save_fisher
from leanagent.models.fisher import FisherInformation
from leanagent.models.loading import load_retriever
from leanagent.models.losses import batch_loss, contrastive_loss
from tests.helpers import per_example_grads


@pytest.fixture
def fisher_module(retriever_checkpoint, tmp_path):
    return FisherInformation(ckpt_path=str(retriever_checkpoint), output_path=str(tmp_path / "f.safetensors"), max_seq_len=64)


@pytest.fixture
def batch(toy_dataset):
    dm = RetrievalDataModule(data_path=str(toy_dataset / "random"), corpus_path=str(toy_dataset / "corpus.jsonl"), max_seq_len=32, num_negatives=2)
    return dm.collate_train([dm.train_pairs[i] for i in range(len(dm.train_pairs))])


def reference_per_example_grads(module: FisherInformation, batch) -> list[dict[str, torch.Tensor]]:
    """One autograd pass per example on its own candidates: slow and obviously right."""
    encoder = module.retriever.encoder
    size = len(batch["index"])
    per = batch["cand_ids"].shape[0] // size
    grads = []
    for i in range(size):
        encoder.zero_grad()
        rows = slice(i * per, (i + 1) * per)
        query = encoder(batch["query_ids"][i : i + 1], batch["query_mask"][i : i + 1])
        candidates = encoder(batch["cand_ids"][rows], batch["cand_mask"][rows])
        loss = contrastive_loss(query @ candidates.T, batch["labels"][i : i + 1, rows], batch["cand_valid"][None, rows])
        loss.backward()
        grads.append({k: p.grad.detach().clone() for k, p in encoder.named_parameters()})
    return grads


def test_per_example_gradients_equal_a_loop(fisher_module, batch):
    fast = per_example_grads(fisher_module, batch)
    slow = reference_per_example_grads(fisher_module, batch)
    for name, stacked in fast.items():
        for i, reference in enumerate(slow):
            torch.testing.assert_close(stacked[i], reference[name], rtol=1e-4, atol=1e-7)


def test_per_example_gradient_does_not_depend_on_the_rest_of_the_batch(fisher_module, batch):
    full = per_example_grads(fisher_module, batch)
    per = batch["cand_ids"].shape[0] // len(batch["index"])
    alone = {
        "index": batch["index"][1:2],
        "query_ids": batch["query_ids"][1:2],
        "query_mask": batch["query_mask"][1:2],
        "cand_ids": batch["cand_ids"][per : 2 * per],
        "cand_mask": batch["cand_mask"][per : 2 * per],
        "cand_valid": batch["cand_valid"][per : 2 * per],
        "labels": batch["labels"][1:2, per : 2 * per],
    }
    single = per_example_grads(fisher_module, alone)
    for name in full:
        torch.testing.assert_close(single[name][0], full[name][1], rtol=1e-5, atol=1e-5 * float(full[name].abs().max()))


def test_leanagent_mode_uses_the_gradient_of_the_in_batch_loss(fisher_module, batch):
    encoder = fisher_module.retriever.encoder
    encoder.zero_grad()
    batch_loss(encoder, batch).backward()
    fast = fisher_module.batch_grads(batch)
    for name, p in encoder.named_parameters():
        torch.testing.assert_close(fast[name], p.grad, rtol=1e-4, atol=1e-7)


def test_fisher_fit_writes_the_mean_squared_per_example_gradient(fisher_module, toy_dataset, tmp_path):
    dm = RetrievalDataModule(data_path=str(toy_dataset / "random"), corpus_path=str(toy_dataset / "corpus.jsonl"), max_seq_len=64, batch_size=3)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(fisher_module, datamodule=dm)
    batch = dm.collate_train([dm.train_pairs[i] for i in range(len(dm.train_pairs))])
    slow = reference_per_example_grads(fisher_module, batch)
    fisher, meta = load_fisher(tmp_path / "f.safetensors", dict(fisher_module.retriever.named_parameters()))
    for name, _ in fisher_module.retriever.encoder.named_parameters():
        expected = torch.stack([g[name] ** 2 for g in slow]).mean(0)
        torch.testing.assert_close(fisher[f"encoder.{name}"], expected, rtol=1e-4, atol=1e-9)
    assert meta["num_examples"] == str(len(dm.train_pairs)) and meta["mode"] == "empirical"


def test_weights_are_never_changed(fisher_module, toy_dataset):
    before = {k: v.clone() for k, v in fisher_module.retriever.state_dict().items()}
    dm = RetrievalDataModule(data_path=str(toy_dataset / "random"), corpus_path=str(toy_dataset / "corpus.jsonl"), max_seq_len=64)
    pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False).fit(fisher_module, datamodule=dm)
    for k, v in fisher_module.retriever.state_dict().items():
        assert torch.equal(v, before[k])


def test_fisher_file_with_other_names_or_shapes_is_refused(tmp_path, retriever_checkpoint):
    model = load_retriever(retriever_checkpoint)
    params = dict(model.named_parameters())
    path = tmp_path / "f.safetensors"
    save_fisher(path, {k: torch.ones_like(v) for k, v in params.items()}, {"mode": "empirical"})
    fisher, meta = load_fisher(path, params)
    assert set(fisher) == set(params) and meta["mode"] == "empirical"
    name = next(iter(params))
    save_fisher(path, {**{k: torch.ones_like(v) for k, v in params.items()}, name: torch.ones(3)}, {})
    with pytest.raises(LeanAgentError, match="has shape"):
        load_fisher(path, params)
    save_fisher(path, {k: torch.ones_like(v) for k, v in list(params.items())[1:]}, {})
    with pytest.raises(LeanAgentError, match="does not match the model: missing"):
        load_fisher(path, params)


def test_missing_or_mismatched_checkpoint(tmp_path, retriever_checkpoint):
    with pytest.raises(LeanAgentError, match="checkpoint not found"):
        load_retriever(tmp_path / "none.ckpt")
    with pytest.raises(LeanAgentError, match="trained with model_name 'byt5-tiny', but model.model_name is 'byt5-mini'"):
        load_retriever(retriever_checkpoint, "byt5-mini")
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(LeanAgentError, match="is not a loadable weights-only checkpoint"):
        load_retriever(junk)


def test_a_preempted_fisher_pass_says_to_rerun_not_to_resume(retriever_checkpoint, toy_dataset, tmp_path):
    """`fit --ckpt_path` refuses a checkpoint without optimizer state, so a stopped Fisher pass must not
    point there: no checkpoint is written and the advice is to run the same command again."""
    from leanagent.callbacks.preemption import Preempted, PreemptionCheckpoint
    from tests.helpers import SignalAtStep

    module = FisherInformation(ckpt_path=str(retriever_checkpoint), output_path=str(tmp_path / "f.safetensors"), max_seq_len=32)
    data = RetrievalDataModule(data_path=str(toy_dataset / "random"), corpus_path=str(toy_dataset / "corpus.jsonl"),
                               max_seq_len=32, batch_size=1, num_hard_negatives=0)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         callbacks=[PreemptionCheckpoint(), SignalAtStep(step=0)])
    with pytest.raises(Preempted) as stopped:
        trainer.fit(module, datamodule=data)
    message = str(stopped.value)
    assert message.startswith("stopped by SIGTERM") and "run the same command again" in message
    assert "--ckpt_path" not in message and not list(tmp_path.glob("*.ckpt"))


def test_a_fisher_pass_at_another_sequence_length_than_its_checkpoints_says_so_once(retriever_checkpoint, tmp_path,
                                                                                     caplog, monkeypatch):
    for name in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    with caplog.at_level("WARNING", logger="leanagent"):
        FisherInformation(ckpt_path=str(retriever_checkpoint), output_path=str(tmp_path / "f.safetensors"), max_seq_len=64)
        assert "max_seq_len" not in caplog.text  # the checkpoint's own length
        monkeypatch.setenv("LOCAL_RANK", "1")  # under DDP, every rank builds the module: rank 0 alone warns
        FisherInformation(ckpt_path=str(retriever_checkpoint), output_path=str(tmp_path / "f.safetensors"), max_seq_len=32)
        assert "max_seq_len" not in caplog.text
        monkeypatch.setenv("LOCAL_RANK", "0")
        FisherInformation(ckpt_path=str(retriever_checkpoint), output_path=str(tmp_path / "f.safetensors"), max_seq_len=32)
    assert "was trained on data.max_seq_len=64; this Fisher pass reads 32 bytes per input" in caplog.text
