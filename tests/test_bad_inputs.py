"""Wrong settings and damaged files, through the CLI's own entry point: one `error:` line, exit 2, nothing written."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Literal

import pytest
import torch

from leanagent.cli import main
from leanagent.cli_errors import duplicate_key, expanded_values
from leanagent.errors import LeanAgentError
from leanagent.models.encoder import refuse_preset_typo
from tests.conftest import REPO

RETRIEVAL = str(REPO / "configs" / "retrieval.yaml")
FISHER = str(REPO / "configs" / "fisher.yaml")
ONE_CPU = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.enable_progress_bar=false"]


def data(root: Path) -> list[str]:
    return [f"--data.data_path={root / 'random'}", f"--data.corpus_path={root / 'corpus.jsonl'}", "--data.max_seq_len=32"]


def one_error(capsys, args: list[str], *fragments: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(errors) == 1, errors
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    "content, fragments",
    [
        ("trainer:\n  max_epochs: [1\n", ["bad.yaml:", "malformed YAML"]),
        ("trainer:\n  max_epoch: 1\n", ["bad.yaml", "trainer.max_epoch"]),
        ("trainer:\n  max_epochs: abc\n", ["bad.yaml", "trainer.max_epochs", "got abc"]),
        ("trainer:\n  strategy:\n    init_args:\n      timeout: forever\n", ["bad.yaml", "timeout", "forever"]),
        ("", ["bad.yaml: a config is a mapping of settings", "this one is empty"]),
        ("- 1\n- 2\n", ["bad.yaml: a config is a mapping of settings", "this one is a list"]),
    ],
    ids=["malformed-yaml", "unknown-key", "wrong-type", "bad-timeout", "empty", "list"],
)
def test_config_errors_name_the_file_and_key_in_one_line(capsys, in_tmp, content, fragments):
    (in_tmp / "bad.yaml").write_text(content)
    one_error(capsys, ["fit", "--config", RETRIEVAL, "--config", "bad.yaml", *ONE_CPU], *fragments)


def test_a_config_that_is_not_utf8_says_so(capsys, in_tmp):
    (in_tmp / "latin1.yaml").write_bytes("data:\n  data_path: caf\u00e9\n".encode("latin-1"))
    one_error(capsys, ["fit", "--config", RETRIEVAL, "--config", "latin1.yaml", *ONE_CPU], "--config latin1.yaml: not UTF-8 text")


def test_a_key_given_twice_in_one_config_mapping_is_refused(capsys, in_tmp):
    (in_tmp / "twice.yaml").write_text("model:\n  init_args:\n    lr: 1.0e-3\n    warmup_steps: 5\n    lr: 2.0e-3\n")
    one_error(capsys, ["fit", "--config", RETRIEVAL, "--config", "twice.yaml", *ONE_CPU],
              "--config twice.yaml:5: 'lr' is given twice in one mapping (first on line 3)")
    # The same key in different mappings, in two configs, or through a YAML merge key is composition, not a slip.
    assert duplicate_key("a:\n  lr: 1\nb:\n  lr: 2\nbase: &b {x: 1}\nc:\n  <<: *b\n  y: 2\n") is None
    assert duplicate_key("callbacks:\n  - {monitor: a}\n  - {monitor: b, mode: max, mode: min}\n") == ("mode", 3, 3)


def test_a_yaml_alias_bomb_is_refused_at_once(capsys, in_tmp):
    """Nine levels of ten aliases each: a billion values once expanded; the parser (and our duplicate-key walk)
    hung on it for minutes."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)]
    (in_tmp / "bomb.yaml").write_text("\n".join(lines) + "\n")
    one_error(capsys, ["fit", "--config", RETRIEVAL, "--config", "bomb.yaml", *ONE_CPU],
              "--config bomb.yaml: its aliases (*name) expand to more than 1,000,000 values")
    (in_tmp / "itself.yaml").write_text("trainer: &x {callbacks: [*x]}\n")  # was a RecursionError traceback
    one_error(capsys, ["fit", "--config", RETRIEVAL, "--config", "itself.yaml", *ONE_CPU], "or refer to themselves")
    # the root, its 2 keys, a's list of 2, and b's list holding a's twice
    assert expanded_values("a: &a [1, 2]\nb: [*a, *a]\n") == 1 + 2 + 3 + (1 + 3 + 3)


