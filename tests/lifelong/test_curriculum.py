import json
import math
from pathlib import Path

import numpy as np
import pytest

from leanagent.errors import LeanAgentError
from leanagent.lifelong.curriculum import (
    RepoDifficulty,
    classify_complexity,
    compute_curriculum,
    format_curriculum,
    theorem_complexity,
)
from tests.conftest import shared_data

E = math.e


def theorem(name: str, steps: int | str) -> dict:
    """`steps` tactics, or the string "sorry" for a one-tactic proof by sorry."""
    tactics = [{"tactic": "sorry"}] if steps == "sorry" else [{"tactic": f"t{k}"} for k in range(steps)]
    return {"file_path": "A.lean", "full_name": name, "traced_tactics": tactics}


def write_repo(root: Path, name: str, split: str = "random", **parts: list) -> Path:
    folder = root / name
    (folder / split).mkdir(parents=True)
    for part in ("train", "val", "test"):
        thms = [theorem(f"{name}.{part}{k}", s) for k, s in enumerate(parts.get(part, []))]
        (folder / split / f"{part}.json").write_text(json.dumps(thms))
    return folder


@pytest.fixture
def toy(tmp_path):
    # Given in this order on purpose: the expected order is alpha, gamma, delta, beta.
    return {
        "beta": write_repo(tmp_path, "beta", train=[3, 0], val=[2], test=[5]),
        "gamma": write_repo(tmp_path, "gamma", train=[1, 4], test=[1]),
        "delta": write_repo(tmp_path, "delta", train=[1, 1]),
        "alpha": write_repo(tmp_path, "alpha", train=[1, 1, 2], val=[1]),
    }


def test_toy_curriculum(toy):
    c = compute_curriculum(toy)
    # 13 theorems sorted by complexity: e x7, e^2 x2, e^3, e^4, e^5, inf (beta's empty proof)
    # p33: rank 12*0.33 = 3.96, between two e's -> e
    # p67: rank 12*0.67 = 8.04, between e^2 (index 8) and e^3 -> e^2 + 0.04 (e^3 - e^2)
    assert c.p33 == pytest.approx(E)
    assert c.p67 == pytest.approx(E**2 + 0.04 * (E**3 - E**2))
    # one step (= p33) is easy, two steps (7.39 <= 7.90) medium, three or more hard
    assert c.counts == {
        "beta": RepoDifficulty(easy=0, medium=1, hard=3, unproved=1),
        "gamma": RepoDifficulty(easy=2, medium=0, hard=1, unproved=0),
        "delta": RepoDifficulty(easy=2, medium=0, hard=0, unproved=0),
        "alpha": RepoDifficulty(easy=3, medium=1, hard=0, unproved=0),
    }
    # most easy first; gamma and delta tie at 2 and keep their given order
    assert c.order == ["alpha", "gamma", "delta", "beta"]
    assert c.split == "random"


def test_percentiles_match_numpy_on_finite_values(tmp_path):
    steps = [1, 2, 2, 3, 5, 8, 9]
    c = compute_curriculum({"r": write_repo(tmp_path, "r", train=steps)})
    assert c.p33 == pytest.approx(np.percentile(np.exp(steps), 33))
    assert c.p67 == pytest.approx(np.percentile(np.exp(steps), 67))


def test_unproved_stay_hard_when_thresholds_are_inf(tmp_path):
    # complexities e, inf, inf: p33 at rank 0.66 interpolates towards inf -> inf
    c = compute_curriculum({"r": write_repo(tmp_path, "r", train=[1, 0, "sorry"])})
    assert math.isinf(c.p33) and math.isinf(c.p67)
    assert c.counts["r"] == RepoDifficulty(easy=1, medium=0, hard=2, unproved=2)


def test_complexity_and_classification():
    assert theorem_complexity(theorem("x", 3)) == pytest.approx(E**3)
    assert theorem_complexity(theorem("x", 0)) == math.inf
    assert theorem_complexity(theorem("x", "sorry")) == math.inf
    assert classify_complexity(E, E, 10.0) == "easy"
    assert classify_complexity(10.0, E, 10.0) == "medium"
    assert classify_complexity(10.5, E, 10.0) == "hard"
    assert classify_complexity(E, 100.0, 100.0, proved=False) == "hard"


def test_split_is_a_parameter(tmp_path):
    root = write_repo(tmp_path, "r", split="novel_premises", train=[1, 2, 3])
    assert compute_curriculum({"r": root}, split="novel_premises").counts["r"].total == 3
    with pytest.raises(LeanAgentError, match="random/train.json"):
        compute_curriculum({"r": root})


def test_errors(tmp_path):
    with pytest.raises(LeanAgentError, match="at least one"):
        compute_curriculum({})
    with pytest.raises(LeanAgentError, match="'nope': dataset folder not found"):
        compute_curriculum({"nope": tmp_path / "nope"})
    with pytest.raises(LeanAgentError, match="no theorems"):
        compute_curriculum({"empty": write_repo(tmp_path, "empty")})
    bad = write_repo(tmp_path, "bad", train=[1])
    (bad / "random" / "val.json").write_text(json.dumps([{"full_name": "oops"}]))
    with pytest.raises(LeanAgentError, match=r"val.json: theorem #0 \(oops\): 'traced_tactics'"):
        compute_curriculum({"bad": bad})


def test_format_lists_repositories_in_order(toy):
    text = format_curriculum(compute_curriculum(toy))
    lines = text.splitlines()
    assert "13 theorems" in lines[0]
    assert "p33 = 2.718 (S = 1.00)" in lines[1]
    table = lines[lines.index("") + 1 :]
    assert table[0].split() == ["#", "repository", "easy", "medium", "hard", "no", "proof", "total"]
    assert [row.split() for row in table[1:]] == [
        ["1", "alpha", "3", "1", "0", "0", "4"],
        ["2", "gamma", "2", "0", "1", "0", "3"],
        ["3", "delta", "2", "0", "0", "0", "2"],
        ["4", "beta", "0", "1", "3", "1", "4"],
    ]


def test_real_lifelong_slices():
    # ~84% of these theorems have one tactic, so p33 = p67 = e: easy = one-step, medium empty.
    root = shared_data("lifelong")
    names = ["mathlib-logic", "mathlib-data-nat", "mathlib-data-list", "mathlib-data-set", "mathlib-group"]
    c = compute_curriculum({n: root / n for n in names})
    assert c.p33 == pytest.approx(E) and c.p67 == pytest.approx(E)
    for n in names:
        meta = json.loads((root / n / "metadata.json").read_text())
        assert c.counts[n].total == meta["num_theorems"]
        assert c.counts[n].medium == 0
    assert c.order == ["mathlib-data-set", "mathlib-group", "mathlib-data-list", "mathlib-logic", "mathlib-data-nat"]
