import pytest
import torch
from safetensors.torch import load_file

from leanagent.errors import LeanAgentError
from leanagent.ewc.penalty import EWCPenalty, combine_fisher, load_ewc
from leanagent.ewc.fisher_file import save_fisher, weights_fingerprint
from leanagent.models.loading import load_retriever
from leanagent.models.retriever import PremiseRetriever


def test_penalty_value_and_gradient_by_hand():
    fisher = {"w": torch.tensor([2.0, 0.5]), "b": torch.tensor([4.0])}
    theta_star = {"w": torch.tensor([1.0, -1.0]), "b": torch.tensor([0.0])}
    w = torch.tensor([3.0, 1.0], requires_grad=True)
    b = torch.tensor([0.5], requires_grad=True)
    penalty = EWCPenalty(fisher, theta_star, lam=0.1)({"w": w, "b": b})
    # sum F (theta - theta*)^2 = 2*4 + 0.5*4 + 4*0.25 = 11; paper form: 0.1 / 2 * 11 = 0.55
    assert penalty.item() == pytest.approx(0.55)
    penalty.backward()
    # d/dtheta = lambda * F * (theta - theta*) = 0.1 * [2*2, 0.5*2], 0.1 * [4*0.5]
    assert w.grad.tolist() == pytest.approx([0.4, 0.1]) and b.grad.tolist() == pytest.approx([0.2])
    leanagent = EWCPenalty(fisher, theta_star, lam=0.1, form="leanagent")({"w": w, "b": b})
    assert leanagent.item() == pytest.approx(1.1)


def test_penalty_is_zero_without_lambda_or_change():
    fisher = {"w": torch.rand(5)}
    theta = {"w": torch.randn(5)}
    assert EWCPenalty(fisher, theta, lam=0.0)({"w": torch.randn(5)}).item() == 0.0
    assert EWCPenalty(fisher, theta, lam=3.0)({"w": theta["w"].clone()}).item() == 0.0


def fisher_for(checkpoint, path, value=1.0, embed_theta=False):
    model = load_retriever(checkpoint)
    params = dict(model.named_parameters())
    save_fisher(path, {k: torch.full_like(v, value) for k, v in params.items()}, {
        "mode": "empirical", "source_checkpoint": str(checkpoint), "weights_sha256": weights_fingerprint(params)},
        theta_star=params if embed_theta else None)
    return model


def test_retriever_with_ewc_is_pulled_towards_theta_star(retriever_checkpoint, tmp_path):
    anchor = fisher_for(retriever_checkpoint, tmp_path / "f.safetensors")
    model = PremiseRetriever(model_name="byt5-tiny", fisher_path=str(tmp_path / "f.safetensors"), ewc_lambda=2.0)
    params = dict(model.encoder_parameters())
    expected = sum(((params[k] - v) ** 2).sum() for k, v in anchor.named_parameters())  # F = 1, lambda/2 = 1
    assert model.ewc(params).item() == pytest.approx(expected.item(), rel=1e-5)
    model.load_state_dict(anchor.state_dict())
    assert model.ewc(dict(model.encoder_parameters())).item() == 0.0
    assert not any(k.startswith("ewc.") for k in model.state_dict())  # checkpoints stay loadable without EWC


def test_ewc_tensors_are_not_module_buffers_so_ddp_never_broadcasts_them(retriever_checkpoint, tmp_path):
    fisher_for(retriever_checkpoint, tmp_path / "f.safetensors", embed_theta=True)
    model = PremiseRetriever(model_name="byt5-tiny", fisher_path=str(tmp_path / "f.safetensors"), ewc_lambda=1.0)
    plain = PremiseRetriever(model_name="byt5-tiny")
    assert [name for name, _ in model.named_buffers()] == [name for name, _ in plain.named_buffers()]
    assert model.ewc is not None and len(model.ewc.fisher) == len(list(model.encoder.parameters()))


def test_a_fisher_file_carries_theta_star_so_overwriting_its_checkpoint_changes_nothing(retriever_checkpoint, tmp_path):
    source = tmp_path / "last.ckpt"
    source.write_bytes(retriever_checkpoint.read_bytes())
    anchor = fisher_for(source, tmp_path / "f.safetensors", embed_theta=True)
    first = PremiseRetriever(model_name="byt5-tiny", fisher_path=str(tmp_path / "f.safetensors"), ewc_lambda=1.0)
    penalty = first.ewc(dict(first.encoder_parameters())).item()
    saved = torch.load(source, weights_only=True)
    saved["state_dict"] = {k: v + 1 for k, v in saved["state_dict"].items()}  # what the EWC fit writes over it
    torch.save(saved, source)
    torch.manual_seed(0)
    second = PremiseRetriever(model_name="byt5-tiny", fisher_path=str(tmp_path / "f.safetensors"), ewc_lambda=1.0)
    second.load_state_dict(first.state_dict())
    assert second.ewc(dict(second.encoder_parameters())).item() == pytest.approx(penalty)
    second.load_state_dict(anchor.state_dict())
    assert second.ewc(dict(second.encoder_parameters())).item() == 0.0


