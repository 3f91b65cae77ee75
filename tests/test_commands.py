"""One app: every command in one jsonargparse tree, and every composed config the README shows parses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from leanagent.cli import LeanAgentCLI, main
from leanagent.lifelong.commands import COMMANDS, parse_ablation, parse_lifelong
from leanagent.lifelong.runner import checkpoint_folder
from tests.conftest import REPO, config_args

COMMAND_NAMES = ["fit", "validate", "test", "predict", "lifelong", "ablation", "curriculum", "merge"]

# Every combination of configs the README shows, as `--config` lists (relative to configs/).
FIT_COMBINATIONS = {
    "main job": ["retrieval.yaml"],
    "fisher": ["fisher.yaml"],
    "project": ["retrieval.yaml", "recipes/project.yaml"],
    "mathlib": ["retrieval.yaml", "recipes/mathlib.yaml"],
    "byt5-small": ["retrieval.yaml", "recipes/byt5_small.yaml"],
    "pretrain": ["retrieval.yaml", "recipes/pretrain.yaml"],
}
LIFELONG_COMBINATIONS = {"bundled": ["lifelong.yaml"], "mathlib": ["lifelong.yaml", "recipes/lifelong_mathlib.yaml"]}


def run_main(args: list[str], capsys) -> tuple[int, str, str]:
    code = 0
    try:
        main(args)
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_all_eight_commands(capsys):
    code, out, _ = run_main(["--help"], capsys)
    assert code == 0
    listed = out[out.index("subcommands"):]
    for name in COMMAND_NAMES:
        assert f"\n    {name} " in listed, name


@pytest.mark.parametrize("command", COMMAND_NAMES)
def test_every_command_has_its_own_help(command, capsys):
    code, out, _ = run_main([command, "--help"], capsys)
    assert code == 0 and out.startswith("usage:") and f" {command} " in out.splitlines()[0]
    assert "--print_config" in out and "--config" in out


@pytest.mark.parametrize("command", ["fit", "test", "lifelong"])
def test_a_command_line_that_starts_with_its_command_parses_as_with_every_parser_built(command, capsys, monkeypatch):
    """`main.py fit ...` builds fit's parser alone (cli.requested_command): what it resolves must not change."""
    configs = LIFELONG_COMBINATIONS["mathlib"] if command == "lifelong" else FIT_COMBINATIONS["project"]
    args = [command, *config_args(configs), "--print_config"]
    code, alone, err = run_main(args, capsys)
    assert code == 0, err
    import leanagent.cli

    monkeypatch.setattr(leanagent.cli, "requested_command", lambda args: None)
    code, every, err = run_main(args, capsys)
    assert code == 0, err
    assert yaml.safe_load(alone) == yaml.safe_load(every)
    assert ("repositories" if command == "lifelong" else "model") in yaml.safe_load(alone)


def test_only_a_first_word_chooses_the_parser_built_alone():
    from leanagent.cli import requested_command

    assert [requested_command(a) for a in (["fit", "--help"], ["merge"], ["--config", "c.yaml", "fit"], ["fi"], [])] \
        == ["fit", "merge", None, None, None]


def test_lifelong_print_config_shows_the_composed_settings(capsys):
    code, out, _ = run_main(["lifelong", *config_args(LIFELONG_COMBINATIONS["mathlib"]), "--print_config"], capsys)
    assert code == 0
    printed = yaml.safe_load(out)
    assert printed["repositories"]["names"][0] == "mathlib-logic"  # from the overlay
    assert printed["resume_from"] == "best" and printed["fisher_config"] == "configs/fisher.yaml"  # from the base
    assert printed["retrieval_config"] == ["configs/retrieval.yaml", "configs/recipes/project.yaml"]


