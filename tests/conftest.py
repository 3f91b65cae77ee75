"""Shared fixtures: small hand-made datasets, a subset of the bundled one, and a CLI runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "data" / "batteries"
# Real datasets beside the checkout (../shared, as CI lays it out) or inside it; a fresh clone has neither.
SHARED_DATA = next((p for p in (REPO / "shared", REPO.parent / "shared") if p.is_dir()), REPO.parent / "shared") / "data"


def pytest_configure(config) -> None:
    """Under xdist, each worker's torch takes its share of the cores: two workers of two threads each on a
    2-core machine spend their time in each other's way (the fast stage ran hardly faster than one process)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        from leanagent.distributed import limit_cpu_threads

        limit_cpu_threads(workers)


def shared_data(*parts: str) -> Path:
    """A path under ../shared/data, or a skip that says why: only CI and developers have that folder."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"needs {path} (the project's shared datasets, present in CI, absent from a fresh clone)")
    return path


def premise(name: str, start: int, end: int, code: str | None = None) -> dict:
    return {"full_name": name, "code": code or f"theorem {name} : True", "start": [start, 1], "end": [end, 1], "kind": "commanddeclaration"}


def tactic(state: str, provenances: list[tuple[str, str]]) -> dict:
    return {
        "tactic": "simp",
        "annotated_tactic": ["simp", [{"full_name": n, "def_path": p, "def_pos": [1, 1], "def_end_pos": [1, 1]} for p, n in provenances]],
        "state_before": state,
        "state_after": "no goals",
    }


def theorem(path: str, name: str, line: int, tactics: list[dict]) -> dict:
    return {"url": "u", "commit": "c", "file_path": path, "full_name": name, "start": [line, 1], "end": [line + 1, 1], "traced_tactics": tactics}


def write_dataset(root: Path, corpus: list[dict], splits: dict[str, list[dict]], split_dir: str = "random") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "corpus.jsonl", "w") as f:
        for record in corpus:
            f.write(json.dumps(record) + "\n")
    (root / split_dir).mkdir(exist_ok=True)
    for name in ("train", "val", "test"):
        (root / split_dir / f"{name}.json").write_text(json.dumps(splits.get(name, [])))
    return root


def toy_corpus() -> list[dict]:
    """A.lean <- B.lean <- C.lean (C imports B imports A); D.lean stands alone."""
    return [
        {"path": "A.lean", "imports": [], "premises": [premise("a1", 1, 2), premise("a2", 3, 4), premise("a3", 5, 6)]},
        {"path": "B.lean", "imports": ["A.lean"], "premises": [premise("b1", 1, 2), premise("b2", 10, 12), premise("b3", 20, 22)]},
        {"path": "C.lean", "imports": ["B.lean"], "premises": [premise("c1", 1, 2), premise("c2", 30, 31)]},
        {"path": "D.lean", "imports": [], "premises": [premise("d1", 1, 2)]},
    ]


@pytest.fixture
def toy_dataset(tmp_path: Path) -> Path:
    train = [
        theorem("C.lean", "t1", 20, [tactic("⊢ t1", [("A.lean", "a1"), ("C.lean", "c1")]), tactic("⊢ t1'", [("B.lean", "b2")])]),
        theorem("B.lean", "t2", 15, [tactic("⊢ t2", [("A.lean", "a2"), ("Outside.lean", "x")])]),
    ]
    val = [theorem("C.lean", "t3", 40, [tactic("⊢ t3", [("C.lean", "c2"), ("B.lean", "b3")])])]
    test = [theorem("B.lean", "t4", 25, [tactic("⊢ t4", [("B.lean", "b3")]), tactic("⊢ none", [])])]
    return write_dataset(tmp_path / "toy", toy_corpus(), {"train": train, "val": val, "test": test})


# Files whose theorems the small datasets hold: together with everything they import, 17 of the bundled
# corpus's files and about a sixth of its premises, so that embedding the corpus (every evaluation does)
# stays cheap while states, positives and imports are real.
SMALL_FILES = (
    "Batteries/Data/UnionFind/Basic.lean", "Batteries/Data/UnionFind/Lemmas.lean", "Batteries/Data/Fin/Fold.lean",
    "Batteries/Data/AssocList.lean", "Batteries/Data/Nat/Lemmas.lean", "Batteries/Data/Float/Lemmas.lean", "Batteries/Logic.lean",
)


def corpus_closure(files: tuple[str, ...] | list[str]) -> list[dict]:
    """The bundled corpus's records of `files` and every file they import, transitively, in corpus order."""
    records = [json.loads(line) for line in (BUNDLED / "corpus.jsonl").read_text().splitlines() if line.strip()]
    by_path = {r["path"]: r for r in records}
    keep: set[str] = set()
    todo = list(files)
    while todo:
        path = todo.pop()
        if path not in keep:
            keep.add(path)
            todo.extend(by_path[path]["imports"])
    return [r for r in records if r["path"] in keep]


