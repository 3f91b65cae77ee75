"""`python -m leanagent.pretrained.export`: a fit's checkpoint becomes weights a config can start from; bad input is one line."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from leanagent.models.retriever import PremiseRetriever
from leanagent.pretrained import export


def run_export(monkeypatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["export", *args])
    export.main()


def test_an_exported_checkpoint_is_what_init_from_loads(monkeypatch, tmp_path, retriever_checkpoint, capsys):
    run_export(monkeypatch, str(retriever_checkpoint), "--name", "mine", "--command", "python main.py fit", "--out-dir", str(tmp_path / "out"))
    assert "wrote" in capsys.readouterr().out
    record = json.loads((tmp_path / "out" / "mine.json").read_text())
    assert record["model_name"] == "byt5-tiny" and record["command"] == "python main.py fit"
    state = torch.load(retriever_checkpoint, weights_only=True)["state_dict"]
    model = PremiseRetriever(model_name="byt5-tiny", init_from=str(tmp_path / "out" / "mine.safetensors"))
    for name, tensor in model.encoder_parameters():
        assert torch.equal(tensor.detach(), state[name]), name
    assert record["parameters"] == sum(t.numel() for _, t in model.encoder_parameters())


def test_exports_of_one_checkpoint_are_the_same_bytes(monkeypatch, tmp_path, retriever_checkpoint):
    """The record names the weights by SHA-256, so re-exporting a checkpoint must reproduce the file: safetensors
    alone writes its metadata in an order that changes from call to call."""
    import hashlib
    import struct

    files = []
    for i in range(8):
        run_export(monkeypatch, str(retriever_checkpoint), "--command", "x", "--out-dir", str(tmp_path / f"out{i}"))
        files.append((tmp_path / f"out{i}" / "leanagent-base.safetensors").read_bytes())
    assert len(set(files)) == 1
    record = json.loads((tmp_path / "out0" / "leanagent-base.json").read_text())
    assert record["weights_sha256"] == hashlib.sha256(files[0]).hexdigest()
    size = struct.unpack("<Q", files[0][:8])[0]
    assert list(json.loads(files[0][8 : 8 + size])["__metadata__"]) == ["format", "model_name"]


def test_the_record_of_a_fit_on_a_merge_names_the_merge_s_sources(monkeypatch, tmp_path, retriever_checkpoint):
    """The shipped base trains on `python main.py merge` output; its record reaches back to the sources' bytes."""
    import hashlib

    from leanagent.corpus.provenance import write_manifest

    source, merged = tmp_path / "source", tmp_path / "merged"
    for folder, text in ((source, "source"), (merged, "merged")):
        (folder / "random").mkdir(parents=True)
        (folder / "corpus.jsonl").write_text(f"{text} corpus\n")
        (folder / "random" / "train.json").write_text(f"[] {text}")
    write_manifest(merged, [source / "corpus.jsonl", source / "random" / "train.json", source / "random" / "val.json"])
    saved = torch.load(retriever_checkpoint, weights_only=True)
    saved["datamodule_hyper_parameters"] = {"data_path": str(merged / "random"), "corpus_path": str(merged / "corpus.jsonl")}
    torch.save(saved, tmp_path / "fit.ckpt")
    run_export(monkeypatch, str(tmp_path / "fit.ckpt"), "--command", "x", "--out-dir", str(tmp_path / "out"))
    record = json.loads((tmp_path / "out" / "leanagent-base.json").read_text())
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert record["data_sha256"] == {str(merged / "corpus.jsonl"): digest(merged / "corpus.jsonl"),
                                     str(merged / "random" / "train.json"): digest(merged / "random" / "train.json")}
    assert record["merged_from_sha256"] == {str(source / "corpus.jsonl"): digest(source / "corpus.jsonl"),
                                            str(source / "random" / "train.json"): digest(source / "random" / "train.json")}