@pytest.mark.parametrize("kind, value", [("timestamp", "soon"), ("int", "0x"), ("float", "one")])
def test_a_tagged_value_yaml_cannot_read_is_one_error_in_a_file_or_a_flag(kind, value, capsys, in_tmp):
    """PyYAML raised these as a bare AttributeError or ValueError traceback, naming no file, line or flag."""
    (in_tmp / "tagged.yaml").write_text(f"trainer:\n  max_epochs: 2\n  max_steps: !!{kind} {value}\n")
    one_error(capsys, ["fit", "--config", RETRIEVAL, "--config", "tagged.yaml", *ONE_CPU],
              f"--config tagged.yaml:3: '{value}' is not a valid {kind}, which its tag !!{kind} asks for")
    one_error(capsys, ["fit", "--config", RETRIEVAL, *ONE_CPU, f"--trainer={{max_steps: !!{kind} {value}}}"],
              f"--trainer={{max_steps: !!{kind} {value}}}: '{value}' is not a valid {kind}")
    one_error(capsys, ["lifelong", "--config", str(REPO / "configs" / "lifelong.yaml"), f"--ewc.ewc_lambda=!!{kind} {value}"],
              f"--ewc.ewc_lambda=!!{kind} {value}: '{value}' is not a valid {kind}")


def test_a_logger_whose_package_is_missing_says_which(capsys, in_tmp, toy_dataset):
    import importlib.util

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here, so WandbLogger cannot show a missing package")
    (in_tmp / "wandb.yaml").write_text("trainer:\n  logger:\n    class_path: pytorch_lightning.loggers.WandbLogger\n")
    one_error(capsys, ["fit", "--config", RETRIEVAL, "--config", "wandb.yaml", *ONE_CPU, *data(toy_dataset)],
              "a package the config needs is not installed", "wandb")
    assert not (in_tmp / "lightning_logs").exists() and not (in_tmp / "checkpoints").exists()


def test_a_missing_package_is_a_user_error_but_a_missing_module_of_ours_is_a_bug():
    from leanagent.cli_errors import user_error

    tensorboard = ModuleNotFoundError("Neither `tensorboard` nor `tensorboardX` is available. Try `pip install`ing either.")
    assert "not installed: Neither `tensorboard`" in str(user_error(tensorboard))
    for name in ("leanagent.no_such_module", "no_such_package"):
        try:
            __import__(name)
        except ModuleNotFoundError as e:
            assert (user_error(e) is None) == name.startswith("leanagent"), name


def test_a_file_the_user_may_not_read_is_one_error_naming_it(tmp_path, monkeypatch):
    """Root reads every file, so the refusal is injected: where a lifelong run fingerprints its configs and data,
    and anywhere else, by the CLI's last resort, instead of a PermissionError traceback."""
    import errno

    from leanagent.cli_errors import user_error
    from leanagent.io import file_sha256
    from leanagent.lifelong.settings import LifelongSettings, settings_fingerprint

    config = tmp_path / "fisher.yaml"
    config.write_text("model: {}\n")

    def refused(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refused)
    with pytest.raises(LeanAgentError, match=r"fisher\.yaml: cannot read \(Permission denied\)"):
        settings_fingerprint(LifelongSettings(retrieval_config=str(config), fisher_config=str(config)))
    monkeypatch.undo()
    monkeypatch.setattr("builtins.open", lambda path, *args, **kwargs: refused(path))
    with pytest.raises(LeanAgentError, match=r"fisher\.yaml: cannot read \(Permission denied\)"):
        file_sha256(config)
    monkeypatch.undo()
    assert user_error(RuntimeError("a bug of ours")) is None
    wrapped = RuntimeError("a library's wrapper")
    wrapped.__cause__ = PermissionError(errno.EACCES, "Permission denied", "/data/corpus.jsonl")
    assert str(user_error(wrapped)) == "/data/corpus.jsonl: Permission denied (check its owner and mode)"


@pytest.mark.parametrize("name", ["missing.yaml", "folder"])
def test_a_config_that_names_no_file_says_so(capsys, in_tmp, name):
    (in_tmp / "folder").mkdir()
    one_error(capsys, ["fit", "--config", RETRIEVAL, "--config", name], "--config:", name,
              "does not exist" if name == "missing.yaml" else "not a file")


