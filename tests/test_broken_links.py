"""A path that is a symbolic link loop, or a link whose target is gone, is named as such wherever a setting
takes a path: "not found" would send the user looking for a file they can see in `ls`."""

from __future__ import annotations

from pathlib import Path

import pytest

from leanagent.checkpoint_files import load_checkpoint
from leanagent.data.datamodule import RetrievalDataModule
from leanagent.errors import LeanAgentError
from leanagent.io import require_file
from leanagent.lifelong.merge import merge_datasets
from leanagent.lifelong.repositories import Repositories, resolve_repositories
from leanagent.pretrained import resolve
from tests.conftest import BUNDLED
from tests.test_bad_inputs import one_error


def links(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """A two-link loop and a dangling link, each with the words its error must carry."""
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    (tmp_path / "gone").symlink_to("nowhere")
    return {
        "loop": (tmp_path / "a", "a is a symbolic link loop"),
        "dangling": (tmp_path / "gone", "gone is a symbolic link to nowhere, which does not exist"),
    }


CASES = {
    "a file setting": lambda p, tmp: require_file(p, "data.corpus_path"),
    "a checkpoint": lambda p, tmp: load_checkpoint(p),
    "a data folder": lambda p, tmp: RetrievalDataModule(data_path=str(p), corpus_path=str(BUNDLED / "corpus.jsonl")),
    "a lifelong data_root": lambda p, tmp: resolve_repositories(Repositories(data_root=str(p), names=["x"]), tmp),
    "a merge source": lambda p, tmp: merge_datasets([p, BUNDLED], tmp / "merged"),
    "an init_from": lambda p, tmp: resolve(str(p)),
}


@pytest.mark.parametrize("kind", ["loop", "dangling"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_link_is_named_not_called_missing(tmp_path, case, kind):
    path, words = links(tmp_path)[kind]
    with pytest.raises(LeanAgentError, match=words) as raised:
        CASES[case](path, tmp_path)
    assert "not found" not in str(raised.value)
    assert not (tmp_path / "merged").exists()


def test_a_lifelong_repository_that_is_a_broken_link_is_named(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "x").symlink_to("x")
    with pytest.raises(LeanAgentError, match=r"repositories\.names: 'x': .*x is a symbolic link loop"):
        resolve_repositories(Repositories(data_root=str(root), names=["x"]), tmp_path)


@pytest.mark.parametrize("kind", ["loop", "dangling"])
def test_a_config_file_that_is_a_broken_link_is_named(capsys, tmp_path, kind):
    path, words = links(tmp_path)[kind]
    assert one_error(capsys, ["fit", "--config", str(path)]).endswith(words)
