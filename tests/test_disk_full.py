"""A disk that refuses a file (full, quota, read-only): one `error:` line naming the file, exit 1, no temporary
file left, and what was written before it intact."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch
from pytorch_lightning.callbacks import ModelCheckpoint as LightningModelCheckpoint

import leanagent.lifelong.merge as merge_module
from leanagent.cli import main
from tests.test_bad_inputs import ONE_CPU, RETRIEVAL, data, in_tmp  # noqa: F401 (in_tmp: a fixture)


def disk_full(path: str) -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", path)


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]


def test_a_checkpoint_the_disk_refuses_is_one_error_and_leaves_the_earlier_one(in_tmp, toy_dataset, capsys, monkeypatch):
    """The second file of the fit (last.ckpt, after the best one) fails half-written, as on a full disk."""
    save = LightningModelCheckpoint._save_checkpoint
    calls = []

    def fills_the_disk(self, trainer, filepath):
        calls.append(filepath)
        if len(calls) == 1:
            return save(self, trainer, filepath)
        Path(filepath).write_bytes(b"PK\x03\x04 half a checkpoint")
        raise disk_full(filepath)

    monkeypatch.setattr(LightningModelCheckpoint, "_save_checkpoint", fills_the_disk)
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), "--data.batch_size=1", "--data.num_hard_negatives=0",
              "--data.num_negatives=1", "--trainer.accumulate_grad_batches=1", "--trainer.max_steps=2"])
    assert stop.value.code == 1
    (line,) = error_lines(capsys)
    assert "checkpoints/retrieval/last.ckpt" in line and "No space left on device" in line, line
    assert len(calls) == 2
    assert not [p for p in in_tmp.rglob("*") if p.name.endswith(".tmp")]
    (best,) = in_tmp.glob("checkpoints/retrieval/epoch=0-*.ckpt")
    assert torch.load(best, map_location="cpu", weights_only=True)["global_step"] == 2
    assert not (in_tmp / "checkpoints" / "retrieval" / "last.ckpt").exists()


def test_an_output_the_disk_refuses_is_one_error_and_writes_nothing(tmp_path, toy_dataset, capsys, monkeypatch):
    def fills_the_disk(path, obj):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text("[")
        raise disk_full(str(path))

    monkeypatch.setattr(merge_module, "write_json", fills_the_disk)
    out = tmp_path / "out" / "merged"
    with pytest.raises(SystemExit) as stop:
        main(["merge", "--out", str(out), str(toy_dataset), "--split", "random"])
    assert stop.value.code == 1
    (line,) = error_lines(capsys)
    assert line.startswith("error: cannot write ") and "No space left on device" in line, line
    assert not (tmp_path / "out").exists()  # nor the parent folder it made for it


def test_a_writer_that_reports_a_full_disk_in_its_own_words_still_names_the_file(tmp_path):
    """safetensors says "I/O error: No space left on device (os error 28)" in an error of its own type."""
    from safetensors import SafetensorError

    from leanagent.io import atomic_write

    def save(path: str) -> None:
        Path(path).write_bytes(b"\0" * 8)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    target = tmp_path / "new" / "fisher.safetensors"
    with pytest.raises(OSError) as failed:
        atomic_write(target, save)
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(target)
    assert not (tmp_path / "new").exists()


def test_files_written_whole_then_renamed_reach_the_disk_before_their_name(tmp_path, monkeypatch):
    """A power cut after the rename must not leave the name on an empty file: the temporary file is synced first,
    for writers that close the file themselves (torch.save, safetensors) as for our own JSON."""
    import os

    from leanagent.io import atomic_write, write_json, write_safetensors

    events: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda src, dst: (events.append(("replace", str(src))), replace(src, dst))[1])
    atomic_write(tmp_path / "a.ckpt", lambda tmp: torch.save({"w": torch.ones(2)}, tmp))
    write_safetensors(tmp_path / "b.safetensors", {"w": torch.ones(2)}, {"k": "v"})
    write_json(tmp_path / "c.json", {"k": 1})
    renamed = [path for kind, path in events if kind == "replace"]
    assert len(renamed) == 3
    for path in renamed:
        assert events.index(("fsync", path)) < events.index(("replace", path)), events
