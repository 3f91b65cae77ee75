"""Ragged token tables and their memory-mapped per-node cache."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest

from leanagent.data import token_store
from leanagent.data.token_store import TokenTable, content_key, source_key, tokenize
from leanagent.models.tokenizer import ByteTokenizer
from tests.helpers import byt5_dense, gather_tokens, padded

TEXTS = ["ab", "é" + "x" * 10, "", "∀ x, x = x", "a" * 40, "⊢ True"]


class CountingTokenizer(ByteTokenizer):
    """Records every build in a file, so tests can count builds across processes."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def encode_ragged(self, texts, max_len):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return super().encode_ragged(texts, max_len)


def test_byte_ragged_encoding_holds_exactly_byt5s_rows():
    ids, lengths = byt5_dense(TEXTS, max_len=8)
    tokens, offsets = ByteTokenizer().encode_ragged(TEXTS, max_len=8)
    assert tokens.dtype == np.uint16 and offsets[-1] == len(tokens) == lengths.sum()
    for i in range(len(TEXTS)):
        assert tokens[offsets[i] : offsets[i + 1]].tolist() == ids[i, : lengths[i]].tolist()


@pytest.mark.parametrize("rows", [[0, 1, 2, 3, 4, 5], [4, -1, 0], [-1, -1], [2], [], [5, 5, 1]])
def test_ragged_gather_gives_the_dense_tables_batches(rows):
    ids, lengths = byt5_dense(TEXTS, max_len=16)
    table = TokenTable(*ByteTokenizer().encode_ragged(TEXTS, max_len=16))
    rows = np.asarray(rows, dtype=np.int64)
    want_ids, want_mask = gather_tokens(ids, lengths, rows)
    got_ids, got_mask = table.gather_numpy(rows)
    assert got_ids.dtype == want_ids.dtype and got_mask.dtype == want_mask.dtype
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_array_equal(got_mask, want_mask)
    np.testing.assert_array_equal(table.lengths, lengths)


def test_cached_table_is_memory_mapped_npy_and_reused(tmp_path):
    log = tmp_path / "builds"
    tokenizer = CountingTokenizer(log)
    first = tokenize(tokenizer, TEXTS, 16, cache_dir=tmp_path / "cache")
    second = tokenize(tokenizer, TEXTS, 16, cache_dir=tmp_path / "cache")
    assert log.read_text().count("\n") == 1  # built once, then read
    assert isinstance(second.tokens, np.memmap) and isinstance(second.offsets, np.memmap)
    assert not second.tokens.flags.writeable
    entry = tmp_path / "cache" / content_key(tokenizer, TEXTS, 16)
    assert sorted(p.name for p in entry.iterdir()) == ["offsets.npy", "tokens.npy"]
    for name in ("tokens.npy", "offsets.npy"):
        assert (entry / name).read_bytes()[:6] == b"\x93NUMPY"  # plain .npy, loadable without pickle
        np.load(entry / name, allow_pickle=False)
    np.testing.assert_array_equal(first.gather_numpy(np.arange(len(TEXTS)))[0], second.gather_numpy(np.arange(len(TEXTS)))[0])
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.endswith(".tmp")]


def test_changed_content_or_length_gets_a_new_entry(tmp_path):
    log = tmp_path / "builds"
    tokenizer = CountingTokenizer(log)
    cache = tmp_path / "cache"
    before = tokenize(tokenizer, TEXTS, 16, cache_dir=cache)
    changed = tokenize(tokenizer, TEXTS[:-1] + ["⊢ False"], 16, cache_dir=cache)
    shorter = tokenize(tokenizer, TEXTS, 4, cache_dir=cache)
    assert log.read_text().count("\n") == 3
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 3
    last = len(TEXTS) - 1
    assert before.gather_numpy(np.array([last]))[0].tolist() != changed.gather_numpy(np.array([last]))[0].tolist()
    assert shorter.lengths.max() == 4 and before.lengths.max() > 4
    # Moving text between neighbours changes the key too (texts are length-prefixed in the hash).
    assert content_key(tokenizer, ["ab", "c"], 16) != content_key(tokenizer, ["a", "bc"], 16)


