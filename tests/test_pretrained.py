"""Starting from encoder weights: the shipped retriever by name, a weights file or a checkpoint; bad ones refused."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from leanagent.errors import LeanAgentError
from leanagent.models.retriever import PremiseRetriever
from leanagent.pretrained import SHIPPED_DIR, load_encoder, save_encoder, shipped_names
from tests.conftest import REPO, main_job_model_settings, run_cli


def _encoder_state(model: PremiseRetriever) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.encoder_parameters()}


@pytest.fixture
def tiny_weights(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(1)
    source = PremiseRetriever(model_name="byt5-tiny")
    path = tmp_path / "tiny.safetensors"
    save_encoder(path, _encoder_state(source), "byt5-tiny")
    return path, _encoder_state(source)


def test_init_from_a_weights_file_starts_from_exactly_those_weights(tiny_weights):
    path, expected = tiny_weights
    torch.manual_seed(2)  # another random initialisation, which init_from must replace
    model = PremiseRetriever(model_name="byt5-tiny", init_from=str(path))
    for name, tensor in _encoder_state(model).items():
        assert torch.equal(tensor, expected[name]), name
    assert "init_from" not in model.hparams  # a checkpoint's weights, not the start, are what it records


def test_init_from_a_checkpoint(retriever_checkpoint):
    state = torch.load(retriever_checkpoint, weights_only=True)["state_dict"]
    torch.manual_seed(3)
    model = PremiseRetriever(model_name="byt5-tiny", init_from=str(retriever_checkpoint))
    for name, tensor in _encoder_state(model).items():
        assert torch.equal(tensor, state[name]), name


def test_weights_of_another_shape_are_refused(tiny_weights):
    path, _ = tiny_weights
    with pytest.raises(LeanAgentError, match="holds a 'byt5-tiny' encoder, but model.model_name is 'byt5-mini' \(model.init_from=null trains"):
        PremiseRetriever(model_name="byt5-mini", init_from=str(path))
    unnamed = dict(_encoder_state(PremiseRetriever(model_name="byt5-mini")))
    save_encoder(path, unnamed, "byt5-tiny")  # a header that lies about the shape: the shapes still decide
    with pytest.raises(LeanAgentError, match="'byt5-tiny' encoder\\) does not match the model: .*unexpected"):
        PremiseRetriever(model_name="byt5-tiny", init_from=str(path))


def test_damaged_and_foreign_files_are_refused(tiny_weights, tmp_path):
    path, _ = tiny_weights
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(LeanAgentError, match="is not a readable safetensors file"):
        PremiseRetriever(model_name="byt5-tiny", init_from=str(truncated))
    from safetensors.torch import save_file

    foreign = tmp_path / "foreign.safetensors"
    save_file({"x": torch.zeros(2)}, str(foreign))
    with pytest.raises(LeanAgentError, match="not a retriever weights file"):
        PremiseRetriever(model_name="byt5-tiny", init_from=str(foreign))
    with pytest.raises(LeanAgentError, match="'nothing-here' is neither a shipped retriever"):
        PremiseRetriever(model_name="byt5-tiny", init_from="nothing-here")
    from leanagent.io import write_safetensors
    from leanagent.pretrained import WEIGHTS_FORMAT

    integers = tmp_path / "integers.safetensors"  # the right names, shapes and header, but no weights a float cast keeps
    write_safetensors(integers, {n: (t * 100).to(torch.int32) for n, t in _encoder_state(PremiseRetriever(model_name="byt5-tiny")).items()},
                      {"format": WEIGHTS_FORMAT, "model_name": "byt5-tiny"})
    with pytest.raises(LeanAgentError, match="integers.safetensors: '.*' holds int32 values; weights are float16, bfloat16, float32 or float64"):
        PremiseRetriever(model_name="byt5-tiny", init_from=str(integers))


def test_a_shipped_file_damaged_mid_file_is_refused(tmp_path, monkeypatch):
    """Bytes changed inside a tensor keep a valid safetensors file: only the record's SHA-256 tells."""
    import leanagent.pretrained as pretrained

    record = json.loads((SHIPPED_DIR / "leanagent-base.json").read_text())
    (tmp_path / "leanagent-base.json").write_text(json.dumps(record))
    content = bytearray((SHIPPED_DIR / "leanagent-base.safetensors").read_bytes())
    content[-4096:-4032] = b"\x3f" * 64  # inside the last tensor: finite floats, a valid file
    (tmp_path / "leanagent-base.safetensors").write_bytes(bytes(content))
    monkeypatch.setattr(pretrained, "SHIPPED_DIR", tmp_path)
    with pytest.raises(LeanAgentError, match=r"leanagent-base.safetensors is damaged: its SHA-256 is"):
        PremiseRetriever(model_name=record["model_name"], init_from="leanagent-base")


