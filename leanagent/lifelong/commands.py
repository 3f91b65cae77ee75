"""The commands beside LightningCLI's fit/validate/test/predict: `lifelong`, `ablation`, `curriculum`, `merge`.

Each is a jsonargparse parser (the same `--config`, `--print_config` and `--help` as fit's) and a function
that runs on the parsed settings. leanagent/cli.py registers them as subcommands of the one app.
"""

from __future__ import annotations

import logging
from argparse import ArgumentError
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from jsonargparse import ActionConfigFile, ArgumentParser, Namespace

from leanagent.cli_errors import check_config_files, summarize_parse_error
from leanagent.errors import LeanAgentError, refuse_repeats
from leanagent.io import ensure_writable, folder_lock, write_csv, write_json
from leanagent.lifelong.curriculum import compute_curriculum, format_curriculum
from leanagent.lifelong.report import final_averages
from leanagent.lifelong.repositories import Repositories, check_splits, resolve_repositories
from leanagent.lifelong.runner import LifelongRun
from leanagent.lifelong.settings import EWCSettings, LifelongSettings

log = logging.getLogger("leanagent")


@dataclass
class Setup:
    """One row of LeanAgent's Table 4: repository order, dataset construction, EWC on or off."""

    name: str
    order: Literal["curriculum", "given"] = "curriculum"
    construction: Literal["single_repo", "merge_all"] = "single_repo"
    ewc: bool = False


@dataclass
class AblationSettings:
    # One lifelong config, or several composed in order (as repeated --config composes them).
    base: str | list[str] = "configs/lifelong.yaml"
    output_dir: str = "results/ablation"
    setups: list[Setup] = field(default_factory=list)


def _settings_parser(kind: type, description: str, **kwargs: Any) -> ArgumentParser:
    parser = ArgumentParser(description=description, **kwargs)
    parser.add_argument("-c", "--config", action=ActionConfigFile, help="a YAML file of settings; repeat to compose")
    parser.add_class_arguments(kind, as_group=False)
    return parser


def lifelong_parser(**kwargs: Any) -> ArgumentParser:
    return _settings_parser(LifelongSettings, "Run LeanAgent's lifelong learning over repositories.", **kwargs)


def ablation_parser(**kwargs: Any) -> ArgumentParser:
    return _settings_parser(AblationSettings, "Run every setup of LeanAgent's Table 4 and tabulate them.", **kwargs)


def curriculum_parser(**kwargs: Any) -> ArgumentParser:
    return _settings_parser(LifelongSettings, "Print the curriculum order a lifelong config would train in.", **kwargs)


def merge_parser(**kwargs: Any) -> ArgumentParser:
    from leanagent.lifelong.merge import DEFAULT_SPLITS

    parser = ArgumentParser(description="Merge dataset folders into one, as LeanAgent's Merge All builds it.", **kwargs)
    parser.add_argument("-c", "--config", action=ActionConfigFile, help="a YAML file of settings")
    parser.add_argument("sources", nargs="+", type=str, help="dataset folders (corpus.jsonl and split folders)")
    parser.add_argument("--out", type=str, required=True, help="the merged dataset folder to write")
    # One name (`--split random`) or a list (`--split '[random, novel_premises]'`).
    parser.add_argument("--split", type=str | list[str], default=list(DEFAULT_SPLITS), help="split folders to merge")
    parser.add_argument("--overwrite", type=bool, default=False, help="replace --out if it is an earlier merge (a dataset folder)")
    return parser


def lifelong_settings(config: Namespace) -> LifelongSettings:
    values = _plain(config)
    settings = LifelongSettings(**{k: v for k, v in values.items() if k not in ("repositories", "ewc")})
    settings.repositories = Repositories(**(values.get("repositories") or {}))
    settings.ewc = EWCSettings(**(values.get("ewc") or {}))
    return settings

def ablation_settings(config: Namespace) -> AblationSettings:
    values = _plain(config)
    setups = [s if isinstance(s, Setup) else Setup(**s) for s in values["setups"]]
    if not setups:
        raise LeanAgentError("setups: the ablation has no setup to run")
    for setup in setups:  # each is a folder of output_dir: `a/`, `..` or `x/y` would share or leave it
        if not setup.name or setup.name in (".", "..") or any(c in setup.name for c in "/\\"):
            raise LeanAgentError(f"setups: name {setup.name!r} must be one folder name (its output folder in "
                                 "output_dir): no '/', '.' or '..'")
    refuse_repeats([setup.name for setup in setups], "setups", "each setup needs a name of its own (its output folder)")
    for path in [values["base"]] if isinstance(values["base"], str) else values["base"]:
        if not Path(path).is_file():
            raise LeanAgentError(f"base: {path} is not a file (the lifelong config each setup starts from)")
    return AblationSettings(base=values["base"], output_dir=values["output_dir"], setups=setups)