@pytest.mark.parametrize("value, message", [(float("nan"), "NaN or infinite"), (-1.0, "negative values")])
def test_a_fisher_that_could_not_be_one_is_refused(retriever_checkpoint, tmp_path, value, message):
    fisher_for(retriever_checkpoint, tmp_path / "f.safetensors", value=value, embed_theta=True)
    with pytest.raises(LeanAgentError, match=message):
        PremiseRetriever(model_name="byt5-tiny", fisher_path=str(tmp_path / "f.safetensors"), ewc_lambda=1.0)


def test_a_fisher_in_a_dtype_without_finite_checks_is_refused_not_a_traceback(retriever_checkpoint, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    fisher_for(retriever_checkpoint, tmp_path / "f.safetensors", embed_theta=True)
    with safe_open(str(tmp_path / "f.safetensors"), framework="pt") as f:
        metadata, tensors = f.metadata(), {name: f.get_tensor(name) for name in f.keys()}
    first = sorted(name for name in tensors if not name.startswith("theta"))[0]
    tensors[first] = tensors[first].to(torch.float8_e4m3fn)
    save_file(tensors, str(tmp_path / "f.safetensors"), metadata=metadata)
    with pytest.raises(LeanAgentError, match=f"Fisher '{first}' holds float8_e4m3fn values"):
        PremiseRetriever(model_name="byt5-tiny", fisher_path=str(tmp_path / "f.safetensors"), ewc_lambda=1.0)


def test_ewc_settings_that_cannot_work_are_refused():
    with pytest.raises(LeanAgentError, match="non-negative"):
        PremiseRetriever(model_name="byt5-tiny", ewc_lambda=-1.0)
    with pytest.raises(LeanAgentError, match="fisher_path is not set"):
        PremiseRetriever(model_name="byt5-tiny", ewc_lambda=0.5)


def test_a_fisher_path_that_is_a_folder_says_so(tmp_path):
    with pytest.raises(LeanAgentError, match=f"Fisher file: {tmp_path} is a folder, not a file"):
        PremiseRetriever(model_name="byt5-tiny", fisher_path=str(tmp_path), ewc_lambda=1.0)


def test_fisher_whose_weights_changed_is_refused(retriever_checkpoint, tmp_path):
    fisher_for(retriever_checkpoint, tmp_path / "f.safetensors")
    checkpoint = torch.load(retriever_checkpoint, weights_only=True)
    name = next(iter(checkpoint["state_dict"]))
    checkpoint["state_dict"][name] = checkpoint["state_dict"][name] + 1
    torch.save(checkpoint, retriever_checkpoint.parent / "moved.ckpt")
    retriever_checkpoint.rename(retriever_checkpoint.parent / "orig.ckpt")
    (retriever_checkpoint.parent / "moved.ckpt").rename(retriever_checkpoint)
    try:
        with pytest.raises(LeanAgentError, match="fingerprint mismatch"):
            load_ewc(tmp_path / "f.safetensors", dict(load_retriever(retriever_checkpoint).named_parameters()), 1.0)
    finally:
        (retriever_checkpoint.parent / "orig.ckpt").replace(retriever_checkpoint)


def test_online_combination(retriever_checkpoint, tmp_path):
    fisher_for(retriever_checkpoint, tmp_path / "old.safetensors", value=2.0)
    fisher_for(retriever_checkpoint, tmp_path / "new.safetensors", value=3.0)
    combine_fisher(tmp_path / "old.safetensors", tmp_path / "new.safetensors", 0.5, tmp_path / "both.safetensors")
    combined = load_file(str(tmp_path / "both.safetensors"))
    assert all(torch.all(t == 0.5 * 2.0 + 3.0) for t in combined.values())


def test_the_warning_that_a_fit_starts_away_from_theta_star_is_printed_once_not_per_rank(retriever_checkpoint, tmp_path):
    import logging
    from types import SimpleNamespace

    fisher_for(retriever_checkpoint, tmp_path / "f.safetensors", embed_theta=True)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("leanagent")
    logger.addHandler(handler)
    try:
        # init_from the Fisher's own checkpoint: at theta*; random weights (or any other start): away from it
        for init_from in (str(retriever_checkpoint), None):
            for rank in (0, 1, 2, 3):  # what each DDP rank runs at the start of the fit
                model = PremiseRetriever(model_name="byt5-tiny", fisher_path=str(tmp_path / "f.safetensors"),
                                         ewc_lambda=1.0, init_from=init_from)
                model._trainer = SimpleNamespace(global_rank=rank)
                model._warn_away_from_theta_star()
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage()[:40] for r in records if "theta*" in r.getMessage()] == [
        "EWC: this fit starts from weights other "]