@pytest.mark.parametrize(
    "setting, fragment",
    [
        ("--trainer.devices=0", "trainer.devices must be a positive number"),
        ("--model.init_args.lr=-1", "model.lr must be positive"),
        ("--data.num_workers=-1", "data.num_workers must be 0"),
        ("--data.seed=-1", "data.seed must be a non-negative integer"),
        ("--model.init_args.ewc_lambda=-1", "ewc_lambda must be a finite non-negative number"),
        ("--model.init_args.bm25_distillation=-0.5", "model.bm25_distillation must be a non-negative number"),
        ("--model.init_args.ewc_lambda=0.5", "fisher_path is not set"),
        ("--trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches must be a positive integer"),
        ("--trainer.num_nodes=0", "trainer.num_nodes must be a positive integer"),
        ("--trainer.num_nodes=2", "nothing starts the other nodes' processes"),  # waited, deaf to SIGTERM, for a year
        ("--trainer.limit_train_batches=0", "this fit would train nothing"),
        ("--trainer.max_steps=0", "trainer.max_steps is 0: this fit would train nothing"),
        ("--trainer.limit_val_batches=0", "no epoch is validated, but ModelCheckpoint monitors Recall@10_val"),
        ("--trainer.val_check_interval=100", "trainer.val_check_interval (100) must be less than or equal to the number of"),
        ("--trainer.limit_test_batches=0 --test_after_fit=true", "trainer.limit_test_batches is 0, but test_after_fit"),
        ("--seed_everything=-1", "seed_everything must be"),
        ("--trainer.accelerator=nonsense", "trainer: You selected an invalid accelerator name"),
        ("--trainer.val_check_interval=0", "trainer.val_check_interval must be a positive"),
        ("--trainer.check_val_every_n_epoch=0", "trainer.check_val_every_n_epoch must be a positive"),
        ("--trainer.check_val_every_n_epoch=100", "so this fit, which trains epochs 0 to 1 (from 0), validates none of"),
        ("--trainer.gradient_clip_val=-1", "trainer.gradient_clip_val must be a non-negative number"),
        ("--trainer.devices=[0]", "trainer: `devices` selected with `CPUAccelerator` should be an int"),  # a GPU list on a CPU
        ("--model.init_args.lr=null", "model.lr is null, but it must be a float"),  # was a TypeError inside jsonargparse
        ("--model.init_args.num_retrieved=null", "model.num_retrieved is null, but it must be an int"),
        ("--model.init_args.model_name=null", "model.model_name is null, but it must be a str"),
    ],
)
def test_wrong_settings_are_refused(capsys, in_tmp, toy_dataset, monkeypatch, setting, fragment):
    for name in ("NODE_RANK", "MASTER_ADDR", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS"):  # as a lone process has them
        monkeypatch.delenv(name, raising=False)
    args = ["fit", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), *setting.split()]
    if setting.startswith("--trainer.devices"):
        args.remove("--trainer.devices=1")
    one_error(capsys, args, fragment)


@pytest.mark.parametrize("command, limit", [("validate", "limit_val_batches"), ("test", "limit_test_batches"),
                                            ("predict", "limit_predict_batches")])
def test_an_evaluation_of_no_batch_is_refused(capsys, in_tmp, toy_dataset, retriever_checkpoint, command, limit):
    one_error(capsys, [command, "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), f"--ckpt_path={retriever_checkpoint}",
                       "--model.init_args.model_name=byt5-tiny", f"--trainer.{limit}=0"], f"trainer.{limit} is 0: {command} would")
    assert not (in_tmp / "lightning_logs").exists()


@pytest.mark.parametrize("command", ["fit", "validate"])
@pytest.mark.parametrize("kind", ["truncated", "damaged-mid-file", "random-bytes", "text", "pickle-payload"])
def test_damaged_or_unsafe_checkpoints_are_refused_without_running_them(capsys, in_tmp, toy_dataset, retriever_checkpoint, command, kind):
    bad = in_tmp / "bad.ckpt"
    if kind == "truncated":
        bad.write_bytes(retriever_checkpoint.read_bytes()[:2000])
    elif kind == "damaged-mid-file":  # a disk error or a bad copy: every zip header intact, tensor bytes changed
        content = bytearray(retriever_checkpoint.read_bytes())
        content[len(content) // 2: len(content) // 2 + 64] = b"\x7f" * 64
        bad.write_bytes(bytes(content))
    elif kind == "random-bytes":
        bad.write_bytes(bytes(range(256)) * 40)
    elif kind == "text":
        bad.write_text("epoch=3\n")
    else:
        class Payload:
            def __reduce__(self):
                return (Path.touch, (in_tmp / "payload-ran",))

        torch.save({"state_dict": {}, "hyper_parameters": Payload()}, bad)
    one_error(capsys, [command, "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), f"--ckpt_path={bad}"],
              "bad.ckpt", "not a loadable weights-only checkpoint", *(["not a torch file"] if kind == "text" else []),
              *(["truncated or damaged: its zip archive has no central directory)"] if kind == "truncated" else []))
    assert not (in_tmp / "payload-ran").exists()
    assert not (in_tmp / "checkpoints").exists()


def test_a_weights_only_checkpoint_cannot_resume_a_fit(capsys, in_tmp, toy_dataset, retriever_checkpoint):
    one_error(capsys, ["fit", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), f"--ckpt_path={retriever_checkpoint}"],
              "holds no optimizer state")


@pytest.mark.parametrize("blocked, fragment", [("checkpoints", "ModelCheckpoint) dirpath"), ("lightning_logs", "trainer.logger save_dir")])
def test_unwritable_output_folders_are_found_before_training(capsys, in_tmp, toy_dataset, blocked, fragment):
    (in_tmp / blocked).write_text("a file where a folder must go")  # root ignores permissions; this still fails
    one_error(capsys, ["fit", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset)], fragment, "is not writable")


