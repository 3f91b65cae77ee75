"""`--trainer.logger=false`: a fit and a validate run without a logger, and write nothing over the user's files."""

from __future__ import annotations

from leanagent.cli import main
from tests.test_bad_inputs import ONE_CPU, RETRIEVAL, data, in_tmp  # noqa: F401 (in_tmp is a fixture)

MINE = "# the user's own config, passed with --config\ntrainer:\n  max_epochs: 1\n"


def test_a_fit_and_a_validate_without_a_logger_run_and_leave_a_config_yaml_in_the_working_folder_alone(in_tmp, toy_dataset):
    (in_tmp / "config.yaml").write_text(MINE)
    args = ["--config", RETRIEVAL, "--config", "config.yaml", *ONE_CPU, *data(toy_dataset), "--trainer.logger=false"]
    # The configs' LearningRateMonitor used to stop this fit with Lightning's "no logger" traceback.
    main(["fit", *args, "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1"])
    (checkpoint,) = in_tmp.glob("checkpoints/**/last.ckpt")
    main(["validate", *args, f"--ckpt_path={checkpoint}", "--trainer.limit_val_batches=1"])
    assert (in_tmp / "config.yaml").read_text() == MINE  # Lightning saved the resolved config over it


def test_without_a_logger_the_config_goes_to_a_default_root_dir_that_is_given(in_tmp, toy_dataset):
    main(["fit", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), "--trainer.logger=false",
          "--trainer.default_root_dir=run", "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1"])
    assert (in_tmp / "run" / "config.yaml").is_file() and not (in_tmp / "config.yaml").exists()
