"""Several lifelong runs of one curriculum side by side (seeds, settings), and their mean, min and max.

    python -m benchmarks.lifelong_runs RUN [RUN ...]

A RUN is a lifelong output_dir or its results.json. For each run: the dense test R@10 of each repository
after its own stage (the matrix's diagonal), its val R@10 there (what IP is computed from), FM, EBWT and IP,
and the final average test R@10 of dense, BM25 and hybrid. One seed moves a stage by points on small
repositories, so a setting is judged on the spread of several runs rather than on one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.arguments import benchmark_parser, run
from leanagent.errors import LeanAgentError
from leanagent.io import read_json


def _field(summary: dict, path: Path, *keys: str) -> object:
    value: object = summary
    for depth, key in enumerate(keys):
        if not isinstance(value, dict) or key not in value:
            raise LeanAgentError(f"{path}: field '{'.'.join(keys[: depth + 1])}' is missing; not a lifelong run's results.json")
        value = value[key]
    return value


def _numbers(value: object, path: Path, name: str, length: int) -> list[float]:
    if (not isinstance(value, list) or len(value) != length
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)):
        raise LeanAgentError(f"{path}: field '{name}' must be a list of {length} numbers")
    return [float(x) for x in value]


def run_row(target: Path) -> tuple[list[str], dict[str, list[float]]]:
    """The order and the figures of one run, from its results.json."""
    path = target / "results.json" if target.is_dir() else target
    summary = read_json(path)
    if not isinstance(summary, dict):
        raise LeanAgentError(f"{path}: a {type(summary).__name__}, not a lifelong run's results.json")
    order = _field(summary, path, "order")
    if not isinstance(order, list) or not order or not all(isinstance(name, str) for name in order):
        raise LeanAgentError(f"{path}: field 'order' must be a non-empty list of repository names")
    stages = len(order)
    matrix = _field(summary, path, "test_recall10_matrix")
    if not isinstance(matrix, list) or len(matrix) != stages:
        raise LeanAgentError(f"{path}: field 'test_recall10_matrix' must have one row per stage ({stages})")
    own = [_numbers(row, path, f"test_recall10_matrix[{i}]", i + 1)[i] for i, row in enumerate(matrix)]
    figures = {"own test": own, "own val": _numbers(_field(summary, path, "val_recall10"), path, "val_recall10", stages)}
    for metric in ("FM", "EBWT", "IP"):
        figures[metric] = _numbers([_field(summary, path, "metrics", metric)], path, f"metrics.{metric}", 1)
    final = {"dense": _field(summary, path, "average_test_recall10")}
    for ranking in ("bm25", "hybrid"):
        final[ranking] = _field(summary, path, "baselines", ranking, "average_test_recall10")
    for ranking, averages in final.items():
        name = "average_test_recall10" if ranking == "dense" else f"baselines.{ranking}.average_test_recall10"
        figures[f"final {ranking}"] = _numbers(averages, path, name, stages)[-1:]
    return order, figures


def _cells(values: list[float], decimals: int) -> str:
    return " ".join(f"{v:5.{decimals}f}" for v in values)


def main() -> None:
    p = benchmark_parser(__doc__)
    p.add_argument("runs", nargs="+", type=Path, help="lifelong output folders or their results.json")
    args = p.parse_args()
    rows = {}
    order = None
    for target in args.runs:
        run_order, figures = run_row(target)
        if order is not None and run_order != order:
            raise LeanAgentError(f"{target}: its order ({' > '.join(run_order)}) is not the first run's ({' > '.join(order)})")
        order = run_order
        rows[str(target)] = figures
    print("order: " + " > ".join(order))
    width = max(len(name) for name in [*rows, "mean"])
    header = ["own test R@10 per stage".ljust(6 * len(order) - 1), "own val R@10 per stage".ljust(6 * len(order) - 1),
              "   FM", " EBWT", "   IP", "dense", " BM25", "hybrid"]
    print(f"{'run':{width}}  " + "  ".join(header))

    def line(name: str, f: dict[str, list[float]]) -> str:
        finals = " ".join(f"{f[k][0]:5.1f}" for k in ("final dense", "final bm25", "final hybrid"))
        return (f"{name:{width}}  {_cells(f['own test'], 1)}  {_cells(f['own val'], 1)}  "
                f"{_cells(f['FM'], 2)} {_cells(f['EBWT'], 2)} {_cells(f['IP'], 2)}  {finals}")

    for name, figures in rows.items():
        print(line(name, figures))
    if len(rows) > 1:
        for name, reduce in (("mean", np.mean), ("min", np.min), ("max", np.max)):
            keys = next(iter(rows.values())).keys()
            print(line(name, {k: list(reduce([f[k] for f in rows.values()], axis=0)) for k in keys}))


if __name__ == "__main__":
    run(main)