def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    real_save = np.save
    calls = []

    def failing_save(f, array, allow_pickle=True):
        calls.append(allow_pickle)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_save(f, array, allow_pickle=allow_pickle)

    monkeypatch.setattr(token_store.np, "save", failing_save)
    table = tokenize(ByteTokenizer(), TEXTS, 16, cache_dir=cache)  # falls back to memory, with a warning
    assert calls == [False, False]  # never allowed to pickle
    assert not isinstance(table.tokens, np.memmap)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []  # no entry, no temporary folder
    monkeypatch.setattr(token_store.np, "save", real_save)
    assert isinstance(tokenize(ByteTokenizer(), TEXTS, 16, cache_dir=cache).tokens, np.memmap)


def test_a_build_killed_outright_leaves_a_folder_the_next_build_removes(tmp_path):
    """SIGKILL skips the cleanup an exception gets; the next build of that entry, under its lock, removes what
    is left (and only that entry's)."""
    cache = tmp_path / "cache"
    key = content_key(ByteTokenizer(), TEXTS, 16)
    killed = cache / f".{key}.k1ll3d_x.tmp"
    killed.mkdir(parents=True)
    (killed / "tokens.npy").write_bytes(b"half")
    other = cache / f".{'0' * 64}.abcdefgh.tmp"
    other.mkdir()
    assert isinstance(tokenize(ByteTokenizer(), TEXTS, 16, cache_dir=cache).tokens, np.memmap)
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == sorted([key, other.name])


