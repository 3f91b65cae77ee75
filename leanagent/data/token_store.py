"""Pre-tokenized texts stored ragged and shared by every rank of a node through a memory-mapped cache.

A dense [N, max_seq_len] int32 table costs 200 MB per rank for 100k premises at length 512, and
every DDP rank (a separate process) used to build its own. Here a table is one flat array of token
ids (uint16 where the vocabulary fits, as ByT5's does) plus N+1 row offsets, so it holds only the
real tokens; and it is written once per node to a cache file named by a hash of its content, which
every rank memory-maps read-only, so the pages are in memory once whatever the number of ranks.

The cache is a folder `<sha256>/` holding `tokens.npy` and `offsets.npy` (plain `.npy` files, read
with `allow_pickle=False`, never pickles). The hash covers the format, the tokenizer, the maximum
length and every text, so changed content gets a new entry, never a stale one. One process builds
an entry while holding an exclusive lock on `<sha256>.lock` (the others wait on it, then read), and
writes it to a temporary folder renamed into place, so a reader never sees a half-written entry.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from leanagent.io import temporary_names
from leanagent.models.tokenizer import PAD_ID

log = logging.getLogger("leanagent")

FORMAT = "leanagent-ragged-tokens-1"
CACHE_ENV = "LEANAGENT_TOKEN_CACHE"


class TokenTable:
    """Token ids of N texts: row i is `tokens[offsets[i]:offsets[i + 1]]`, EOS included, no padding."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray) -> None:
        if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(tokens):
            raise ValueError("offsets must start at 0 and end at len(tokens)")
        lengths = np.diff(offsets)
        if (lengths < 0).any():  # a damaged cache entry: rows of other texts, or negative lengths mid-epoch
            raise ValueError("offsets must not decrease")
        self.tokens = tokens
        self.offsets = offsets
        self.lengths = lengths.astype(np.int32)

    def __len__(self) -> int:
        return len(self.lengths)

    def gather_numpy(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows as a padded int64 table trimmed to the longest one, and its mask; row -1 gives an all-padding row."""
        rows = np.asarray(rows, dtype=np.int64)
        safe = np.where(rows >= 0, rows, 0)
        lengths = self.lengths[safe]
        width = int(max(lengths.max(initial=1), 1))
        columns = np.arange(width)
        inside = columns[None, :] < lengths[:, None]
        index = self.offsets[safe][:, None] + np.minimum(columns[None, :], np.maximum(lengths[:, None] - 1, 0))
        ids = np.where(inside, self.tokens[index] if len(self.tokens) else PAD_ID, PAD_ID).astype(np.int64)
        mask = inside.astype(np.int64)
        ids[rows < 0] = PAD_ID
        mask[rows < 0] = 0
        mask[rows < 0, 0] = 1
        return ids, mask

    def gather(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = self.gather_numpy(rows)
        return torch.from_numpy(ids), torch.from_numpy(mask)


def default_cache_dir() -> Path | None:
    """`$LEANAGENT_TOKEN_CACHE` (empty or `off`: no cache), else a per-user folder in the node's temp dir."""
    value = os.environ.get(CACHE_ENV)
    if value is not None:
        return None if value.strip().lower() in ("", "off", "none") else Path(value)
    return Path(tempfile.gettempdir()) / f"leanagent-tokens-{os.getuid()}"


def content_key(tokenizer, texts: Sequence[str], max_len: int) -> str:
    digest = hashlib.sha256(f"{FORMAT}|{tokenizer.identity}|{max_len}|{len(texts)}|".encode())
    for text in texts:
        raw = text.encode("utf-8")
        digest.update(len(raw).to_bytes(8, "little"))
        digest.update(raw)
    return digest.hexdigest()


def source_key(tokenizer, max_len: int, *parts: str | bytes) -> str:
    """A key for texts that are not computed yet: the caller names everything they are made from."""
    digest = hashlib.sha256(f"{FORMAT}|{tokenizer.identity}|{max_len}|source".encode())
    for part in parts:
        raw = part.encode() if isinstance(part, str) else part
        digest.update(len(raw).to_bytes(8, "little"))
        digest.update(raw)
    return digest.hexdigest()


def tokenize(
    tokenizer,
    texts: Sequence[str] | Callable[[], Sequence[str]],
    max_len: int,
    cache_dir: Path | None | str = "default",
    key: str | None = None,
) -> TokenTable:
    """A table of `texts`, memory-mapped from the node's cache (built there first if missing), or in memory
    when there is no usable cache folder.

    `texts` may be a function, called only when the table has to be built; `key` (from `source_key`)
    must then identify its result. Without a key, the texts themselves are hashed.
    """
    if callable(texts) and key is None:
        raise ValueError("tokenize: a function of texts needs a key")
    materialised: list[Sequence[str]] = []

    def get_texts() -> Sequence[str]:
        if not materialised:
            materialised.append(texts() if callable(texts) else texts)
        return materialised[0]

    folder = default_cache_dir() if cache_dir == "default" else cache_dir
    if folder is None:
        return TokenTable(*tokenizer.encode_ragged(get_texts(), max_len))
    folder = Path(folder)
    key = key or content_key(tokenizer, get_texts(), max_len)
    entry = folder / key
    rows = None if callable(texts) else len(texts)
    table = _load(entry, rows)
    if table is not None:
        return table
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with _locked(folder / f"{key}.lock"):
            table = _load(entry, rows)  # built by another rank while this one waited
            if table is None:
                _remove_unfinished(entry)
                _write(entry, *tokenizer.encode_ragged(get_texts(), max_len))
                table = _load(entry, len(get_texts()))
    except OSError as e:
        log.warning("token cache %s is not usable (%s): keeping the tokens in memory", folder, e.strerror or e)
        return TokenTable(*tokenizer.encode_ragged(get_texts(), max_len))
    if table is None:
        raise RuntimeError(f"token cache entry {entry} cannot be read back after writing it")
    return table


@contextmanager
def _locked(path: Path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _load(entry: Path, rows: int | None) -> TokenTable | None:
    """The entry memory-mapped read-only, or None if it is missing or damaged (it is then removed)."""
    if not entry.is_dir():
        return None
    try:
        tokens = np.load(entry / "tokens.npy", mmap_mode="r", allow_pickle=False)
        offsets = np.load(entry / "offsets.npy", mmap_mode="r", allow_pickle=False)
        if tokens.ndim != 1 or offsets.ndim != 1 or (rows is not None and offsets.shape != (rows + 1,)):
            raise ValueError(f"shapes {tokens.shape} and {offsets.shape} for {rows} rows")
        return TokenTable(tokens, offsets)
    except (OSError, ValueError) as e:
        log.warning("token cache entry %s is damaged (%s): rebuilding it", entry, e)
        shutil.rmtree(entry, ignore_errors=True)
        return None


def _remove_unfinished(entry: Path) -> None:
    """The temporary folders of earlier builds of `entry` that were killed outright (an exception removes its
    own). Called under the entry's lock, so none of them is another process's build in progress."""
    unfinished = temporary_names(f".{entry.name}.", r"\.tmp")  # _write's
    for p in entry.parent.iterdir():
        if unfinished.fullmatch(p.name) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)


def _write(entry: Path, tokens: np.ndarray, offsets: np.ndarray) -> None:
    """Both arrays into a temporary folder beside `entry`, renamed into place once complete."""
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}.", suffix=".tmp"))
    try:
        for name, array in (("tokens.npy", tokens), ("offsets.npy", offsets)):
            with open(tmp / name, "wb") as f:
                np.save(f, np.ascontiguousarray(array), allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, 0o755)
        os.rename(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def corpus_code_version() -> str:
    """A hash of the code that turns a corpus file into premise texts, so changing it invalidates cached tokens."""
    from leanagent.corpus import corpus

    return hashlib.sha256(Path(corpus.__file__).read_bytes()).hexdigest()
