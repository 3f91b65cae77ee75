"""An output file is never one of the run's inputs, nor a device or a pipe, and a symbolic link is written
through: the atomic rename used to replace whatever stood at the path."""

from __future__ import annotations

import os
import shutil

import pytest

from leanagent.io import atomic_open, atomic_write
from tests.test_bad_inputs import FISHER, ONE_CPU, RETRIEVAL, data, in_tmp, one_error  # noqa: F401 (in_tmp: a fixture)


def writer(path) -> list[str]:
    return [f"--trainer.callbacks=[{{class_path: leanagent.callbacks.predictions.PremisePredictionWriter, "
            f"init_args: {{output_path: {path}}}}}]"]


def test_predictions_over_the_corpus_or_a_split_are_refused(capsys, in_tmp, toy_dataset, retriever_checkpoint):
    for target, read in [(toy_dataset / "corpus.jsonl", "data.corpus_path"), (toy_dataset / "random" / "val.json", "the val split")]:
        before = target.read_bytes()
        one_error(capsys, ["predict", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset),
                           f"--ckpt_path={retriever_checkpoint}", "--model.init_args.model_name=byt5-tiny", *writer(target)],
                  "(PremisePredictionWriter) output_path", f"is also {read}, which this run reads")
        assert target.read_bytes() == before


def test_a_fisher_file_over_its_own_checkpoint_is_refused(capsys, in_tmp, toy_dataset, retriever_checkpoint):
    ckpt = in_tmp / "copy.ckpt"
    shutil.copy(retriever_checkpoint, ckpt)
    one_error(capsys, ["fit", "--config", FISHER, *ONE_CPU, *data(toy_dataset), f"--model.init_args.ckpt_path={ckpt}",
                       f"--model.init_args.output_path={ckpt}"], "is also model.ckpt_path, which this run reads")
    assert ckpt.read_bytes() == retriever_checkpoint.read_bytes()


def test_a_pipe_as_output_is_refused(capsys, in_tmp, toy_dataset, retriever_checkpoint):
    os.mkfifo(in_tmp / "pipe")
    one_error(capsys, ["predict", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset),
                       f"--ckpt_path={retriever_checkpoint}", "--model.init_args.model_name=byt5-tiny", *writer(in_tmp / "pipe")], "is not a regular file")
    assert (in_tmp / "pipe").is_fifo()


def test_predictions_to_a_symbolic_link_go_through_it(in_tmp, toy_dataset, retriever_checkpoint):
    from leanagent.cli import main

    (in_tmp / "real").mkdir()
    (in_tmp / "real" / "out.jsonl").write_text("old")
    (in_tmp / "link.jsonl").symlink_to("real/out.jsonl")
    main(["predict", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), f"--ckpt_path={retriever_checkpoint}",
          "--model.init_args.model_name=byt5-tiny", "--trainer.limit_predict_batches=1", "--data.predict_splits=[val]",
          *writer(in_tmp / "link.jsonl")])
    assert (in_tmp / "link.jsonl").is_symlink() and '"state"' in (in_tmp / "real" / "out.jsonl").read_text()


@pytest.mark.parametrize("how", ["open", "write"])
def test_our_own_files_replace_a_symbolic_link_and_leave_its_target_alone(tmp_path, how):
    """A link left in an output folder (state.json, a heartbeat) must not let a write reach the file it names."""
    (tmp_path / "shared.txt").write_text("a dataset's file")
    (tmp_path / "state.json").symlink_to("shared.txt")
    if how == "open":
        with atomic_open(tmp_path / "state.json") as f:
            f.write("new")
    else:
        atomic_write(tmp_path / "state.json", lambda tmp: open(tmp, "w").write("new"))
    assert (tmp_path / "shared.txt").read_text() == "a dataset's file"
    assert not (tmp_path / "state.json").is_symlink() and (tmp_path / "state.json").read_text() == "new"