def test_an_export_away_from_the_fit_s_data_warns_that_the_record_has_no_fingerprint(monkeypatch, tmp_path, retriever_checkpoint, capsys):
    saved = torch.load(retriever_checkpoint, weights_only=True)
    gone = tmp_path / "gone"
    saved["datamodule_hyper_parameters"] = {"data_path": str(gone / "random"), "corpus_path": str(gone / "corpus.jsonl")}
    torch.save(saved, tmp_path / "fit.ckpt")
    run_export(monkeypatch, str(tmp_path / "fit.ckpt"), "--command", "x", "--out-dir", str(tmp_path / "out"))
    err = capsys.readouterr().err
    assert err.startswith("warning: the fit's data is not all here") and str(gone / "corpus.jsonl") in err
    assert json.loads((tmp_path / "out" / "leanagent-base.json").read_text())["data_sha256"] == {}
    (gone / "random").mkdir(parents=True)
    (gone / "corpus.jsonl").write_text("corpus\n")
    for split in ("train", "val", "test"):
        (gone / "random" / f"{split}.json").write_text("[]")
    run_export(monkeypatch, str(tmp_path / "fit.ckpt"), "--command", "x", "--out-dir", str(tmp_path / "out2"))
    assert "warning" not in capsys.readouterr().err  # the data is back where the fit read it


def test_an_export_without_its_command_is_one_error_line(monkeypatch, tmp_path, retriever_checkpoint, capsys):
    with pytest.raises(SystemExit) as stop:
        run_export(monkeypatch, str(retriever_checkpoint), "--out-dir", str(tmp_path / "out"))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("error: ") and "--command" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["text-file", "no-hyper-parameters", "name-with-folder", "out-dir-is-a-file", "out-dir-under-a-file"])
def test_bad_exports_are_one_error_line_and_write_nothing(monkeypatch, tmp_path, retriever_checkpoint, capsys, case):
    checkpoint, name, out = retriever_checkpoint, "mine", tmp_path / "out"
    if case == "text-file":
        checkpoint = tmp_path / "notes.ckpt"
        checkpoint.write_text("not a checkpoint")
    elif case == "no-hyper-parameters":
        checkpoint = tmp_path / "bare.ckpt"
        torch.save({"state_dict": torch.load(retriever_checkpoint, weights_only=True)["state_dict"], "hyper_parameters": "x"}, checkpoint)
    elif case == "name-with-folder":
        name = "a/b"
    elif case == "out-dir-is-a-file":
        out.write_text("a file")
    else:  # found before the checkpoint (junk here) is read
        (tmp_path / "a-file").write_text("a file")
        out = tmp_path / "a-file" / "sub"
        checkpoint = tmp_path / "notes.ckpt"
        checkpoint.write_text("not a checkpoint")
    with pytest.raises(SystemExit) as exit_info:
        run_export(monkeypatch, str(checkpoint), "--name", name, "--command", "x", "--out-dir", str(out))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert not out.is_dir() or not any(out.iterdir())
    if case.startswith("out-dir"):
        assert err[0].startswith("error: --out-dir: "), err


@pytest.mark.slow  # a real subprocess
def test_a_benchmark_given_a_damaged_checkpoint_says_so_in_one_line(tmp_path):
    """Benchmarks take user files too (`python -m benchmarks.retrieval_table CKPT DATASET`)."""
    import subprocess

    from tests.conftest import REPO

    bad = tmp_path / "notes.ckpt"
    bad.write_text("not a checkpoint")
    done = subprocess.run([sys.executable, "-m", "benchmarks.retrieval_table", str(bad)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"error: retriever checkpoint: {bad} is not a loadable weights-only checkpoint "
                                                "(not a torch file: it starts with b'not a ch')"]


@pytest.mark.parametrize(
    "module, args, fragment",
    [("retrieval_table", ["x.ckpt", "--precision=nope"], "invalid choice: 'nope'"),
     ("search", ["--sizes", "0"], "0 does not conform to restriction v>0"),
     ("learner_curve", ["--steps-per-eval=0"], "0 does not conform to restriction v>0"),
     ("fisher_cost", ["--batches=0"], "0 does not conform to restriction v>0")],
    ids=["precision", "search-size", "steps-per-eval", "fisher-batches"],
)
def test_a_benchmark_refuses_a_count_or_precision_that_cannot_run(monkeypatch, capsys, module, args, fragment):
    """A ZeroDivisionError, an index error or torch's precision ValueError came after minutes of setup before."""
    import importlib

    monkeypatch.setattr(sys, "argv", [module, *args])
    with pytest.raises(SystemExit) as stopped:
        importlib.import_module(f"benchmarks.{module}").main()
    assert stopped.value.code == 2
    assert fragment in capsys.readouterr().err