def test_unwritable_fisher_output_is_found_before_the_pass(capsys, in_tmp, toy_dataset, retriever_checkpoint):
    (in_tmp / "out").write_text("a file")
    one_error(capsys, ["fit", "--config", FISHER, *ONE_CPU, *data(toy_dataset), f"--model.init_args.ckpt_path={retriever_checkpoint}",
                       "--model.init_args.output_path=out/fisher.safetensors"], "model.init_args.output_path", "is not writable")


class TakesSomeNulls:
    """A model class of a user's: what jsonargparse fills in or the annotation allows is not refused."""

    def __init__(self, n: int = 1, x: str = None, o: object = 0, choice: Literal["a", None] = "a", maybe: int | None = 1) -> None:  # noqa: RUF013
        pass


@pytest.mark.parametrize("key", ["x", "o", "choice", "maybe"])
def test_null_is_refused_only_where_the_model_takes_none(key):
    from jsonargparse import Namespace

    from leanagent.cli_config import check_model_nulls

    def config(**init_args) -> Namespace:
        return Namespace(model=Namespace(class_path=f"{__name__}.TakesSomeNulls", init_args=Namespace(**init_args)))

    check_model_nulls(config(**{key: None}))
    with pytest.raises(LeanAgentError, match="model.n is null, but it must be an int"):
        check_model_nulls(config(n=None, **{key: None}))


@pytest.mark.parametrize("setting, fragment", [("--model.init_args.output_path=", "model.output_path is empty"),
                                               ("--model.init_args.output_path=null", "model.output_path is null"),
                                               ("--model.init_args.ckpt_path=null", "model.ckpt_path is null")])
def test_a_fisher_output_or_checkpoint_of_nothing_is_refused_before_the_pass(capsys, in_tmp, toy_dataset, retriever_checkpoint,
                                                                            setting, fragment):
    one_error(capsys, ["fit", "--config", FISHER, *ONE_CPU, *data(toy_dataset), f"--model.init_args.ckpt_path={retriever_checkpoint}",
                       setting], fragment)
    assert not (in_tmp / "lightning_logs").exists()


def test_the_fisher_checkpoint_errors_name_the_setting(capsys, in_tmp, toy_dataset, retriever_checkpoint):
    (in_tmp / "junk.ckpt").write_bytes(b"not a checkpoint")
    for path, fragment in (("none.ckpt", "checkpoint not found: none.ckpt"), ("junk.ckpt", "junk.ckpt is not a loadable")):
        one_error(capsys, ["fit", "--config", FISHER, *ONE_CPU, *data(toy_dataset), f"--model.init_args.ckpt_path={path}"],
                  f"error: model.ckpt_path: {fragment}")
    one_error(capsys, ["fit", "--config", FISHER, *ONE_CPU, *data(toy_dataset), f"--model.init_args.ckpt_path={retriever_checkpoint}",
                       "--model.init_args.model_name=byt5-cpu"], f"error: model.ckpt_path: {retriever_checkpoint} was trained with")


@pytest.mark.parametrize("names", ["{not json", "[[1]]"])  # not JSON; a list whose names are lists (a TypeError)
def test_a_fisher_file_with_damaged_metadata_is_refused(capsys, in_tmp, toy_dataset, retriever_checkpoint, names):
    from leanagent.ewc.fisher_file import save_fisher
    from leanagent.models.loading import load_retriever

    params = dict(load_retriever(retriever_checkpoint).named_parameters())
    save_fisher(in_tmp / "f.safetensors", {k: torch.ones_like(v) for k, v in params.items()}, {"mode": "empirical"}, theta_star=params)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(in_tmp / "f.safetensors"))
    save_file(tensors, str(in_tmp / "f.safetensors"), metadata={"parameter_names": names, "weights_sha256": "x"})
    one_error(capsys, ["fit", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), "--model.init_args.fisher_path=f.safetensors",
                       "--model.init_args.ewc_lambda=1"], "f.safetensors", "metadata")


