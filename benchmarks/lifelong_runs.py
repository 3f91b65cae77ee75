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
from leanagent.lifelong.report import final_averages


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
    for keys in (("average_test_recall10",), *(("baselines", r, "average_test_recall10") for r in ("bm25", "hybrid"))):
        _numbers(_field(summary, path, *keys), path, ".".join(keys), stages)
    finals = final_averages(summary)  # what `lifelong` prints, read from the same file
    figures["final"] = [finals[f"final_avg_test_R@10{suffix}"] for suffix in ("", "/bm25", "/hybrid")]
    return order, figures


def _cells(values: list[float], decimals: int) -> str:
    return " ".join(f"{v:5.{decimals}f}" for v in values)


def main() -> None:
    p = benchmark_parser(__doc__)
    p.add_argument("runs", nargs="+", type=Path, help="lifelong output folders or their results.json")
    args = p.parse_args()
    rows = []
    order = None
    for target in args.runs:
        run_order, figures = run_row(target)
        if order is not None and run_order != order:
            raise LeanAgentError(f"{target}: its order ({' > '.join(run_order)}) is not the first run's ({' > '.join(order)})")
        order = run_order
        rows.append((str(target), figures))
    print("order: " + " > ".join(order))
    width = max(len(name) for name in [*(name for name, _ in rows), "mean"])
    header = ["own test R@10 per stage".ljust(6 * len(order) - 1), "own val R@10 per stage".ljust(6 * len(order) - 1),
              "   FM", " EBWT", "   IP", "dense", " BM25", "hybrid"]
    print(f"{'run':{width}}  " + "  ".join(header))

    def line(name: str, f: dict[str, list[float]]) -> str:
        return (f"{name:{width}}  {_cells(f['own test'], 1)}  {_cells(f['own val'], 1)}  "
                f"{_cells(f['FM'], 2)} {_cells(f['EBWT'], 2)} {_cells(f['IP'], 2)}  {_cells(f['final'], 1)}")

    for name, figures in rows:
        print(line(name, figures))
    if len(rows) > 1:
        for name, reduce in (("mean", np.mean), ("min", np.min), ("max", np.max)):
            print(line(name, {k: list(reduce([f[k] for _, f in rows], axis=0)) for k in rows[0][1]}))


if __name__ == "__main__":
    run(main)