def write_subset(root: Path, n_train: int, n_eval: int, files: tuple[str, ...] | list[str] = SMALL_FILES) -> Path:
    """The first theorems with premises of `files` in each bundled split, and the part of the corpus they can see."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus_closure(files)))
    (root / "random").mkdir(exist_ok=True)
    for name, n in (("train", n_train), ("val", n_eval), ("test", n_eval)):
        theorems = json.loads((BUNDLED / "random" / f"{name}.json").read_text())
        picked = [t for t in theorems if t["file_path"] in files and any(tt["annotated_tactic"][1] for tt in t["traced_tactics"])]
        (root / "random" / f"{name}.json").write_text(json.dumps(picked[:n]))
    return root


@pytest.fixture(scope="session")
def mini_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_subset(tmp_path_factory.mktemp("mini") / "batteries-mini", n_train=20, n_eval=12)


def run_cli(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `main.py` as a user would, in a separate process (DDP children re-run this same command)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_"))}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, str(REPO / "main.py"), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture(autouse=True)
def _no_process_group_leak():
    """One test's process group must not leak into the next (as litgpt's conftest does)."""
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def retriever_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained byt5-tiny retriever saved as a Lightning checkpoint would be, without running fit."""
    return untrained_checkpoint(tmp_path_factory.mktemp("ckpt") / "retriever.ckpt", "byt5-tiny")


def untrained_checkpoint(path: Path, model_name: str, seed: int = 0) -> Path:
    """A randomly initialised retriever of `model_name`, saved as LightningCLI would save a checkpoint."""
    import pytorch_lightning as pl
    import torch

    from leanagent.models.retriever import PremiseRetriever

    pl.seed_everything(seed)
    model = PremiseRetriever(model_name=model_name, max_seq_len=64)
    hparams = {"_class_path": "leanagent.models.retriever.PremiseRetriever", **model.hparams}  # as LightningCLI saves it
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": hparams, "pytorch-lightning_version": pl.__version__}, path)
    return path


def main_job_model_settings() -> dict:
    """`model.init_args` of configs/retrieval.yaml: what a test of the main job's schedule or start expects."""
    import yaml

    return yaml.safe_load((REPO / "configs" / "retrieval.yaml").read_text())["model"]["init_args"]


def small_fit_args(dataset: Path, devices: int = 2, num_workers: int = 0) -> list[str]:
    """`main.py fit` on a small dataset: the shipped recipe, 2 epochs of batch 4, float32 for exact comparisons."""
    return [
        "fit", "--config", str(REPO / "configs" / "retrieval.yaml"), "--trainer.accelerator=cpu", f"--trainer.devices={devices}",
        "--trainer.precision=32-true", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        "--trainer.accumulate_grad_batches=1", f"--data.data_path={dataset / 'random'}",
        f"--data.corpus_path={dataset / 'corpus.jsonl'}", "--data.max_seq_len=64", "--data.batch_size=4",
        "--progressive.epochs_per_repo=2", f"--data.num_workers={num_workers}",
    ]


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory, mini_dataset: Path) -> tuple[Path, str]:
    """One real 2-rank fit of `small_fit_args(mini_dataset)`, shared by the end-to-end tests: (its folder, its stderr).

    Tests read its files and copy its checkpoint; none writes into its folder, so test order does not matter.
    """
    folder = tmp_path_factory.mktemp("trained")
    result = run_cli(small_fit_args(mini_dataset), cwd=folder)
    assert result.returncode == 0, result.stderr[-4000:]
    return folder, result.stderr


def config_args(names: list[str]) -> list[str]:
    """`--config configs/A --config configs/B ...`: configs composed in order, as repeated --config composes them."""
    return [arg for name in names for arg in ("--config", str(REPO / "configs" / name))]


@pytest.fixture
def clean_env(monkeypatch):
    """The CLI sets NCCL variables and may limit torch's threads: neither may leak into the next test."""
    for name in ("NCCL_TIMEOUT", "TORCH_NCCL_ASYNC_ERROR_HANDLING"):
        monkeypatch.delenv(name, raising=False)
    import torch

    threads = torch.get_num_threads()
    yield monkeypatch
    torch.set_num_threads(threads)
