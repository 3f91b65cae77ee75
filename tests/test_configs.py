"""Every shipped config parses through the CLI; --print_config shows the real strategy and timeout."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from leanagent.cli import LeanAgentCLI
from leanagent.distributed import ONE_YEAR
from leanagent.models.encoder import is_preset
from tests.conftest import REPO, run_cli

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
CLI_CONFIGS = [c for c in CONFIGS if "model" in yaml.safe_load(c.read_text())]


def test_there_are_configs_to_check():
    names = {c.name for c in CLI_CONFIGS}
    assert {"retrieval.yaml", "fisher.yaml"} <= names


@pytest.mark.parametrize("config", CLI_CONFIGS, ids=lambda p: p.name)
def test_config_parses_and_resolves_the_strategy(config: Path, clean_env, tmp_path, retriever_checkpoint):
    overrides = ["--trainer.accelerator=cpu", f"--trainer.default_root_dir={tmp_path}"]
    raw = yaml.safe_load(config.read_text())
    if not (REPO / raw.get("data", {}).get("corpus_path", "data/batteries/corpus.jsonl")).exists():
        # Recipes for data a user downloads or merges first: parsed here against the bundled dataset.
        overrides += ["--data.data_path=data/batteries/random", "--data.corpus_path=data/batteries/corpus.jsonl"]
    if not is_preset(raw["model"].get("init_args", {}).get("model_name", "byt5-tiny")):
        overrides.append("--model.init_args.model_name=byt5-tiny")  # no download in tests
    if "FisherInformation" in config.read_text():
        # the fixture is a byt5-tiny checkpoint; the shipped Fisher config names the main job's byt5-mini
        overrides += [f"--model.init_args.ckpt_path={retriever_checkpoint}", "--model.init_args.model_name=byt5-tiny"]
    cli = LeanAgentCLI(args=["--config", str(config), *overrides], run=False)
    config_ns = cli.config
    strategy = config_ns.trainer.strategy
    assert strategy.class_path.endswith("DDPStrategy")
    assert strategy.init_args.timeout == ONE_YEAR == timedelta(days=364)
    assert type(cli.trainer.strategy).__name__ == "DDPStrategy"
    assert cli.trainer.strategy._timeout == ONE_YEAR
    import os

    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert os.environ["NCCL_TIMEOUT"] == str(364 * 24 * 3600 * 1000)
    # Linked, not duplicated: the data module's tokenizer follows the model.
    assert config_ns.data.model_name == config_ns.model.init_args.model_name
    assert config_ns.model.init_args.max_seq_len == config_ns.data.max_seq_len
    callbacks = {c.class_path.rsplit(".", 1)[-1]: c for c in config_ns.trainer.callbacks}
    assert {"DataLoadingBarrier", "FitEndBarrier"} <= set(callbacks)
    if "FisherInformation" in config.read_text():  # one pass, no optimizer, nothing to monitor or checkpoint
        assert cli.trainer.checkpoint_callback is None
    else:
        assert {"LearningRateMonitor", "ModelCheckpoint", "EarlyStopping"} <= set(callbacks)
    # What the file says reaches the parsed config unchanged, except what the overrides above replace.
    given = {arg.split("=", 1)[0].removeprefix("--") for arg in overrides}
    assert_file_values_kept(raw, config_ns, given)


def assert_file_values_kept(raw: dict, parsed, skip: set[str], prefix: str = "") -> None:
    """Every scalar in the YAML `raw` equals its parsed value (numbers compared as numbers); keys in `skip` excepted."""
    for key, value in raw.items():
        name = f"{prefix}{key}"
        if name in skip:
            continue
        if isinstance(value, dict):
            assert_file_values_kept(value, parsed[key], skip, f"{name}.")
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            assert len(parsed[key]) == len(value), name
            for i, (item, got) in enumerate(zip(value, parsed[key])):
                assert_file_values_kept(item, got, skip, f"{name}[{i}].")
        elif isinstance(value, (bool, int, float, str)) or value is None:
            got = parsed[key]
            if isinstance(got, (int, float)) and not isinstance(got, bool) and isinstance(value, str):
                value = float(value)  # `2e-4`: a string to PyYAML, a float to jsonargparse
            if isinstance(value, str) and not isinstance(got, str):
                got = str(got)  # a timedelta or path given as text
            if key == "class_path":  # the CLI may put its own subclass in (leanagent.callbacks.checkpoints)
                value, got = value.rsplit(".", 1)[-1], got.rsplit(".", 1)[-1]
            assert got == value, f"{name}: the file says {value!r}, the parsed config has {got!r}"


def test_the_main_config_runs_on_the_bundled_dataset_as_shipped(clean_env, tmp_path):
    cli = LeanAgentCLI(args=["--config", str(REPO / "configs/retrieval.yaml"), "--trainer.accelerator=cpu"], run=False)
    assert (REPO / cli.config.data.data_path / "train.json").is_file()
    assert (REPO / cli.config.data.corpus_path).is_file()
    assert cli.config.progressive.epochs_per_repo >= 1


def test_explicit_strategy_is_kept_and_logged(clean_env, caplog):
    caplog.set_level("INFO", logger="leanagent")
    cli = LeanAgentCLI(
        args=["--config", str(REPO / "configs/retrieval.yaml"), "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto"],
        run=False,
    )
    assert type(cli.trainer.strategy).__name__ == "SingleDeviceStrategy"
    assert "was named explicitly" in caplog.text


def test_timeout_is_configurable_in_one_place(clean_env):
    import os

    cli = LeanAgentCLI(
        args=["--config", str(REPO / "configs/retrieval.yaml"), "--trainer.accelerator=cpu", "--trainer.strategy.init_args.timeout=2:00:00"],
        run=False,
    )
    assert cli.trainer.strategy._timeout == timedelta(hours=2)
    assert os.environ["NCCL_TIMEOUT"] == str(2 * 3600 * 1000)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["retrieval.yaml", "fisher.yaml"])
def test_print_config_shows_the_strategy_actually_used(name):
    result = run_cli(["fit", "--config", f"configs/{name}", "--print_config"], cwd=REPO)
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    assert printed["trainer"]["strategy"]["class_path"] == "pytorch_lightning.strategies.DDPStrategy"
    assert printed["trainer"]["strategy"]["init_args"]["timeout"] == "364 days, 0:00:00"


RECIPES = sorted((REPO / "configs" / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("config", [*CONFIGS, *RECIPES], ids=lambda p: p.name)
def test_checkpoints_and_early_stopping_follow_the_trained_ranking(config: Path):
    """Plain metric names are the dense ranking; a `/bm25` or `/hybrid` monitor would follow a fallback."""
    raw = yaml.safe_load(config.read_text())
    callbacks = (raw.get("trainer") or {}).get("callbacks") or []
    monitors = [c.get("init_args", {}).get("monitor") for c in callbacks if isinstance(c, dict)]
    for monitor in filter(None, monitors):
        assert "/" not in monitor, f"{config.name} monitors {monitor}"
