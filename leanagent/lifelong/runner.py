"""LeanAgent's lifelong loop: one stage per repository, resumable after any interruption.

A stage: build its training data (`single_repo` or `merge_all`), fit `epochs_per_repo` epochs
resuming from the previous stage's last checkpoint (a `main.py fit` subprocess, so DDP, the
strategy and the barriers are the CLI's), optionally compute its Fisher for the next stage's
EWC, then evaluate test metrics on every repository seen so far and validation metrics on the
current one. A stage's results enter `state.json` (written atomically) only once all of it has
finished; a restart with the same command skips finished stages and redoes an unfinished one
from scratch, so the final table equals that of an uninterrupted run.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

from leanagent.callbacks.checkpoints import default_dirpath
from leanagent.checkpoint_files import fit_state, load_checkpoint
from leanagent.errors import LeanAgentError, ReportedError
from leanagent.ewc.penalty import combine_fisher
from leanagent.interrupts import stop_on_signals
from leanagent.io import (
    ensure_writable, folder_lock, missing_folders, read_json, remove_empty_folders, sync_to_disk, write_json,
)
from leanagent.lifelong.curriculum import compute_curriculum
from leanagent.lifelong.evaluation import evaluate_splits
from leanagent.lifelong.handover import handover_checkpoint
from leanagent.lifelong.merge import check_mergeable, merge_datasets
from leanagent.lifelong.report import check_state_shape, write_report
from leanagent.lifelong.repositories import check_same_data, check_splits, repository_data, resolve_repositories
from leanagent.lifelong.settings import LifelongSettings, check_settings, config_list, settings_fingerprint
from leanagent.lifelong.stage_commands import RESUME, StageRefused, check_parses, run_stage
from leanagent.lifelong.start_weights import check_start_weights, recorded_start_unchanged, start_weights

log = logging.getLogger("leanagent")


def repository_order(settings: LifelongSettings, repos: dict[str, Path], theorems: dict | None = None) -> list[str]:
    if settings.order == "given":
        return list(repos)
    return compute_curriculum(repos, settings.split, theorems).order


def checkpoint_folder(retrieval_config: str | os.PathLike | list[str]) -> Path:
    """Where a stage's fit writes its checkpoints, relative to the stage's fit folder: the ModelCheckpoint's
    `dirpath`, or with none `checkpoints/<logger name>` (see callbacks/checkpoints.py). A composed list is read
    as repeated --config reads it: a later config replaces the callback list and overrides the logger name."""
    import yaml

    callbacks, logger, named = None, None, None
    for path in map(Path, config_list(retrieval_config)):
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise LeanAgentError(f"retrieval_config: cannot read {path} ({type(e).__name__})") from None
        if isinstance(loaded, dict) and isinstance(loaded.get("fit"), dict):
            loaded = loaded["fit"]
        trainer = loaded.get("trainer") if isinstance(loaded, dict) else None
        if not isinstance(trainer, dict):
            continue
        if isinstance(trainer.get("callbacks"), list):
            callbacks, named = trainer["callbacks"], path
        name = ((trainer.get("logger") or {}).get("init_args") or {}).get("name") if isinstance(trainer.get("logger"), dict) else None
        logger = name or logger
    for callback in callbacks or []:
        if isinstance(callback, dict) and str(callback.get("class_path", "")).endswith("ModelCheckpoint"):
            dirpath = (callback.get("init_args") or {}).get("dirpath")
            if not dirpath and logger and str(callback["class_path"]).startswith("leanagent."):
                return Path(default_dirpath(str(logger)))
            if not dirpath:
                break
            if Path(dirpath).is_absolute():
                raise LeanAgentError(
                    f"retrieval_config: {named}: the ModelCheckpoint dirpath {dirpath} is absolute, so every lifelong "
                    "stage would write into the same folder; give a relative dirpath (each stage's fit runs in its own folder)"
                )
            return Path(dirpath)
    where = named or ", ".join(config_list(retrieval_config))
    raise LeanAgentError(
        f"retrieval_config: {where} names no ModelCheckpoint callback with a dirpath or a logger name; lifelong stages "
        "need one (e.g. leanagent.callbacks.checkpoints.ModelCheckpoint with dirpath: checkpoints/retrieval, save_last: true)"
    )


class LifelongRun:
    def __init__(self, settings: LifelongSettings) -> None:
        check_settings(settings)
        self.settings = settings
        self.out = Path(settings.output_dir).resolve()
        self.state_path = self.out / "state.json"
        self.checkpoints = checkpoint_folder(settings.retrieval_config)  # relative to a stage's fit folder

    def _load_state(self, order: list[str]) -> dict:
        fingerprint = settings_fingerprint(self.settings)
        if self.state_path.is_file():
            state = read_json(self.state_path)
            check_state_shape(state, self.state_path)
            if state.get("fingerprint") != fingerprint or state.get("order") != order:
                raise LeanAgentError(
                    f"{self.out} holds a lifelong run with other settings; choose another output_dir or delete it"
                )
            return state
        return {"fingerprint": fingerprint, "order": order, "settings": asdict(self.settings), "stages": []}

    def run(self) -> dict:
        """Run (or finish) every stage; returns the report summary that results.json holds."""
        # A signal in this process (between stages' commands, in an evaluation) stops the run with one line
        # and 128 + signal; finished stages are kept, the stopped one is redone (leanagent/interrupts.py).
        with stop_on_signals("the lifelong run", RESUME):
            return self._run_all()

    def _run_all(self) -> dict:
        created = missing_folders(self.out)
        ensure_writable(self.out, "output_dir")
        self.out.mkdir(parents=True, exist_ok=True)
        # One run per output_dir: a second command on the same folder (run twice, a requeued job whose first
        # attempt still runs) would take the same stages and overwrite the first's files as they are written.
        busy = (f"output_dir {self.out} is in use by another lifelong run: wait for it to end (the same command "
                "then continues it), or choose another output_dir")
        with folder_lock(self.out, "lifelong", busy):
            return self._run_locked(created)

    def _run_locked(self, created: list[Path]) -> dict:
        try:
            order, repos, state = self._prepare()
        except BaseException:  # stopped before any stage ran (bundled splits may have been written): a new run leaves nothing
            self._remove(created)
            raise
        try:
            return self._run_stages(order, repos, state)
        except StageRefused as e:
            # The first stage of a new run refused a setting (bad input, nothing trained): leave no output_dir. One
            # that refused after it saved a checkpoint (a loss gone NaN in a later epoch, its Fisher pass) keeps them.
            if created and not state["stages"] and not any(self.out.glob("stages/*/**/*.ckpt")):
                self._remove(created)
                raise ReportedError(f"{e.what} stopped on the error above; {self.out} was removed") from None
            raise

    def _remove(self, created: list[Path]) -> None:
        """The output_dir this run made, and the parents it made when nothing else went there."""
        if not created:
            return
        shutil.rmtree(self.out, ignore_errors=True)
        remove_empty_folders(created[1:])

    def _prepare(self) -> tuple[list[str], dict[str, Path], dict]:
        """The repositories, their order and the run's state, checked before the first stage."""
        s = self.settings
        repos = {name: path.resolve() for name, path in resolve_repositories(s.repositories, self.out, s.split).items()}
        splits = check_splits(repos, s.split, train_alone=s.construction == "single_repo")
        if s.construction == "merge_all":  # a cycle across repositories: refused now, not after stages have trained
            check_mergeable(list(repos.values()))
        order = repository_order(s, repos, splits)
        state = self._load_state(order)
        data = {name: repository_data(path, s.split) for name, path in repos.items()}
        check_same_data(state.get("data"), data, self.out)
        state["data"] = data
        if state["stages"]:
            recorded_start_unchanged(state.get("start_weights"), self.out)
        else:
            start = start_weights(self._check_stage_commands(order, repos), self._stage_dir(0, order[0]) / "fit")
            check_start_weights(state.get("start_weights"), start, self.out)
            state["start_weights"] = start
        return order, repos, state

    def _run_stages(self, order: list[str], repos: dict[str, Path], state: dict) -> dict:
        write_json(self.state_path, state)
        for index in range(len(state["stages"]), len(order)):
            with stop_on_signals(f"stage {index} on {order[index]}", RESUME):
                stage = self._run_stage(index, order, repos, state)
            state["stages"].append(stage)
            write_json(self.state_path, state)
            log.info("stage %d (%s) done: %d of %d", index, order[index], index + 1, len(order))
        return write_report(self.out, state, self.settings.metric_window)

    def _check_stage_commands(self, order: list[str], repos: dict[str, Path]) -> str:
        """stage_args go to every stage's fit and, with EWC, its Fisher command: both must take them.
        Returns the first fit's resolved config."""
        s = self.settings
        data = repos[order[0]]
        commands = {"fit": self._stage_fit_command(data)}
        if s.ewc.enabled and len(order) > 1:
            placeholder = self.out / "stage-check"  # never read or written: the command is only parsed
            commands["Fisher"] = self._fisher_command(data, placeholder.with_suffix(".ckpt"), placeholder.with_suffix(".safetensors"))
        return check_parses(commands, self.out)["fit"]

    def _stage_dir(self, index: int, name: str) -> Path:
        return self.out / "stages" / f"{index:02d}-{name.replace('/', '-')}"  # owner/repo: one folder

    def _training_data(self, index: int, order: list[str], repos: dict[str, Path], stage_dir: Path) -> Path:
        if self.settings.construction == "single_repo":
            return repos[order[index]]
        target = stage_dir / "data"
        if not (target / "corpus.jsonl").is_file():  # merging is deterministic and atomic: done once per stage
            merge_datasets([repos[n] for n in order[: index + 1]], target, split=self.settings.split)
        return target

    def _run_stage(self, index: int, order: list[str], repos: dict[str, Path], state: dict) -> dict:
        s = self.settings
        name = order[index]
        stage_dir = self._stage_dir(index, name)
        stage_dir.mkdir(parents=True, exist_ok=True)
        data = self._training_data(index, order, repos, stage_dir)
        previous = state["stages"][-1] if state["stages"] else None

        fit = self._stage_fit_command(data)
        start = previous["checkpoint"] if previous is not None else None
        if start:  # the weights the stage starts from, before --ckpt_path restores them: its encoder mines the pools
            fit.append(f"--model.init_args.init_from={start}")
        if previous is not None and s.ewc.enabled and previous.get("fisher"):
            fit += [f"--model.init_args.fisher_path={previous['fisher']}",
                    f"--model.init_args.ewc_lambda={s.ewc.ewc_lambda}", f"--model.init_args.ewc_form={s.ewc.form}"]
        progress = self._fit_progress(stage_dir)
        if progress == "finished":
            log.info("stage %d: its fit had finished before the interruption", index)
        else:
            if progress == "interrupted":
                start = str(self._last_checkpoint(stage_dir))
                log.info("stage %d: continuing its interrupted fit from %s", index, start)
            elif (stage_dir / "fit").exists():
                shutil.rmtree(stage_dir / "fit")  # started but saved nothing: start the fit again
            run_stage(fit + ([f"--ckpt_path={start}"] if start else []), stage_dir / "fit", f"stage {index} fit on {name}")
        began_from = previous["checkpoint"] if previous is not None else (state.get("start_weights") or {}).get("path")
        checkpoint = self._handover_checkpoint(index, stage_dir, began_from)

        fisher = None
        if s.ewc.enabled and index < len(order) - 1:
            done = stage_dir / "fisher.safetensors"
            fisher = done if done.is_file() else self._fisher(index, name, data, checkpoint, stage_dir, previous)

        seen = {n: (repos[n] / s.split, repos[n] / "corpus.jsonl") for n in order[: index + 1]}
        # Every seen repository on val (hybrid's weight for it) then test; the stage's own val is its plasticity.
        evaluated = evaluate_splits(checkpoint, seen, ("val", "test"), s.eval_precision, s.eval_batch_size)
        test, val = evaluated["test"], evaluated["val"][name]
        for handed_over in filter(None, (checkpoint, fisher)):  # on disk before state.json names them
            sync_to_disk(handed_over)
        stage = {"index": index, "repository": name, "checkpoint": str(checkpoint),
                 "fisher": str(fisher) if fisher else None, "test": test, "val": val}
        write_json(stage_dir / "stage.json", stage)
        return stage

    def _last_checkpoint(self, stage_dir: Path) -> Path:
        return stage_dir / "fit" / self.checkpoints / "last.ckpt"

    def _fit_progress(self, stage_dir: Path) -> str:
        """`none`, `interrupted` (a resumable last.ckpt of an unfinished fit) or `finished`."""
        last = self._last_checkpoint(stage_dir)
        if not last.is_file():
            return "none"
        try:
            return "finished" if fit_state(load_checkpoint(last)).finished else "interrupted"
        except LeanAgentError:
            return "none"

    def _handover_checkpoint(self, index: int, stage_dir: Path, began_from: str | None) -> Path:
        s = self.settings
        return handover_checkpoint(index, stage_dir / "fit", self._last_checkpoint(stage_dir), stage_dir,
                                   s.resume_from, s.fine_tuned_share, began_from)

    def _fisher(self, index: int, name: str, data: Path, checkpoint: Path, stage_dir: Path, previous: dict | None) -> Path:
        s = self.settings
        new = stage_dir / "fisher-stage.safetensors"
        # The Fisher module reads the stage's checkpoint: its encoder and sequence length, whatever the Fisher config says.
        hparams = load_checkpoint(checkpoint, f"stage {index} checkpoint").get("hyper_parameters") or {}
        shape = [f"--{key}={hparams[name]}" for key, name in
                 (("model.init_args.model_name", "model_name"), ("data.max_seq_len", "max_seq_len")) if name in hparams]
        command = self._fisher_command(data, checkpoint, new, *shape)
        run_stage(command, stage_dir / "fisher", f"stage {index} Fisher on {name}")
        combined = stage_dir / "fisher.safetensors"
        if previous is not None and previous.get("fisher"):
            combine_fisher(previous["fisher"], new, s.ewc.gamma, combined)
        else:
            new.replace(combined)
        return combined

    def _stage_fit_command(self, data: Path) -> list[str]:
        s = self.settings
        return self._fit_command(s.retrieval_config, data, f"--progressive.epochs_per_repo={s.epochs_per_repo}")

    def _fisher_command(self, data: Path, checkpoint: Path, output: Path, *extra: str) -> list[str]:
        return self._fit_command(self.settings.fisher_config, data, f"--model.init_args.ckpt_path={checkpoint}",
                                 f"--model.init_args.output_path={output}", *extra)

    def _fit_command(self, configs: str | list[str], data: Path, *extra: str) -> list[str]:
        """`python -m leanagent fit` on a stage's data; the user's stage_args come last and win."""
        s = self.settings
        composed = [arg for config in config_list(configs) for arg in ("--config", str(Path(config).resolve()))]
        return [sys.executable, "-m", "leanagent", "fit", *composed,
                f"--data.data_path={data / s.split}", f"--data.corpus_path={data / 'corpus.jsonl'}", *extra,
                f"--seed_everything={s.seed}", "--trainer.enable_progress_bar=false", *s.stage_args]