@pytest.mark.parametrize("name", ["val", "test"])
@pytest.mark.parametrize("content, fragment", [("[]", "no tactic states to evaluate"), (None, "split not found"),
                                               ("outside", "none of its 2 tactic states has a premise annotation found"),
                                               ("unreachable", "none of the premises its 2 tactic states name is accessible")],
                         ids=["empty", "missing", "no-positive-in-the-corpus", "no-positive-accessible"])
def test_a_bad_evaluation_split_is_refused_before_training(capsys, in_tmp, toy_dataset, monkeypatch, name, content, fragment):
    import json

    import leanagent.models.retriever as retriever

    split = toy_dataset / "random" / f"{name}.json"
    if content == "outside":  # two states (one more than some splits have), whose premises another corpus holds
        theorems = json.loads(split.read_text())
        theorems[0]["traced_tactics"] = [theorems[0]["traced_tactics"][0]] * 2
        for tactic in theorems[0]["traced_tactics"]:
            for provenance in tactic["annotated_tactic"][1]:
                provenance["def_path"] = "Elsewhere.lean"
        split.write_text(json.dumps(theorems))
    elif content == "unreachable":  # in the corpus, but D.lean imports none of their files
        theorems = json.loads(split.read_text())[:1]
        theorems[0]["file_path"] = "D.lean"
        theorems[0]["traced_tactics"] = [theorems[0]["traced_tactics"][0]] * 2
        split.write_text(json.dumps(theorems))
    else:
        split.write_text(content) if content is not None else split.unlink()
    mined = []
    monkeypatch.setattr(retriever, "mine_with_start_encoder", lambda module: mined.append(module))
    one_error(capsys, ["fit", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), "--test_after_fit=true"],
              f"{name}.json", fragment)
    assert not mined  # refused before the module's setup mines hard negatives with the encoder
    assert not (in_tmp / "checkpoints").exists()  # and before the fit, not after it


def test_a_fisher_pass_needs_no_val_split_even_with_validation_batches_set(in_tmp, toy_dataset, retriever_checkpoint):
    (toy_dataset / "random" / "val.json").unlink()  # FisherInformation has no validation_step: no val loop runs
    main(["fit", "--config", FISHER, *ONE_CPU, *data(toy_dataset), f"--model.init_args.ckpt_path={retriever_checkpoint}",
          "--model.init_args.model_name=byt5-tiny", "--trainer.limit_val_batches=1.0", "--trainer.precision=32-true"])
    assert (in_tmp / "checkpoints" / "fisher" / "fisher.safetensors").is_file()


def test_a_fit_without_validation_needs_no_val_split(capsys, in_tmp, toy_dataset):
    (toy_dataset / "random" / "val.json").unlink()
    main(["fit", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), "--trainer.limit_val_batches=0",
          "--trainer.max_epochs=1", "--trainer.callbacks=[]", "--trainer.enable_checkpointing=false"])
    (metrics,) = in_tmp.glob("lightning_logs/retrieval/version_*/metrics.csv")
    assert "loss" in metrics.read_text().splitlines()[0]  # it trained


@pytest.mark.parametrize("name", ["best", "hpc", "registry", "last"])
def test_lightnings_named_checkpoints_that_name_nothing_are_refused(capsys, in_tmp, toy_dataset, name):
    """A new process has no best, hpc or registry checkpoint; `last` with no last.ckpt would evaluate random weights."""
    one_error(capsys, ["validate", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), f"--ckpt_path={name}"],
              f"--ckpt_path={name}", "give a checkpoint file")
    assert not (in_tmp / "lightning_logs").exists()


