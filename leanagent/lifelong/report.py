"""A lifelong run's results: every evaluation as a table (JSON and CSV), the six metrics, and a figure."""

from __future__ import annotations

from pathlib import Path

from leanagent.errors import LeanAgentError
from leanagent.io import atomic_write, write_csv, write_json
from leanagent.lifelong.lifelong_metrics import average_test_recall, lifelong_metrics


_STAGE_FIELDS = {"index": int, "repository": str, "checkpoint": str, "test": dict, "val": dict}
START_FIELDS = ("init_from", "path", "sha256")  # state.json's record of the weights stage 0 starts from


def check_state_shape(state: object, path: Path) -> None:
    """A resumed run trusts its state.json: one that is not a run's state (damaged, edited, another tool's) is
    refused here rather than failing in the report after the remaining stages have trained."""
    def refuse(what: str) -> None:
        raise LeanAgentError(f"{path}: {what}; not a lifelong run's state: delete it or choose another output_dir")

    if not isinstance(state, dict):
        refuse(f"a {type(state).__name__}, not an object")
    stages, order = state.get("stages"), state.get("order")
    if not isinstance(stages, list) or not isinstance(order, list):
        refuse("'stages' and 'order' must be lists")
    for position, stage in enumerate(stages):
        if not isinstance(stage, dict):
            refuse(f"stages[{position}] is a {type(stage).__name__}, not an object")
        for key, kind in _STAGE_FIELDS.items():
            if not isinstance(stage.get(key), kind) or isinstance(stage.get(key), bool):
                refuse(f"stages[{position}].{key} is missing or not a {kind.__name__}")
        if stage["index"] != position or position >= len(order) or stage["repository"] != order[position]:
            refuse(f"stages[{position}] is not stage {position} of its order")
        if not set(order[: position + 1]) <= set(stage["test"]):
            refuse(f"stages[{position}].test lacks a repository seen by then")
    start = state.get("start_weights")
    if start is not None and not (isinstance(start, dict) and all(isinstance(start.get(k), str) for k in START_FIELDS)):
        refuse("'start_weights' must be null or an object of strings init_from, path and sha256")
    data = state.get("data")
    if data is not None and not (isinstance(data, dict) and all(
            isinstance(files, dict) and all(isinstance(v, str) for v in files.values()) for files in data.values())):
        refuse("'data' must map each repository to the sha256 of its files")


def evaluation_rows(state: dict) -> list[dict]:
    rows = []
    for stage in state["stages"]:
        for split, results in (("test", stage["test"]), ("val", {stage["repository"]: stage["val"]})):
            for repository, metrics in results.items():
                rows.append({"stage": stage["index"], "trained_on": stage["repository"], "evaluated_on": repository,
                             "split": split, **metrics})
    return rows


# What the lifelong results are computed from: the trained (dense) ranking; BM25 and hybrid beside it.
RANKINGS = {"dense": "Recall@10", "bm25": "Recall@10/bm25", "hybrid": "Recall@10/hybrid"}


def recall_matrix(state: dict, ranking: str = "dense") -> list[list[float]]:
    """R[i][j]: test Recall@10 of `ranking` on the j-th repository of the order after stage i (j <= i)."""
    order, key = state["order"], RANKINGS[ranking]
    return [[stage["test"][order[j]][key] for j in range(stage["index"] + 1)] for stage in state["stages"]]


def write_report(out: Path, state: dict, window: int = 5) -> dict:
    """results.json, evaluations.csv and lifelong.png; the six metrics are the dense ranking's."""
    rows = evaluation_rows(state)
    matrices = {ranking: recall_matrix(state, ranking) for ranking in RANKINGS}
    val = {ranking: [stage["val"][key] for stage in state["stages"]] for ranking, key in RANKINGS.items()}
    metrics = {ranking: lifelong_metrics(matrices[ranking], val[ranking], window=window) for ranking in RANKINGS}
    summary = {"order": state["order"], "settings": state.get("settings"), "metrics": metrics["dense"],
               "test_recall10_matrix": matrices["dense"], "average_test_recall10": average_test_recall(matrices["dense"]),
               "val_recall10": val["dense"],
               "baselines": {ranking: {"metrics": metrics[ranking], "test_recall10_matrix": matrices[ranking],
                                       "average_test_recall10": average_test_recall(matrices[ranking])}
                             for ranking in ("bm25", "hybrid")},
               "evaluations": rows}
    write_json(out / "results.json", summary)
    write_csv(out / "evaluations.csv", rows)
    write_figure(out / "lifelong.png", state["order"], matrices)
    return summary


def final_averages(summary: dict) -> dict[str, float]:
    """The last stage's average test R@10 of the trained (dense) ranking, with BM25's and hybrid's beside it."""
    averages = {"final_avg_test_R@10": summary["average_test_recall10"][-1]}
    for ranking, baseline in summary.get("baselines", {}).items():
        averages[f"final_avg_test_R@10/{ranking}"] = baseline["average_test_recall10"][-1]
    return averages


def write_figure(path: Path, order: list[str], matrices: dict[str, list[list[float]]]) -> None:
    """Heatmap of the dense test R@10 per repository after each stage, beside the average test R@10
    curves of dense, BM25 and hybrid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    matrix = matrices["dense"]
    stages = len(matrix)
    grid = np.full((stages, len(order)), np.nan)
    for i, row in enumerate(matrix):
        grid[i, : len(row)] = row
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1.3, 1]})
    image = left.imshow(grid, cmap="viridis", vmin=0, vmax=max(1.0, float(np.nanmax(grid))))
    left.set_xticks(range(len(order)), order, rotation=35, ha="right", fontsize=8)
    left.set_yticks(range(stages), [f"after {order[i]}" for i in range(stages)], fontsize=8)
    left.set_xlabel("evaluated on (test)")
    left.set_title("Dense test Recall@10 after each stage")
    for i in range(stages):
        for j in range(len(matrix[i])):
            left.text(j, i, f"{grid[i, j]:.1f}", ha="center", va="center", color="white", fontsize=8)
    fig.colorbar(image, ax=left, fraction=0.046)
    for ranking, style in (("dense", "o-"), ("bm25", "s--"), ("hybrid", "^:")):
        right.plot(range(1, stages + 1), average_test_recall(matrices[ranking]), style, label=ranking)
    right.set_xticks(range(1, stages + 1))
    right.set_xlabel("stage (repositories learned)")
    right.set_ylabel("average test Recall@10 over seen repositories")
    right.set_title("Average test Recall@10")
    right.legend()
    right.grid(alpha=0.3)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
