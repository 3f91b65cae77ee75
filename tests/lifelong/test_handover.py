"""fine_tuned_share: what a stage hands over is pulled back toward the weights it started from."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from leanagent.errors import LeanAgentError
from leanagent.lifelong.runner import LifelongRun
from leanagent.lifelong.settings import EWCSettings, LifelongSettings, check_settings, settings_fingerprint

FIT = {"start_epoch": 0, "start_step": 0, "max_epochs": 1, "finished": False}


def _checkpoint(path: Path, seed: int, model_name: str = "byt5-tiny", **extra) -> dict[str, torch.Tensor]:
    from leanagent.models.retriever import PremiseRetriever

    torch.manual_seed(seed)
    state = PremiseRetriever(model_name=model_name).state_dict()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": state, "hyper_parameters": {"model_name": model_name}, "epoch": 0, "global_step": 3,
                "leanagent_fit": FIT, **extra}, path)
    return state


def _stage(tmp_path: Path, share: float) -> tuple[LifelongRun, Path, dict, dict, Path]:
    run = LifelongRun(LifelongSettings(output_dir=str(tmp_path / "out"), fine_tuned_share=share))
    stage = tmp_path / "out" / "stages" / "01-b"
    folder = stage / "fit" / run.checkpoints
    start = tmp_path / "out" / "stages" / "00-a" / "best.ckpt"
    began = _checkpoint(start, seed=0)
    tuned = _checkpoint(folder / "epoch=0.ckpt", seed=1)
    _checkpoint(folder / "last.ckpt", seed=2, callbacks={"ModelCheckpoint{}": {"best_model_path": str(folder / "epoch=0.ckpt")}})
    return run, stage, began, tuned, start


@pytest.mark.parametrize("share", [0.5, 0.7])
def test_a_stage_hands_over_its_best_weights_pulled_back_toward_its_start(tmp_path, share):
    run, stage, began, tuned, start = _stage(tmp_path, share)
    handover = run._handover_checkpoint(1, stage, str(start))
    assert handover == stage / "best.ckpt"
    saved = torch.load(handover, weights_only=True)
    assert saved["leanagent_fit"]["finished"] is True
    encoder = [name for name in tuned if name.startswith("encoder.")]
    assert encoder and set(saved["state_dict"]) == set(tuned)
    for name in encoder:
        torch.testing.assert_close(saved["state_dict"][name], share * tuned[name] + (1 - share) * began[name])
    assert not torch.equal(saved["state_dict"][encoder[0]], tuned[encoder[0]])


def test_share_one_hands_over_the_fine_tuned_weights_unchanged(tmp_path):
    run, stage, _, tuned, start = _stage(tmp_path, 1.0)
    saved = torch.load(run._handover_checkpoint(1, stage, str(start)), weights_only=True)["state_dict"]
    assert all(torch.equal(saved[name], tuned[name]) for name in tuned)


def test_a_start_of_another_shape_is_refused_and_nothing_is_handed_over(tmp_path):
    run, stage, _, _, _ = _stage(tmp_path, 0.5)
    other = tmp_path / "other.ckpt"
    _checkpoint(other, seed=0, model_name="byt5-mini")
    with pytest.raises(LeanAgentError, match="byt5-mini"):
        run._handover_checkpoint(1, stage, str(other))
    assert not (stage / "best.ckpt").exists()


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5, float("nan"), True])
def test_a_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(LeanAgentError, match="fine_tuned_share"):
        check_settings(LifelongSettings(fine_tuned_share=share))


def test_the_share_makes_another_run():
    assert settings_fingerprint(LifelongSettings(fine_tuned_share=0.7)) != settings_fingerprint(LifelongSettings())


def test_ewc_settings_make_another_run_only_when_ewc_is_on():
    def fingerprint(**ewc) -> str:
        return settings_fingerprint(LifelongSettings(ewc=EWCSettings(**ewc)))

    assert fingerprint(enabled=False, ewc_lambda=1000.0, gamma=1.0) == fingerprint(enabled=False) == fingerprint()
    assert fingerprint(enabled=True, ewc_lambda=1000.0) != fingerprint(enabled=True)
    assert fingerprint(enabled=True) != fingerprint(enabled=False)


def test_a_best_checkpoint_is_found_beside_last_after_a_move_and_a_missing_one_is_refused(tmp_path):
    """Lightning records the best path as absolute: an output_dir moved since finds it by name; one deleted
    is refused rather than handing over last.ckpt, whose weights the uninterrupted run did not hand over."""
    run, stage, _, tuned, start = _stage(tmp_path, 1.0)
    folder = stage / "fit" / run.checkpoints
    _checkpoint(folder / "last.ckpt", seed=2, callbacks={"ModelCheckpoint{}": {"best_model_path": "/gone/out/epoch=0.ckpt"}})
    saved = torch.load(run._handover_checkpoint(1, stage, str(start)), weights_only=True)["state_dict"]
    assert all(torch.equal(saved[name], tuned[name]) for name in tuned)
    (folder / "epoch=0.ckpt").unlink()
    (stage / "best.ckpt").unlink()
    with pytest.raises(LeanAgentError, match=r"stage 1: its best checkpoint /gone/out/epoch=0.ckpt, .* is missing"):
        run._handover_checkpoint(1, stage, str(start))
    assert not (stage / "best.ckpt").exists()