def test_ckpt_path_last_is_this_configs_last_checkpoint(in_tmp, retriever_checkpoint):
    from jsonargparse import Namespace

    from leanagent.cli_config import resolve_special_ckpt_path

    def config(ckpt: str) -> Namespace:
        logger = Namespace(class_path="x", init_args=Namespace(name="mine"))
        return Namespace(ckpt_path=ckpt, trainer=Namespace(callbacks=[], logger=logger, default_root_dir=None))

    fresh = config("last")
    resolve_special_ckpt_path(fresh, "fit")  # a fit with no last.ckpt yet starts fresh, as Lightning's does
    assert fresh.ckpt_path is None
    (in_tmp / "checkpoints" / "mine").mkdir(parents=True)
    (in_tmp / "checkpoints" / "mine" / "last.ckpt").write_bytes(retriever_checkpoint.read_bytes())
    found = config("last")
    resolve_special_ckpt_path(found, "validate")
    assert found.ckpt_path == str(Path("checkpoints") / "mine" / "last.ckpt")


@pytest.mark.parametrize("kind", ["under-a-file", "a-folder", "a-new-folder"])
def test_prediction_output_path_is_checked_before_predicting(capsys, in_tmp, toy_dataset, retriever_checkpoint, kind):
    (in_tmp / "afile").write_text("x")
    (in_tmp / "afolder").mkdir()
    target = {"under-a-file": "afile/predictions.jsonl", "a-folder": "afolder", "a-new-folder": "out/"}[kind]  # out/: was written as a file
    (in_tmp / "writer.yaml").write_text(
        "trainer:\n  callbacks:\n    - class_path: leanagent.callbacks.predictions.PremisePredictionWriter\n"
        f"      init_args:\n        output_path: {target}\n"
    )
    one_error(capsys, ["predict", "--config", RETRIEVAL, "--config", "writer.yaml", *ONE_CPU, *data(toy_dataset),
                       "--model.init_args.model_name=byt5-tiny", "--model.init_args.init_from=null",
                       f"--ckpt_path={retriever_checkpoint}"], "PremisePredictionWriter) output_path")
    assert not (in_tmp / "lightning_logs").exists() and not (in_tmp / "out").exists()


RESUMABLE = {"optimizer_states": [{"state": {}, "param_groups": []}], "loops": {}}  # what a resume looks for first


@pytest.mark.parametrize(
    "change, command, fragment",
    [
        ({"hyper_parameters": "oops"}, "validate", "'hyper_parameters' is a str, not a dict"),
        ({"epoch": "abc"}, "validate", "'epoch' is a str, not a int"),
        ({"epoch": -5}, "fit", "'epoch' is -5; Lightning saves a count from 0"),
        ({"global_step": -3}, "fit", "'global_step' is -3; Lightning saves a count from 0"),
        ({"optimizer_states": []}, "fit", "holds no optimizer state"),
        ({"state_dict": "nan"}, "validate", "holds NaN or infinite values"),
        ({"optimizer_states": [{"state": {}, "param_groups": []}]}, "fit", "holds no training loop state"),
        ({"state_dict": "float8"}, "validate", "holds float8_e4m3fn values; weights are float16"),
        ({"state_dict": "int"}, "validate", "is a int, not a tensor"),
        ({**RESUMABLE, "loops": {"fit_loop": {"state_dict": 1}}}, "fit", "its 'loops' section is not what a fit writes"),
        ({**RESUMABLE, "callbacks": "junk"}, "fit", "its 'callbacks' section is not what a fit writes"),
        ({**RESUMABLE, "lr_schedulers": ["junk"]}, "fit", "its 'lr_schedulers' section is not what a fit writes"),
    ],
    ids=["hparams-str", "epoch-str", "epoch-negative", "step-negative", "no-optimizer-state", "nan-weights", "no-loops",
         "float8-weight", "int-weight", "loop-state-an-int", "callbacks-a-str", "scheduler-a-str"],
)
def test_checkpoints_with_damaged_structure_are_refused(capsys, in_tmp, toy_dataset, retriever_checkpoint, change, command, fragment):
    """Tracebacks before: a dict() of a string, an int() of 'abc', a resume that restored no optimizer, EarlyStopping's
    'metric not available' for a checkpoint without loops; a negative epoch was explained as a max_epochs of -1."""
    checkpoint = torch.load(retriever_checkpoint, weights_only=True)
    if change.get("state_dict") == "nan":
        change = {"state_dict": {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in checkpoint["state_dict"].items()}}
    elif change.get("state_dict") in ("float8", "int"):  # one entry: torch.isfinite has no float8 kernel, an int no shape
        first = sorted(checkpoint["state_dict"])[0]
        value = checkpoint["state_dict"][first].to(torch.float8_e4m3fn) if change["state_dict"] == "float8" else 5
        change = {"state_dict": {**checkpoint["state_dict"], first: value}}
    checkpoint.update(change)
    torch.save(checkpoint, in_tmp / "odd.ckpt")
    one_error(capsys, [command, "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), "--model.init_args.model_name=byt5-tiny",
                       "--model.init_args.init_from=null", "--ckpt_path=odd.ckpt"], "odd.ckpt", fragment)
    assert not (in_tmp / "checkpoints").exists()


