"""Settings a config file or the command line gets wrong in shape (a section that is not a mapping, a null, a
number out of range), and data folders missing a file: one `error:` line, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from leanagent.cli import main
from tests.conftest import BUNDLED, REPO, config_args
from tests.test_bad_inputs import FISHER, ONE_CPU, RETRIEVAL, one_error

LIFELONG = config_args(["lifelong.yaml"])


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _overlay(folder: Path, text: str) -> str:
    path = folder / "overlay.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, command, shown", [
    ("trainer: [1]\n", "fit", "'trainer' must be a mapping of settings"),  # jsonargparse ran Lightning's defaults
    ("trainer: null\n", "fit", "got null"),
    ("progressive: null\n", "fit", "'progressive' must be a mapping"),
    ("watchdog: [1]\n", "fit", "'watchdog' must be a mapping"),
    ("data: 5\n", "fit", "got int 5"),
    ("repositories: [1]\n", "lifelong", "'repositories' must be a mapping"),  # ran 6 stages on the defaults
    ("ewc: null\n", "curriculum", "'ewc' must be a mapping"),
])
def test_a_section_that_is_not_a_mapping_is_refused(capsys, in_tmp, text, command, shown):
    base = ["--config", RETRIEVAL, *ONE_CPU, "--trainer.fast_dev_run=true"] if command == "fit" else LIFELONG
    overlay = _overlay(in_tmp, text)
    one_error(capsys, [command, *base, "--config", overlay], f"--config {overlay}", shown)
    assert sorted(p.name for p in in_tmp.iterdir()) == ["overlay.yaml"]


@pytest.mark.parametrize("command, flag, shown", [
    ("fit", ["--progressive=null"], "--progressive=null: 'progressive' must be a mapping of settings"),  # blamed the file
    ("fit", ["--trainer", "null"], "--trainer=null: 'trainer' must be a mapping"),
    ("fit", ["--data=[1]"], "--data=[1]: 'data' must be a mapping of settings (--data '{key: value}'"),
    ("lifelong", ["--ewc=null"], "--ewc=null: 'ewc' must be a mapping"),
])
def test_a_section_flag_that_is_not_a_mapping_names_the_flag(capsys, in_tmp, command, flag, shown):
    base = ["--config", RETRIEVAL, *ONE_CPU, "--trainer.fast_dev_run=true"] if command == "fit" else LIFELONG
    message = one_error(capsys, [command, *base, *flag], shown)
    assert "configs/" not in message
    assert list(in_tmp.iterdir()) == []


def test_a_section_flag_still_takes_a_mapping(capsys, in_tmp):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", RETRIEVAL, "--trainer", "{devices: 1, max_epochs: 7}", "--print_config"])
    assert exit_info.value.code in (0, None)
    assert "max_epochs: 7" in capsys.readouterr().out


@pytest.mark.parametrize("key, kind", [("batch_size", "an int"), ("num_negatives", "an int"), ("data_path", "a str")])
def test_a_null_data_setting_is_refused_before_the_datamodule(capsys, in_tmp, key, kind):
    overlay = _overlay(in_tmp, f"data:\n  {key}: null\n")
    one_error(capsys, ["fit", "--config", RETRIEVAL, "--config", overlay, *ONE_CPU, "--trainer.fast_dev_run=true"],
              f"data.{key} is null, but it must be {kind}")
    assert sorted(p.name for p in in_tmp.iterdir()) == ["overlay.yaml"]


@pytest.mark.parametrize("epochs", ["0", "-1"])
def test_epochs_per_repo_below_one_names_itself(capsys, in_tmp, epochs):
    one_error(capsys, ["fit", "--config", RETRIEVAL, *ONE_CPU, f"--progressive.epochs_per_repo={epochs}"],
              f"progressive.epochs_per_repo must be at least 1, got {epochs}")


@pytest.mark.parametrize("command", ["validate", "test", "predict"])
def test_the_fisher_module_runs_only_under_fit(capsys, in_tmp, command):
    one_error(capsys, [command, "--config", FISHER, *ONE_CPU, "--model.init_args.ckpt_path=missing.ckpt"],
              f"{command}: leanagent.models.fisher.FisherInformation only computes the Fisher", "configs/retrieval.yaml")
    assert list(in_tmp.iterdir()) == []


@pytest.mark.parametrize("text, shown", [
    ("split: null\n", "split must be a non-empty path or name, got None"),  # bundled splits were left behind
    ("output_dir: null\n", "output_dir must be a non-empty path or name, got None"),
    ("seed: -1\n", "seed must be an integer in [0, 2**32 - 1]"),  # refused by stage 0, after the splits
    ("repositories:\n  min_theorems: 0\n", "repositories.min_theorems must be a positive integer, got 0"),
    # the stage trained, then the runner found no checkpoint where the configs' logger name puts it
    ('stage_args: ["--trainer.logger.init_args.name=mine"]\n', "stage_args: --trainer.logger.init_args.name=mine sets --trainer.logger"),
    ('stage_args: ["--seed_everything=1"]\n', "stage_args: --seed_everything=1 sets --seed_everything, which the runner sets for every stage: set the run's seed"),
    ('stage_args: ["--trainer.callbacks+={class_path: x}"]\n', "sets --trainer.callbacks"),  # appends, replacing nothing, yet
    ('stage_args: ["--data=my.yaml"]\n', "sets --data, which the runner sets for every stage: give data settings one by one"),
    ('stage_args: ["--ckpt_path=x.ckpt"]\n', "(resume_from), stage 0 from model.init_from"),
    # with EWC it reached the Fisher command, which refused a partial pass after stage 0 had trained
    ('ewc: {enabled: true}\nstage_args: ["--trainer.max_steps=5"]\n', "also reaches the Fisher command (EWC is on)"),
    # taken without EWC: the next check (the configs, relative to this test's empty folder) is the one refusing
    ('ewc: {enabled: false}\nstage_args: ["--trainer.limit_train_batches=1"]\n', "retrieval_config: configs/retrieval.yaml is not a file"),
])
def test_lifelong_settings_are_checked_before_anything_is_written(capsys, in_tmp, text, shown):
    overlay = _overlay(in_tmp, text)
    one_error(capsys, ["lifelong", *LIFELONG, "--config", overlay, f"--repositories.bundled={BUNDLED}"], shown)
    assert sorted(p.name for p in in_tmp.iterdir()) == ["overlay.yaml"]


def test_a_data_root_folder_with_splits_but_no_corpus_is_named(capsys, in_tmp):
    for name in ("A", "B"):
        shutil.copytree(BUNDLED, in_tmp / "root" / name)
    (in_tmp / "root" / "B" / "corpus.jsonl").unlink()  # was silently left out: a curriculum of one
    one_error(capsys, ["curriculum", *LIFELONG, f"--repositories.data_root={in_tmp / 'root'}", "--repositories.bundled=null"],
              f"{in_tmp / 'root' / 'B'} has split folders but no corpus.jsonl")
    one_error(capsys, ["curriculum", *LIFELONG, f"--repositories.data_root={in_tmp / 'root'}", "--repositories.bundled=null",
                       "--repositories.names=[A,A]"], "repositories.names: A given more than once")
    assert sorted(p.name for p in in_tmp.iterdir()) == ["root"]


def test_a_weights_file_given_as_the_fisher_is_named_for_what_it_is(capsys, in_tmp):
    weights = REPO / "leanagent" / "pretrained" / "leanagent-base.safetensors"  # was "Fisher ... holds negative values"
    one_error(capsys, ["fit", "--config", RETRIEVAL, *ONE_CPU, "--trainer.fast_dev_run=true",
                       "--model.init_args.ewc_lambda=0.1", f"--model.init_args.fisher_path={weights}"],
              f"{weights}: not a Fisher file (header format 'leanagent-retriever-encoder'")
    assert list(in_tmp.iterdir()) == []


def test_merge_names_a_source_given_twice_or_a_file(capsys, in_tmp):
    one_error(capsys, ["merge", "--out", "merged", str(BUNDLED), f"{BUNDLED}/../batteries"],
              f"source {BUNDLED}/../batteries is given twice (also as {BUNDLED})")
    (in_tmp / "notes.txt").write_text("x\n")
    one_error(capsys, ["merge", "--out", "merged", "notes.txt"], "source notes.txt is a file, not a dataset folder")
    assert sorted(p.name for p in in_tmp.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("text, shown", [
    ("sed: 3\n", "base: base.yaml: Option 'sed' is not accepted"),  # named the ablation's own file
    ("seed: [\n", "base: base.yaml:2: malformed YAML"),
    ("ewc: null\n", "base: base.yaml: 'ewc' must be a mapping of settings"),
])
def test_an_ablation_s_bad_base_names_the_base(capsys, in_tmp, text, shown):
    (in_tmp / "base.yaml").write_text(text)
    (in_tmp / "ablation.yaml").write_text(
        "base: base.yaml\noutput_dir: out\nsetups:\n  - {name: a, order: given, construction: single_repo, ewc: false}\n")
    message = one_error(capsys, ["ablation", "--config", "ablation.yaml"], shown)
    assert "ablation.yaml" not in message
    assert sorted(p.name for p in in_tmp.iterdir()) == ["ablation.yaml", "base.yaml"]


@pytest.mark.parametrize("command, removed, shown", [
    ("validate", "val", "validate: {split} has no val.json"),
    ("test", "test", "test: {split} has no test.json"),
    ("predict", "test", "data.predict_splits: {split} has no test.json; name the splits it has"),
])
def test_a_split_an_evaluation_reads_is_checked_before_the_ranks_start(capsys, in_tmp, toy_dataset, retriever_checkpoint,
                                                                       command, removed, shown):
    """Found by each rank's data hook, the same error came once per rank (four lines on the configs' 4 devices)."""
    from tests.test_bad_inputs import data

    (toy_dataset / "random" / f"{removed}.json").unlink()
    one_error(capsys, [command, "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), f"--ckpt_path={retriever_checkpoint}",
                       "--model.init_args.model_name=byt5-tiny"], shown.format(split=toy_dataset / "random"))
    assert not (in_tmp / "lightning_logs").exists()


@pytest.mark.parametrize("flag", ["--trainer.limit_train_batches=2", "--trainer.limit_train_batches=1", "--trainer.max_steps=3"])
def test_a_partial_empirical_fisher_pass_is_refused_before_it_runs(capsys, in_tmp, toy_dataset, retriever_checkpoint, flag):
    """It was refused only after the pass, when the counts did not add up to the split."""
    from tests.test_bad_inputs import data

    one_error(capsys, ["fit", "--config", FISHER, *ONE_CPU, *data(toy_dataset), f"--model.init_args.ckpt_path={retriever_checkpoint}",
                       "--model.init_args.model_name=byt5-tiny", flag], f"{flag[2:]}: the empirical Fisher is a mean over the whole")
    assert sorted(p.name for p in in_tmp.iterdir()) == ["toy"]  # no checkpoints/ or lightning_logs/


@pytest.mark.parametrize("flag, shown", [
    ("--preemption.signals=[SIGKILL]", "preemption.signals: SIGKILL cannot be caught"),  # OSError from signal.signal
    # Lightning's MisconfigurationException, raised once it counts the batches: a traceback before
    ("--trainer.limit_train_batches=0.0001", "Lightning refused a setting: You requested to check 0.0001 of the `train_dataloader`"),
])
def test_a_setting_refused_once_the_fit_runs_is_one_error_and_leaves_no_run_folder(capsys, in_tmp, toy_dataset, flag, shown):
    one_error(capsys, ["fit", "--config", RETRIEVAL, *ONE_CPU, f"--data.data_path={toy_dataset / 'random'}",
                       f"--data.corpus_path={toy_dataset / 'corpus.jsonl'}", "--trainer.max_epochs=1", flag], shown)
    assert not (in_tmp / "lightning_logs").exists() and not (in_tmp / "checkpoints").exists()


def test_more_negatives_than_the_corpus_has_premises_is_refused_before_the_pairs_are_built(capsys, in_tmp, toy_dataset):
    """100,000 negatives a pair on a small corpus grew the process to tens of GB until the kernel killed it."""
    premises = sum(len(json.loads(line)["premises"]) for line in (toy_dataset / "corpus.jsonl").read_text().splitlines() if line.strip())
    one_error(capsys, ["fit", "--config", RETRIEVAL, *ONE_CPU, f"--data.data_path={toy_dataset / 'random'}",
                       f"--data.corpus_path={toy_dataset / 'corpus.jsonl'}", "--trainer.max_epochs=1",
                       f"--data.num_negatives={premises}"], f"data.num_negatives ({premises}) must be below the {premises} premises")
    assert not (in_tmp / "lightning_logs").exists() and not (in_tmp / "checkpoints").exists()


@pytest.mark.parametrize("name", ["/abs/run", "../../escape"])
def test_a_logger_name_that_leaves_the_log_and_checkpoint_folders_is_refused(capsys, in_tmp, toy_dataset, name):
    """Before, `/abs/run` wrote the logs and checkpoints at the file system's root, `../../escape` two folders up."""
    one_error(capsys, ["fit", "--config", RETRIEVAL, *ONE_CPU, f"--data.data_path={toy_dataset / 'random'}",
                       f"--data.corpus_path={toy_dataset / 'corpus.jsonl'}", f"--trainer.logger.init_args.name={name}"],
              f"trainer.logger.init_args.name: {name!r}")
    assert sorted(p.name for p in in_tmp.iterdir()) == ["toy"] and not Path("/abs").exists()
