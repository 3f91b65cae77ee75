"""The tree shows the architecture: layers import only downward, modules stay small, no name means two things."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "leanagent"

# Lowest first. A module may import from its own layer or a lower one (README, "Layout").
LAYERS: list[tuple[str, ...]] = [
    ("errors", "io", "checkpoint_files", "distributed", "compat", "cli_errors", "precision", "interrupts", "console"),
    ("faults",),
    ("corpus",),
    ("retrieval",),
    ("ewc",),
    ("pretrained",),
    ("models",),
    ("data",),
    ("callbacks",),
    ("lifelong",),
    ("cli", "cli_config", "entry", "__main__"),
]
MAX_LINES = 400


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def layer_of(dotted: str) -> int:
    """`leanagent.models.retriever` -> the layer of `models`; a package's __init__ belongs to the package."""
    top = dotted.split(".")[1] if dotted.count(".") else ""
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    raise AssertionError(f"{dotted}: in no layer of tests/test_layout.py (add its package to LAYERS and the README)")


def dotted_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("leanagent"):
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names if node.module == "leanagent"]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names if a.name.startswith("leanagent")]
    return [n for n in names if n != "leanagent"]


def test_every_module_is_in_a_layer():
    for path in modules():
        layer_of(dotted_name(path)) if dotted_name(path) != "leanagent" else None


def test_no_module_imports_from_a_higher_layer():
    upward = []
    for path in modules():
        name = dotted_name(path)
        if name == "leanagent":
            continue
        for target in imported(path):
            if layer_of(target) > layer_of(name):
                upward.append(f"{name} imports {target}")
    assert not upward, "\n".join(upward)


def test_no_module_is_over_the_size_limit():
    long = {str(p.relative_to(REPO)): n for p in modules() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, long


def test_no_two_modules_share_a_file_name():
    names = Counter(p.name for p in modules() if p.name != "__init__.py")
    assert not [n for n, count in names.items() if count > 1], names.most_common(3)