def _fewer_parameters(optimizer: dict) -> None:
    optimizer["param_groups"][0]["params"].pop()


def _moment_of_another_shape(optimizer: dict) -> None:
    optimizer["state"][next(iter(optimizer["state"]))]["exp_avg"] = torch.zeros(3)


def _two_groups(optimizer: dict) -> None:
    optimizer["param_groups"].append(dict(optimizer["param_groups"][0]))


@pytest.mark.parametrize(
    "damage, fragment",
    [(_fewer_parameters, "optimizer state covers"), (_moment_of_another_shape, "exp_avg of parameter"),
     (_two_groups, "not one parameter group")],
    ids=["fewer-parameters", "moment-shape", "two-groups"],
)
def test_a_resume_refuses_an_optimizer_state_for_other_parameters(capsys, in_tmp, toy_dataset, retriever_checkpoint, damage, fragment):
    """Lightning's restore raised a ValueError traceback, or the first step a RuntimeError, after the run started."""
    from leanagent.models.retriever import PremiseRetriever

    checkpoint = torch.load(retriever_checkpoint, weights_only=True)
    model = PremiseRetriever(model_name="byt5-tiny", max_seq_len=64)
    model.load_state_dict(checkpoint["state_dict"])
    optimizer = torch.optim.AdamW(model.parameters())
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()  # AdamW's moments for every parameter, as a fit's checkpoint holds them
    checkpoint.update(optimizer_states=[optimizer.state_dict()], loops={})
    damage(checkpoint["optimizer_states"][0])
    torch.save(checkpoint, in_tmp / "odd.ckpt")
    one_error(capsys, ["fit", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), "--model.init_args.model_name=byt5-tiny",
                       "--model.init_args.init_from=null", "--ckpt_path=odd.ckpt"], "odd.ckpt", fragment)
    assert not (in_tmp / "checkpoints").exists()


def test_an_error_found_after_the_trainer_started_leaves_no_run_folder(capsys, in_tmp, toy_dataset, retriever_checkpoint):
    """The config.yaml and heartbeats a failed setup wrote go again; an earlier run's folder stays."""
    (in_tmp / "lightning_logs" / "retrieval" / "version_0").mkdir(parents=True)
    (in_tmp / "lightning_logs" / "retrieval" / "version_0" / "metrics.csv").write_text("epoch\n0\n")
    checkpoint = torch.load(retriever_checkpoint, weights_only=True)
    checkpoint["state_dict"]["extra.weight"] = torch.zeros(1)  # found when the weights are restored, in the trainer
    torch.save(checkpoint, in_tmp / "odd.ckpt")
    one_error(capsys, ["validate", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), "--model.init_args.model_name=byt5-tiny",
                       "--model.init_args.init_from=null", "--ckpt_path=odd.ckpt"], "unexpected")
    left = sorted(str(p.relative_to(in_tmp)) for p in (in_tmp / "lightning_logs").rglob("*"))
    assert left == ["lightning_logs/retrieval", "lightning_logs/retrieval/version_0", "lightning_logs/retrieval/version_0/metrics.csv"]


def test_a_data_error_found_in_setup_leaves_no_lightning_logs(capsys, in_tmp, toy_dataset):
    """The save_dir a failed first run made (lightning_logs/) goes with the run folder inside it."""
    import json

    split = toy_dataset / "random" / "train.json"
    theorems = json.loads(split.read_text())
    theorems[0]["traced_tactics"][0]["annotated_tactic"] = "simp"
    split.write_text(json.dumps(theorems))
    one_error(capsys, ["fit", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset)], "annotated_tactic")
    assert not (in_tmp / "lightning_logs").exists()


@pytest.mark.parametrize(
    "setting, expected",
    [
        ("--model.init_args.temperature=0.5", "--model.init_args.temperature=0.5: model.temperature: Option 'temperature' is not accepted"),
        ("--data.premise_text=foo", "--data.premise_text=foo: data.premise_text: Expected a typing.Literal['serialized', 'code']. Got value: foo"),
        # a key given twice: the argument with the bad value, wherever it is
        ("--trainer.max_steps=2 --trainer.max_steps=null", "--trainer.max_steps=null: trainer.max_steps: Expected a <class 'int'>. Got value: None"),
        ("--trainer.max_steps=x --trainer.max_steps=3", "--trainer.max_steps=x: trainer.max_steps: Expected a <class 'int'>. Got value: x"),
    ],
)
def test_a_bad_command_line_value_is_blamed_on_the_argument_not_the_config(capsys, in_tmp, setting, expected):
    """It said `configs/retrieval.yaml: model: invalid value (got NestedArg(...))`, a file that has no such key."""
    assert one_error(capsys, ["fit", "--config", RETRIEVAL, *ONE_CPU, *setting.split()]) == f"error: {expected}"