def _plain(config: Namespace) -> dict[str, Any]:
    values = config.as_dict() if isinstance(config, Namespace) else dict(config)
    for key in ("config", "__path__", "__default_config__"):
        values.pop(key, None)
    return values


def parse_lifelong(argv: list[str]) -> LifelongSettings:
    return lifelong_settings(lifelong_parser(exit_on_error=False).parse_args(argv))


def parse_ablation(argv: list[str]) -> AblationSettings:
    return ablation_settings(ablation_parser(exit_on_error=False).parse_args(argv))


def run_lifelong(config: Namespace) -> dict:
    settings = lifelong_settings(config)
    summary = LifelongRun(settings).run()
    print(format_table([{"order": " > ".join(summary["order"]), **summary["metrics"], **final_averages(summary)}]))
    print(f"results in {settings.output_dir}: results.json, evaluations.csv, lifelong.png")
    return summary


def run_ablation(config: Namespace) -> list[dict]:
    ablation = ablation_settings(config)
    bases = [ablation.base] if isinstance(ablation.base, str) else list(ablation.base)
    base_argv = [arg for path in bases for arg in ("--config", path)]
    check_config_files(base_argv, label="base:")
    try:
        base = parse_lifelong(base_argv)
    except ArgumentError as e:  # otherwise summarised against the ablation's own argv, blaming its file
        raise LeanAgentError(f"base: {summarize_parse_error(str(e), base_argv)}") from None
    rows = []
    out = Path(ablation.output_dir)
    for setup in ablation.setups:
        settings = replace(base, output_dir=str(out / setup.name), order=setup.order, construction=setup.construction,
                           ewc=replace(base.ewc, enabled=setup.ewc))
        log.info("ablation setup %s: order=%s construction=%s ewc=%s", setup.name, setup.order, setup.construction, setup.ewc)
        summary = LifelongRun(settings).run()
        rows.append({"setup": setup.name, "order": setup.order, "construction": setup.construction, "ewc": setup.ewc,
                     **summary["metrics"], **final_averages(summary), "stages": len(summary["test_recall10_matrix"])})
    write_json(out / "ablation.json", rows)
    write_csv(out / "ablation.csv", rows)
    print(format_table(rows))
    return rows


def run_curriculum(config: Namespace) -> None:
    settings = lifelong_settings(config)
    ensure_writable(settings.output_dir, "output_dir")  # a bundled dataset's repositories are written there
    out = Path(settings.output_dir)
    # Other settings split the bundled dataset again, replacing the folders a lifelong run in output_dir reads.
    busy = (f"output_dir {out} is in use by a lifelong run, whose repositories this command would write again: "
            "wait for it to end, or give another output_dir")
    with folder_lock(out, "lifelong", busy) if settings.repositories.data_root is None else nullcontext():
        repos = resolve_repositories(settings.repositories, out, settings.split)
    # What a lifelong run refuses before its first stage is refused here too: the order shown is one a run takes.
    theorems = check_splits(repos, settings.split, train_alone=settings.construction == "single_repo")
    print(format_curriculum(compute_curriculum(repos, settings.split, theorems)))


def run_merge(config: Namespace) -> None:
    """One dataset folder from several; recipes that train on many repositories at once read it."""
    from leanagent.lifelong.merge import merge_datasets

    stats = merge_datasets([Path(s) for s in config.sources], Path(config.out), config.split, overwrite=config.overwrite)
    counts = ", ".join(f"{name} {parts}" for name, parts in stats.theorems.items())
    print(f"merged {len(config.sources)} datasets into {config.out}: {stats.files} files, {stats.premises} premises; "
          f"theorems: {counts}")
    for name, count in stats.repeated_theorems.items():
        if count:  # LeanDojo names a theorem by its file and full name: the last source's copy is kept
            moved = stats.kept_out_of_train.get(name, 0)
            print(f"{name}: {count} theorem(s) given more than once (same file_path and full_name) were kept once, "
                  f"as the last source gives them" + (f"; {moved} of them left train for another source's val or test"
                                                      if moved else ""))


def format_table(rows: list[dict]) -> str:
    columns = list(rows[0])
    cells = [[f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = lambda values: "  ".join(v.rjust(w) for v, w in zip(values, widths))
    return "\n".join([line(columns), *(line(row) for row in cells)])


@dataclass(frozen=True)
class Command:
    """A subcommand of the app: its parser (built with the app's parser options) and what runs it."""

    parser: Callable[..., ArgumentParser]
    run: Callable[[Namespace], object]


COMMANDS: dict[str, Command] = {
    "lifelong": Command(lifelong_parser, run_lifelong),
    "ablation": Command(ablation_parser, run_ablation),
    "curriculum": Command(curriculum_parser, run_curriculum),
    "merge": Command(merge_parser, run_merge),
}
