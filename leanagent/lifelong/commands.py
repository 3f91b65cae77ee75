"""Commands `lifelong`, `ablation`, `curriculum` (`python main.py <command> --config ...`) and `merge`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from jsonargparse import ActionConfigFile, ArgumentParser

from leanagent.io import write_csv, write_json
from leanagent.lifelong.curriculum import compute_curriculum, format_curriculum
from leanagent.lifelong.repositories import Repositories, resolve_repositories
from leanagent.lifelong.runner import EWCSettings, LifelongRun, LifelongSettings

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
    base: str = "configs/lifelong.yaml"
    output_dir: str = "results/ablation"
    setups: list[Setup] = field(default_factory=list)


def _parser(kind: type, prog: str, description: str) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=description, exit_on_error=True)
    parser.add_argument("--config", action=ActionConfigFile, help="a YAML file of settings")
    parser.add_class_arguments(kind, as_group=False)
    return parser


def parse_lifelong(argv: list[str]) -> LifelongSettings:
    parser = _parser(LifelongSettings, "main.py lifelong", "Run LeanAgent's lifelong learning over repositories.")
    config = parser.parse_args(argv).as_dict()
    config.pop("config", None)
    settings = LifelongSettings(**{k: v for k, v in config.items() if k not in ("repositories", "ewc")})
    settings.repositories = Repositories(**(config.get("repositories") or {}))
    settings.ewc = EWCSettings(**(config.get("ewc") or {}))
    return settings


def parse_ablation(argv: list[str]) -> AblationSettings:
    parser = _parser(AblationSettings, "main.py ablation", "Run every setup of LeanAgent's Table 4 and tabulate them.")
    config = parser.parse_args(argv).as_dict()
    setups = [Setup(**s) if isinstance(s, dict) else s for s in config["setups"]]
    return AblationSettings(base=config["base"], output_dir=config["output_dir"], setups=setups)


def run_ablation(argv: list[str]) -> list[dict]:
    ablation = parse_ablation(argv)
    base = parse_lifelong(["--config", ablation.base])
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


def final_averages(summary: dict) -> dict[str, float]:
    """The last stage's average test R@10 of the trained (dense) ranking, with BM25's and hybrid's beside it."""
    averages = {"final_avg_test_R@10": summary["average_test_recall10"][-1]}
    for ranking, baseline in summary.get("baselines", {}).items():
        averages[f"final_avg_test_R@10/{ranking}"] = baseline["average_test_recall10"][-1]
    return averages


def format_table(rows: list[dict]) -> str:
    columns = list(rows[0])
    cells = [[f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = lambda values: "  ".join(v.rjust(w) for v, w in zip(values, widths))
    return "\n".join([line(columns), *(line(row) for row in cells)])


def main(command: str, argv: list[str]) -> None:
    if command == "lifelong":
        settings = parse_lifelong(argv)
        summary = LifelongRun(settings).run()
        print(format_table([{"order": " > ".join(summary["order"]), **summary["metrics"], **final_averages(summary)}]))
        print(f"results in {settings.output_dir}: results.json, evaluations.csv, lifelong.png")
    elif command == "ablation":
        run_ablation(argv)
    elif command == "merge":
        run_merge(argv)
    elif command == "curriculum":
        settings = parse_lifelong(argv)
        repos = resolve_repositories(settings.repositories, Path(settings.output_dir))
        print(format_curriculum(compute_curriculum(repos, settings.split)))


def run_merge(argv: list[str]) -> None:
    """`python main.py merge --out DIR SOURCE...`: one dataset folder from several, as LeanAgent's Merge All builds it.

    Recipes that train on many repositories at once (configs/retrieval_mathlib.yaml) read its output.
    """
    from leanagent.lifelong.merge import DEFAULT_SPLITS, merge_datasets

    parser = ArgumentParser(prog="main.py merge", description=run_merge.__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", type=str, help="dataset folders (corpus.jsonl and split folders)")
    parser.add_argument("--out", type=str, required=True, help="the merged dataset folder to write")
    parser.add_argument("--split", type=list[str], default=list(DEFAULT_SPLITS), help="split folders to merge")
    parser.add_argument("--overwrite", type=bool, default=False, help="replace --out if it exists")
    args = parser.parse_args(argv)
    stats = merge_datasets([Path(s) for s in args.sources], Path(args.out), args.split, overwrite=args.overwrite)
    counts = ", ".join(f"{name} {parts}" for name, parts in stats.theorems.items())
    print(f"merged {len(args.sources)} datasets into {args.out}: {stats.files} files, {stats.premises} premises; theorems: {counts}")