def test_max_epochs_minus_one_trains_to_max_steps_and_alone_is_refused(capsys, in_tmp, toy_dataset):
    """Lightning's -1 (no epoch limit) is not progressive training's 2 epochs: max_steps ends the fit."""
    quiet = ["--trainer.limit_val_batches=0", "--trainer.callbacks=[]", "--trainer.enable_checkpointing=false",
             "--trainer.accumulate_grad_batches=1"]
    one_error(capsys, ["fit", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), *quiet, "--trainer.max_epochs=-1"],
              "trainer.max_epochs is -1", "give trainer.max_steps")
    assert not (in_tmp / "lightning_logs").exists()
    main(["fit", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), *quiet, "--trainer.max_epochs=-1",
          "--trainer.max_steps=3"])
    (metrics,) = in_tmp.glob("lightning_logs/retrieval/version_*/metrics.csv")
    rows = list(csv.DictReader(metrics.open()))
    assert max(int(row["step"]) for row in rows if row.get("loss_train_step")) == 2  # steps 0, 1, 2
    assert max(int(row["epoch"]) for row in rows if row.get("epoch")) == 2  # one batch an epoch: 3 epochs, not 2


def test_max_steps_mid_epoch_validates_the_last_step_for_checkpoints_and_early_stopping(in_tmp, toy_dataset):
    """Lightning validates only at an epoch's end, and EarlyStopping on Recall@10_val would then fail the fit
    with a traceback: a smoke test with a few steps must end like any other fit, with a best checkpoint."""
    main(["fit", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), "--data.batch_size=1", "--data.num_hard_negatives=0",
          "--data.num_negatives=1", "--trainer.accumulate_grad_batches=1", "--trainer.max_steps=2"])
    (metrics,) = in_tmp.glob("lightning_logs/retrieval/version_*/metrics.csv")
    rows = list(csv.DictReader(metrics.open()))
    assert max(int(row["step"]) for row in rows if row.get("loss_train_step")) == 1  # steps 0 and 1 of epoch 0 (4 batches)
    (validated,) = [row for row in rows if row.get("Recall@10_val")]
    assert int(validated["epoch"]) == 0
    assert [p.name for p in in_tmp.glob("checkpoints/retrieval/epoch=0-*.ckpt")]


def test_a_model_name_a_letter_off_a_preset_is_refused_at_once(capsys, in_tmp, toy_dataset, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # without the check, the hub's loader (offline here) would answer
    one_error(capsys, ["fit", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), "--model.init_args.model_name=byt5-tinyy"],
              "model_name 'byt5-tinyy' is not a built-in preset", "did you mean 'byt5-tiny'?")
    assert not (in_tmp / "checkpoints").exists()
    for name in ("ByT5-Mini", "byt5_cpu"):
        with pytest.raises(LeanAgentError, match="did you mean"):
            refuse_preset_typo(name)
    (in_tmp / "byt5-tinyy").mkdir()  # a local model folder of that name, and hub names, are loaded as they are
    for name in ("byt5-tinyy", "google/byt5-small", "t5-small", "byt5-small"):
        refuse_preset_typo(name)


def test_a_name_with_a_newline_or_a_terminal_escape_stays_on_the_error_line(capsys, in_tmp, toy_dataset):
    """A path (or a theorem's name) from the input is shown escaped: before, the part after its newline came out as
    a second line of its own, which could itself start with `error:`."""
    from leanagent.errors import one_line

    assert one_line("ℕ.succ ∀ λ\tx\n\r\x1b[31m") == "ℕ.succ ∀ λ\tx\\n\\r\\x1b[31m"
    corpus = "no\nerror: such\x1b[2J.jsonl"
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", RETRIEVAL, *ONE_CPU, f"--data.data_path={toy_dataset / 'random'}", f"--data.corpus_path={corpus}"])
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if line.startswith("error")]
    assert len(errors) == 1 and "no\\nerror: such\\x1b[2J.jsonl" in errors[0], lines