def test_the_shipped_retriever_loads_by_name_offline_and_says_how_it_was_made():
    assert "leanagent-base" in shipped_names()
    record = json.loads((SHIPPED_DIR / "leanagent-base.json").read_text())
    weights = SHIPPED_DIR / "leanagent-base.safetensors"
    assert weights.stat().st_size <= 50 * 1024 * 1024
    import hashlib

    assert hashlib.sha256(weights.read_bytes()).hexdigest() == record["weights_sha256"]
    assert "python main.py fit --config configs/retrieval.yaml --config configs/recipes/pretrain.yaml" in record["command"]
    assert record["data_sha256"]
    import yaml

    # The main job starts from it (and the project recipe, an overlay on it, with it): it names the base's encoder.
    shipped = main_job_model_settings()
    assert shipped["init_from"] == "leanagent-base" and shipped["model_name"] == record["model_name"]
    assert "model_name" not in (yaml.safe_load((REPO / "configs/recipes/project.yaml").read_text())["model"].get("init_args") or {})
    model = PremiseRetriever(model_name=record["model_name"], init_from="leanagent-base")
    tensors = load_encoder("leanagent-base", record["model_name"], dict(model.encoder_parameters()))
    assert all(torch.equal(p, tensors[n]) for n, p in model.encoder_parameters())


def test_a_checkpoint_gives_the_weights_so_the_configs_start_is_not_loaded(toy_dataset, retriever_checkpoint, tmp_path,
                                                                          monkeypatch, capsys):
    """The shipped config starts from leanagent-base (byt5-mini); validating a byt5-tiny checkpoint with it needs only
    model_name, not also init_from=null: with the base loaded as well, the shapes would clash."""
    from leanagent.cli import main

    monkeypatch.chdir(tmp_path)
    main(["validate", "--config", str(REPO / "configs/retrieval.yaml"), "--trainer.accelerator=cpu", "--trainer.devices=1",
          "--trainer.enable_progress_bar=false", f"--data.data_path={toy_dataset / 'random'}",
          f"--data.corpus_path={toy_dataset / 'corpus.jsonl'}", "--data.max_seq_len=32",
          "--model.init_args.model_name=byt5-tiny", f"--ckpt_path={retriever_checkpoint}"])
    assert "Recall@10_val" in capsys.readouterr().out  # it validated, where loading leanagent-base too was an error


@pytest.mark.slow
@pytest.mark.parametrize("case", ["unknown name", "truncated file", "another shape", "not a split folder"])
def test_bad_starting_points_and_project_folders_give_one_error_line_and_write_nothing(case, tiny_weights, tmp_path):
    path, _ = tiny_weights
    args = ["fit", "--config", str(REPO / "configs/retrieval.yaml"), "--trainer.accelerator=cpu", "--trainer.devices=1"]
    if case == "unknown name":
        args += ["--model.init_args.model_name=byt5-tiny", "--model.init_args.init_from=leanagent-nothing"]
    elif case == "truncated file":
        broken = tmp_path / "broken.safetensors"
        broken.write_bytes(path.read_bytes()[:100])
        args += ["--model.init_args.model_name=byt5-tiny", f"--model.init_args.init_from={broken}"]
    elif case == "another shape":  # byt5-tiny weights for the shipped config's byt5-mini
        args.append(f"--model.init_args.init_from={path}")
    else:  # the shipped start (leanagent-base), a dataset folder that is not a split folder
        args += [f"--data.data_path={REPO / 'data/batteries'}", f"--data.corpus_path={REPO / 'data/batteries/corpus.jsonl'}"]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result = run_cli(args, cwd=run_dir)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert {"unknown name": "leanagent-nothing", "truncated file": "broken.safetensors", "another shape": "tiny.safetensors",
            "not a split folder": "its split folders: novel_premises, random"}[case] in errors[0]
    assert list(run_dir.iterdir()) == []  # no logs, no checkpoints


@pytest.mark.slow
def test_the_project_recipe_fine_tunes_the_shipped_retriever_then_tests_it_in_one_command(mini_dataset, tmp_path):
    result = run_cli(["fit", "--config", str(REPO / "configs/retrieval.yaml"), "--config", str(REPO / "configs/recipes/project.yaml"),
                      f"--data.data_path={mini_dataset / 'random'}", f"--data.corpus_path={mini_dataset / 'corpus.jsonl'}",
                      "--trainer.accelerator=cpu", "--trainer.limit_train_batches=2", "--progressive.epochs_per_repo=1",
                      "--trainer.enable_progress_bar=false"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("test results of"))
    assert "checkpoints/retrieval/epoch=0-" in lines[start]  # the best checkpoint, by the dense Recall@10_val
    table = {line[:16].strip(): [float(v) for v in line[16:].split()] for line in lines[start + 2 : start + 5]}
    assert list(table) == ["dense (trained)", "bm25", "hybrid"]
    assert "(chosen on this dataset's validation split)" in lines[start + 5]
    (metrics,) = tmp_path.glob("lightning_logs/retrieval/version_*/metrics.csv")
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("Recall@10_test")]
    assert len(rows) == 1
    assert table["dense (trained)"][1] == pytest.approx(float(rows[0]["Recall@10_test"]), abs=0.05)
    assert table["bm25"][1] == pytest.approx(float(rows[0]["Recall@10_test/bm25"]), abs=0.05)
    assert table["dense (trained)"] != table["bm25"]