def test_a_command_s_bad_value_is_one_error_line(capsys):
    code, out, err = run_main(["lifelong", *config_args(["lifelong.yaml"]), "--order=sideways"], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error:") and "order" in err


@pytest.mark.parametrize("old", ["retrieval_mathlib.yaml", "retrieval_byt5_small.yaml", "lifelong_mathlib.yaml"])
def test_a_replaced_config_says_what_replaced_it(old, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    command = "lifelong" if old.startswith("lifelong") else "fit"
    code, _, err = run_main([command, "--config", f"configs/{old}"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "replaced" in err and "configs/recipes/" in err


def test_commands_run_through_the_app(capsys, tmp_path):
    code, out, _ = run_main(["curriculum", *config_args(["lifelong.yaml"]), f"--output_dir={tmp_path / 'out'}"], capsys)
    assert code == 0 and "repository" in out and "data-list" in out


@pytest.mark.parametrize("name", list(FIT_COMBINATIONS))
def test_every_fit_combination_parses(name, clean_env, tmp_path, retriever_checkpoint):
    names = FIT_COMBINATIONS[name]
    args = [*config_args(names), "--trainer.accelerator=cpu", f"--trainer.default_root_dir={tmp_path}"]
    if name == "fisher":
        # the fixture is a byt5-tiny checkpoint; the shipped config names the main job's byt5-mini
        args += [f"--model.init_args.ckpt_path={retriever_checkpoint}", "--model.init_args.model_name=byt5-tiny"]
    if name == "byt5-small":
        args.append("--model.init_args.model_name=byt5-tiny")  # no download in tests
    if name in ("mathlib", "byt5-small", "pretrain"):  # data a user downloads or merges first: the bundled set here
        args += ["--data.data_path=data/batteries/random", "--data.corpus_path=data/batteries/corpus.jsonl"]
    cli = LeanAgentCLI(args=args, run=False)
    config = cli.config
    assert config.trainer.strategy.class_path.endswith("DDPStrategy")
    assert config.data.max_seq_len == config.model.init_args.max_seq_len
    for name_ in names[1:]:  # an overlay's model settings win over the base's
        overlay = yaml.safe_load((REPO / "configs" / name_).read_text())
        for key, value in ((overlay.get("model") or {}).get("init_args") or {}).items():
            if f"--model.init_args.{key}" not in " ".join(args):
                assert config.model.init_args[key] == value, (name_, key)
    callbacks = [c.class_path.rsplit(".", 1)[-1] for c in config.trainer.callbacks]
    assert len(callbacks) == len(set(callbacks)), callbacks  # the list is written once, not appended twice


def test_an_overlay_names_its_logs_and_checkpoints_together():
    base = str(REPO / "configs" / "retrieval.yaml")
    assert checkpoint_folder(base) == Path("checkpoints/retrieval")
    for overlay, folder in (("mathlib", "retrieval_mathlib"), ("pretrain", "pretrain"), ("byt5_small", "retrieval_byt5_small")):
        assert checkpoint_folder([base, str(REPO / "configs" / "recipes" / f"{overlay}.yaml")]) == Path("checkpoints") / folder


def test_model_checkpoint_without_dirpath_writes_under_the_logger_name(tmp_path):
    from leanagent.callbacks.checkpoints import default_dirpath

    assert default_dirpath("retrieval", os.getcwd()) == os.path.join("checkpoints", "retrieval")
    assert default_dirpath("x", tmp_path) == os.path.join(str(tmp_path), "checkpoints", "x")


@pytest.mark.parametrize("name", list(LIFELONG_COMBINATIONS))
def test_every_lifelong_combination_parses(name):
    settings = parse_lifelong(config_args(LIFELONG_COMBINATIONS[name]))
    from leanagent.lifelong.settings import config_list

    for config in [*config_list(settings.retrieval_config), *config_list(settings.fisher_config)]:
        assert (REPO / config).is_file(), config
    checkpoint_folder([str(REPO / c) for c in config_list(settings.retrieval_config)])  # a stage can find its checkpoints


def test_ablation_takes_a_composed_base():
    ablation = parse_ablation(["--config", str(REPO / "configs" / "lifelong_ablation.yaml"),
                               "--base=[configs/lifelong.yaml, configs/recipes/lifelong_mathlib.yaml]"])
    assert ablation.base == ["configs/lifelong.yaml", "configs/recipes/lifelong_mathlib.yaml"]
    assert set(COMMANDS) == {"lifelong", "ablation", "curriculum", "merge"}


def readme_commands() -> list[list[str]]:
    """Every `python main.py COMMAND --config ...` in the README, as its argument list."""
    import re
    import shlex

    found = []
    for line in re.findall(r"python main\.py ([a-z]+ [^`|#\n]*)", (REPO / "README.md").read_text(encoding="utf-8")):
        args = shlex.split(line)
        if "--config" in args:
            found.append(args)
    return found


def test_the_readme_shows_the_composed_forms():
    shown = {" ".join(a for a in args if a.startswith("configs/")) for args in readme_commands()}
    for names in [*FIT_COMBINATIONS.values(), *LIFELONG_COMBINATIONS.values()]:
        assert " ".join(f"configs/{n}" for n in names) in shown, names


@pytest.mark.parametrize("args", readme_commands(), ids=lambda a: " ".join(a)[:80])
def test_every_readme_command_line_parses(args, clean_env, tmp_path, retriever_checkpoint, capsys):
    """What the README tells users to type parses: each config combination with its own overrides."""
    command, rest = args[0], [a.replace("PATH", str(tmp_path)).replace("PROJECT", "data/batteries") for a in args[1:]]
    rest = [str(REPO / a) if a.startswith("configs/") else a for a in rest]
    if command in ("fit", "validate", "test", "predict"):
        rest = [a for a in rest if not a.startswith("--ckpt_path") and "checkpoints/" not in a]
        extra = ["--trainer.accelerator=cpu", f"--trainer.default_root_dir={tmp_path}", "--print_config"]
        if "fisher.yaml" in " ".join(rest):
            extra.append(f"--model.init_args.ckpt_path={retriever_checkpoint}")
        code, out, err = run_main([command, *rest, *extra], capsys)
        assert code == 0, err
        assert yaml.safe_load(out)["trainer"]["strategy"]["class_path"].endswith("DDPStrategy")
    else:
        code, out, err = run_main([command, *rest, "--print_config"], capsys)
        assert code == 0, err
        assert yaml.safe_load(out)


@pytest.mark.slow  # a whole fit in this process, about 20 s
def test_fast_dev_run_leaves_no_checkpoint_and_no_heartbeats_in_the_working_folder(capsys, clean_env, tmp_path,
                                                                                 monkeypatch, mini_dataset):
    """Lightning promises no checkpoints under fast_dev_run; its on_train_end wrote checkpoints/last.ckpt here,
    and the watchdog wrote heartbeats/ beside it (no logger to name a folder)."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(["fit", *config_args(FIT_COMBINATIONS["main job"]), "--trainer.accelerator=cpu",
                             "--trainer.devices=1", "--trainer.enable_progress_bar=false", "--trainer.fast_dev_run=true",
                             f"--data.data_path={mini_dataset / 'random'}", "--data.max_seq_len=32",
                             f"--data.corpus_path={mini_dataset / 'corpus.jsonl'}"], capsys)
    assert code == 0, err[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lightning_logs"]
    assert [p.name for p in (tmp_path / "lightning_logs").iterdir()] == ["heartbeats"]
    assert not list(tmp_path.rglob("*.ckpt"))
