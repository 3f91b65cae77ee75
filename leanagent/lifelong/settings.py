"""What a lifelong run is: its settings, checked before the first stage, and their fingerprint."""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from leanagent.errors import LeanAgentError
from leanagent.io import read_bytes
from leanagent.lifelong.repositories import Repositories
from leanagent.precision import PRECISIONS


@dataclass
class EWCSettings:
    """Defaults reproduce LeanAgent's code: the latest Fisher only (gamma 0) and no 1/2 in the penalty."""

    enabled: bool = False
    ewc_lambda: float = 0.1
    gamma: float = 0.0
    form: Literal["paper", "leanagent"] = "leanagent"


@dataclass
class LifelongSettings:
    """One lifelong run. Paths are relative to the working directory."""

    output_dir: str = "results/lifelong"
    repositories: Repositories = field(default_factory=Repositories)
    order: Literal["curriculum", "given"] = "curriculum"
    construction: Literal["single_repo", "merge_all"] = "single_repo"
    ewc: EWCSettings = field(default_factory=EWCSettings)
    epochs_per_repo: int = 1
    resume_from: Literal["best", "last"] = "best"
    # What a stage hands over: fine_tuned_share * its fine-tuned weights + (1 - share) * the weights it started
    # from (WiSE-FT; handover.py). 1.0 hands over the fine-tuned weights, as LeanAgent does.
    fine_tuned_share: float = 1.0
    split: str = "random"
    # One config, or several composed in order (a base and overlays, as repeated --config composes them).
    retrieval_config: str | list[str] = "configs/retrieval.yaml"
    fisher_config: str | list[str] = "configs/fisher.yaml"
    stage_args: list[str] = field(default_factory=list)
    eval_precision: str = "32-true"
    eval_batch_size: int = 64
    metric_window: int = 5
    seed: int = 3407


def settings_fingerprint(settings: LifelongSettings) -> str:
    """What makes two runs the same run: the settings and the content of the stage configs they name
    (editing configs/retrieval.yaml in place makes another run); output_dir is where, not what."""
    described = {k: v for k, v in asdict(settings).items() if k != "output_dir"}
    if described["fine_tuned_share"] == 1.0:  # as before the setting existed: runs begun then still resume
        del described["fine_tuned_share"]
    if not described["ewc"]["enabled"]:  # lambda, gamma and form are unused without EWC: all such runs are one run
        described["ewc"] = asdict(EWCSettings(enabled=False))
    for key in ("retrieval_config", "fisher_config"):
        described[f"{key}_sha256"] = [
            hashlib.sha256(read_bytes(p, key)).hexdigest() if Path(p).is_file() else None for p in config_list(described[key])
        ]
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def config_list(configs: str | os.PathLike | list[str]) -> list[str]:
    return [os.fspath(configs)] if isinstance(configs, (str, os.PathLike)) else [os.fspath(c) for c in configs]



# What each stage's command is given by the runner, or reads from retrieval_config where the runner then looks
# for its checkpoints: one set in stage_args won the command line (they come last), and the runner found no
# checkpoint after stage 0 had trained, or trained on other data than it reported.
RUNNER_OWNED = {
    "--config": "compose configs with retrieval_config (and fisher_config), a list",
    "-c": "compose configs with retrieval_config (and fisher_config), a list",
    "--trainer.logger": "set the logger in a retrieval_config overlay: the runner finds a stage's checkpoints by its name",
    "--trainer.callbacks": "set callbacks in a retrieval_config overlay: the runner finds a stage's checkpoints by them",
    "--trainer.default_root_dir": "each stage writes under output_dir/stages/",
    "--ckpt_path": "each stage starts from the previous one's handover (resume_from), stage 0 from model.init_from",
    "--data.data_path": "each stage reads its repository's folder (repositories)",
    "--data.corpus_path": "each stage reads its repository's folder (repositories)",
    "--seed_everything": "set the run's seed",
    "--progressive": "set epochs_per_repo",
    "--data": "give data settings one by one (--data.KEY=VALUE): a whole section replaces the stage's data paths",
    "--trainer": "give trainer settings one by one (--trainer.KEY=VALUE): a whole section replaces the logger and callbacks",
}
# With EWC, stage_args reach the Fisher command too, whose empirical pass reads the whole training split.
FIT_ONLY = {"--trainer.max_steps", "--trainer.limit_train_batches"}


def check_stage_args(stage_args: list[str], ewc: bool) -> None:
    """Refuse, before any stage, stage_args that would take over what the runner sets or reads back."""
    for arg in stage_args:
        flag = str(arg).split("=", 1)[0].rstrip("+")  # --trainer.callbacks+=... appends
        owned = next((key for key in RUNNER_OWNED if flag == key or  # the bare sections only as a whole
                      (flag.startswith(key + ".") and key not in ("--data", "--trainer"))), None)
        if owned is not None:
            raise LeanAgentError(f"stage_args: {arg} sets {owned}, which the runner sets for every stage: {RUNNER_OWNED[owned]}")
        if ewc and flag in FIT_ONLY:
            raise LeanAgentError(f"stage_args: {arg} also reaches the Fisher command (EWC is on), whose pass reads the "
                                 "whole training split: set it for the fits alone in a retrieval_config overlay")


def check_settings(s: LifelongSettings) -> None:
    """What the runner uses only after stages have trained (the report's window, the evaluations, the EWC
    stages' Fisher command) is checked before the first one, and so is what a config file can set to null."""
    for key in ("output_dir", "split"):
        value = getattr(s, key)
        if not isinstance(value, str) or not value.strip():
            raise LeanAgentError(f"{key} must be a non-empty path or name, got {value!r}")
    if isinstance(s.seed, bool) or not isinstance(s.seed, int) or not 0 <= s.seed <= 2**32 - 1:
        raise LeanAgentError(f"seed must be an integer in [0, 2**32 - 1] (each stage's seed_everything), got {s.seed!r}")
    minimum = s.repositories.min_theorems
    if isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < 1:
        raise LeanAgentError(f"repositories.min_theorems must be a positive integer, got {minimum!r}")
    for key in ("metric_window", "eval_batch_size", "epochs_per_repo"):
        value = getattr(s, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LeanAgentError(f"{key} must be a positive integer, got {value!r}")
    share = s.fine_tuned_share
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 < share <= 1.0:
        raise LeanAgentError(f"fine_tuned_share must be a number in (0, 1], got {share!r}")
    if s.eval_precision not in PRECISIONS:
        raise LeanAgentError(f"eval_precision must be one of {', '.join(p for p in PRECISIONS if isinstance(p, str))}; got {s.eval_precision!r}")
    for key in ("ewc_lambda", "gamma"):
        value = getattr(s.ewc, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise LeanAgentError(f"ewc.{key} must be a finite non-negative number, got {value!r}")
    check_stage_args(s.stage_args, s.ewc.enabled)
    configs = {"retrieval_config": s.retrieval_config, **({"fisher_config": s.fisher_config} if s.ewc.enabled else {})}
    for key, paths in configs.items():
        for path in config_list(paths):
            if not Path(path).is_file():
                raise LeanAgentError(f"{key}: {path} is not a file")