@pytest.mark.parametrize("damage", ["truncated tokens", "offsets out of order", "offsets past the tokens"])
def test_a_damaged_entry_is_rebuilt(tmp_path, damage):
    cache = tmp_path / "cache"
    tokenize(ByteTokenizer(), TEXTS, 16, cache_dir=cache)
    entry = cache / content_key(ByteTokenizer(), TEXTS, 16)
    if damage == "truncated tokens":
        data = (entry / "tokens.npy").read_bytes()
        (entry / "tokens.npy").write_bytes(data[: len(data) // 2])
    else:  # the same shape and dtype, so only the offsets' values can tell
        offsets = np.load(entry / "offsets.npy")
        if damage == "offsets out of order":
            offsets[1], offsets[2] = offsets[2], offsets[1]
        else:
            offsets[-1] += 5
        np.save(entry / "offsets.npy", offsets)
    table = tokenize(ByteTokenizer(), TEXTS, 16, cache_dir=cache)
    ids, lengths = byt5_dense(TEXTS, 16)
    np.testing.assert_array_equal(table.gather_numpy(np.arange(len(TEXTS)))[0], gather_tokens(ids, lengths, np.arange(len(TEXTS)))[0])


def _build(args):
    log, cache = args
    table = tokenize(CountingTokenizer(Path(log)), TEXTS * 2000, 16, cache_dir=Path(cache))
    return int(table.tokens.sum())


def test_concurrent_ranks_build_the_entry_once(tmp_path):
    log = tmp_path / "builds"
    with multiprocessing.get_context("fork").Pool(4) as pool:
        sums = pool.map(_build, [(str(log), str(tmp_path / "cache"))] * 4)
    assert len(set(sums)) == 1
    assert log.read_text().count("\n") == 1


def test_no_cache_keeps_tokens_in_memory(tmp_path, monkeypatch):
    monkeypatch.setenv(token_store.CACHE_ENV, "off")
    assert token_store.default_cache_dir() is None
    table = tokenize(ByteTokenizer(), TEXTS, 16)
    assert not isinstance(table.tokens, np.memmap)
    monkeypatch.setenv(token_store.CACHE_ENV, str(tmp_path / "c"))
    assert isinstance(tokenize(ByteTokenizer(), TEXTS, 16).tokens, np.memmap)
    assert (tmp_path / "c").is_dir()


def test_datamodule_batches_are_unchanged_by_the_cache(toy_dataset, tmp_path, monkeypatch):
    from leanagent.data.datamodule import RetrievalDataModule

    monkeypatch.setenv(token_store.CACHE_ENV, str(tmp_path / "c"))
    dm = RetrievalDataModule(data_path=str(toy_dataset / "random"), corpus_path=str(toy_dataset / "corpus.jsonl"), max_seq_len=24)
    texts = dm.corpus.premise_texts("serialized")
    ids, lengths = byt5_dense(texts, 24)
    rows = np.array([3, -1, 0, len(texts) - 1])
    got_ids, got_mask = dm.corpus_tokens.gather(rows)
    want_ids, want_mask = gather_tokens(ids, lengths, rows)
    np.testing.assert_array_equal(got_ids.numpy(), want_ids)
    np.testing.assert_array_equal(got_mask.numpy(), want_mask)
    assert isinstance(dm.corpus_tokens.tokens, np.memmap) and isinstance(dm.state_tokens("train").tokens, np.memmap)


def test_texts_from_a_function_are_computed_only_to_build(tmp_path):
    calls = []

    def texts():
        calls.append(1)
        return TEXTS

    key = source_key(ByteTokenizer(), 16, "corpus bytes v1")
    first = tokenize(ByteTokenizer(), texts, 16, cache_dir=tmp_path, key=key)
    second = tokenize(ByteTokenizer(), texts, 16, cache_dir=tmp_path, key=key)
    assert len(calls) == 1 and isinstance(second.tokens, np.memmap)
    np.testing.assert_array_equal(first.lengths, byt5_dense(TEXTS, 16)[1])
    tokenize(ByteTokenizer(), texts, 16, cache_dir=tmp_path, key=source_key(ByteTokenizer(), 16, "corpus bytes v2"))
    assert len(calls) == 2
    assert source_key(ByteTokenizer(), 16, "ab", "c") != source_key(ByteTokenizer(), 16, "a", "bc")
    assert source_key(ByteTokenizer(), 16, "x") != source_key(ByteTokenizer(), 8, "x")
    with pytest.raises(ValueError):
        tokenize(ByteTokenizer(), texts, 16, cache_dir=tmp_path)


def test_datamodule_rebuilds_corpus_tokens_when_the_corpus_changes(toy_dataset, tmp_path, monkeypatch):
    import json

    from leanagent.data.datamodule import RetrievalDataModule

    monkeypatch.setenv(token_store.CACHE_ENV, str(tmp_path / "c"))

    def corpus_tokens():
        dm = RetrievalDataModule(data_path=str(toy_dataset / "random"), corpus_path=str(toy_dataset / "corpus.jsonl"), max_seq_len=64)
        texts = dm.corpus.premise_texts("serialized")
        return texts, dm.corpus_tokens

    texts, before = corpus_tokens()
    lines = (toy_dataset / "corpus.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["premises"][0]["code"] = "theorem a1 : 1 + 1 = 2"
    lines[0] = json.dumps(record)
    (toy_dataset / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    new_texts, after = corpus_tokens()
    assert new_texts != texts
    ids, lengths = byt5_dense(new_texts, 64)
    rows = np.arange(len(new_texts))
    np.testing.assert_array_equal(after.gather_numpy(rows)[0], gather_tokens(ids, lengths, rows)[0])
    assert len([p for p in (tmp_path / "c").iterdir() if p.is_dir()]) == 2  # one entry per corpus content


def test_hf_ragged_encoding_holds_the_tokenizers_rows():
    from leanagent.models.tokenizer import HFTokenizer

    class Stub:  # a Hugging Face tokenizer's call: ids per text, truncated to max_length with EOS kept
        def __call__(self, texts, max_length, truncation):
            return {"input_ids": [[70000 + len(t)] * min(len(t), max_length - 1) + [1] for t in texts]}

    tokenizer = HFTokenizer.__new__(HFTokenizer)
    tokenizer.tokenizer = Stub()
    ids, lengths = padded(Stub()(TEXTS, 8, True)["input_ids"], 8)
    tokens, offsets = tokenizer.encode_ragged(TEXTS, 8, chunk=4)
    assert tokens.dtype == np.int32  # ids above 65535 do not fit uint16
    table = TokenTable(tokens, offsets)
    rows = np.arange(len(TEXTS))
    np.testing.assert_array_equal(table.gather_numpy(rows)[0], gather_tokens(ids, lengths, rows)[0])
    empty_tokens, empty_offsets = tokenizer.encode_ragged([], 8)
    assert len(empty_tokens) == 0 and empty_offsets.tolist() == [0]
