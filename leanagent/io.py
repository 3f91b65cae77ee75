"""Reading the benchmark's JSON files with errors that name file and line, and writing files atomically."""

from __future__ import annotations

import codecs
import errno
import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from leanagent.errors import LeanAgentError

log = logging.getLogger("leanagent")


def _publish(tmp: str, target: Path) -> None:
    """mkstemp makes 0600 files; give the result the permissions a plain open() would."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, target)


def temporary_names(prefix: str, suffix_pattern: str) -> re.Pattern[str]:
    """The names `tempfile.mkstemp`/`mkdtemp` give with this prefix (8 characters of [a-z0-9_] after it), for
    finding what a writer killed outright left behind; `suffix_pattern` is a regular expression."""
    return re.compile(re.escape(prefix) + r"[a-z0-9_]{8}" + suffix_pattern)


@contextmanager
def folder_lock(folder: Path, what: str, busy: str | None = None) -> Iterator[None]:
    """Hold an exclusive lock on `folder` (flock, where locks exist) while the block runs; the kernel drops it
    when the process ends, however it ends, so no stale lock outlives a kill.

    With `busy`, a folder another process holds is refused at once with that message; without, this waits
    its turn. A file system that cannot lock (NFS without flock) gets a warning: writers are not kept apart.
    """
    try:
        import fcntl
        fd = os.open(folder, os.O_RDONLY)
    except (ImportError, OSError):  # no such folder, or no flock: nothing to take turns on
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if busy else 0))
        except BlockingIOError:
            raise LeanAgentError(busy) from None
        except OSError as e:  # NFS emulates flock with write locks, which a folder opened to read cannot take
            log.warning("%s: cannot lock %s (%s): writers beside this one are not kept apart", what, folder, e.strerror or e)
        yield
    finally:
        os.close(fd)  # releases the lock


def broken_link(path: str | os.PathLike) -> str | None:
    """Why a path that names nothing is more than missing (a symbolic link loop, a link whose target is gone),
    or None: "not found" would send the user looking for a file they can see."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "is a symbolic link loop"
        if os.path.islink(path):
            return f"is a symbolic link to {os.readlink(path)}, which does not exist"
    return None


def missing_error(path: str | os.PathLike, prefix: str, otherwise: str) -> LeanAgentError:
    """The error for a path that names nothing: `{prefix}{path} is a symbolic link ...` where a link is at
    fault (`broken_link`), else `otherwise`."""
    link = broken_link(path)
    return LeanAgentError(f"{prefix}{path} {link}" if link else otherwise)


def require_file(path: str | os.PathLike, what: str) -> Path:
    """Fail early, naming the setting, instead of deep inside a loader."""
    p = Path(path)
    if p.is_dir():
        raise LeanAgentError(f"{what}: {p} is a folder, not a file")
    if not p.is_file():
        if p.exists():  # a device, a pipe: nothing a loader can read twice
            raise LeanAgentError(f"{what}: {p} is not a regular file")
        raise missing_error(p, f"{what}: ", f"{what} not found: {p}")
    return p


def require_folder(path: str | os.PathLike, what: str) -> Path:
    """As `require_file`, for a folder setting."""
    p = Path(path)
    if not p.is_dir():
        raise missing_error(p, f"{what}: ", f"{what} is not a folder: {p}")
    return p


def missing_folders(folder: str | os.PathLike) -> list[Path]:
    """`folder` and those of its parents that do not exist yet, deepest first: what making it creates, so that a
    run that fails can remove it again."""
    p = Path(folder)
    return [q for q in (p, *p.parents) if not q.exists()]


def remove_empty_folders(folders: Iterable[Path]) -> None:
    """Remove each folder that is empty, deepest first; one that something else went into stays."""
    for q in sorted(set(folders), key=lambda q: len(q.absolute().parts), reverse=True):
        try:
            q.rmdir()
        except OSError:
            pass


def ensure_writable(folder: str | os.PathLike, what: str) -> Path:
    """Prove a file can be written in `folder` (permissions, read-only disks, a file in the way), creating it
    for the test and removing what was created."""
    p = Path(folder)
    created = missing_folders(p)  # removed again: a failed run leaves no folders
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=p, prefix=".leanagent-write-test.")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise LeanAgentError(f"{what}: {p} is not writable ({e.strerror or type(e).__name__})") from None
    finally:
        remove_empty_folders(created)
    return p


def unreadable(path: Path, error: OSError) -> LeanAgentError:
    """One line for any OS-level failure to read an input (permissions, a folder, I/O errors)."""
    return LeanAgentError(f"{path}: cannot read ({error.strerror or type(error).__name__})")


def read_bytes(path: str | os.PathLike, what: str) -> bytes:
    p = require_file(path, what)
    try:
        return p.read_bytes()
    except OSError as e:
        raise unreadable(p, e) from None


# A \uD800-\uDFFF escape that is not half of a pair (and not an escaped backslash followed by "u"): json
# accepts it, but the string cannot be encoded as UTF-8, which every tokenizer and writer does later.
_LONE_SURROGATE = re.compile(
    r"(?<!\\)(?:\\\\)*(?P<at>\\u[dD][89abAB][0-9a-fA-F]{2})(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    r"|(?<!\\)(?:\\\\)*(?<!\\u[dD][89abAB][0-9a-fA-F]{2})(?P<low>\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _lone_surrogate(text: str, value: Any) -> int | None:
    """Offset in `text` (which parsed to `value`) of the first escape that decodes to a lone surrogate, or
    None. Pairs are common (Mathlib's script letters), so a surrogate escape is only a hint; encoding the
    parsed value decides, and the pattern then finds where."""
    if _SURROGATE_ESCAPE.search(text) is None:
        return None
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
        return None
    except UnicodeEncodeError:
        found = _LONE_SURROGATE.search(text)
    if found is None:
        return 0
    return found.start("at") if found.group("at") else found.start("low")


def _parse_failure(e: Exception) -> str | None:
    """json's failures on valid-looking text that are not JSONDecodeError: too deep, or an integer too long."""
    if isinstance(e, RecursionError):
        return "nested too deeply"
    if isinstance(e, ValueError) and "integer string conversion" in str(e):
        return "an integer with more than 4300 digits"
    return None


class _KeyTwice(ValueError):
    """`key` given twice in one object; `where` names the object by its full_name, path or name, if it has one."""

    def __init__(self, key: str, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(key)
        self.key = key
        named = next(((k, v) for k, v in pairs if k in ("full_name", "path", "name") and isinstance(v, str)), None)
        self.where = f" (the one with {named[0]} '{named[1]}')" if named else ""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object that gives a key twice: json keeps the last value and drops the other without a word."""
    value = dict(pairs)
    if len(value) < len(pairs):
        seen: set[str] = set()
        raise _KeyTwice(next(k for k, _ in pairs if k in seen or seen.add(k)), pairs)
    return value


def _loads(text: str, p: Path, lineno: int | None) -> Any:
    """`json.loads` with each way it fails as one error line. `lineno` is the JSONL line `text` is, or None
    for a whole JSON file (whose errors then name the line inside it)."""
    what = "malformed JSON" if lineno is None else "malformed JSON line"
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys)
    except _KeyTwice as e:
        raise LeanAgentError(f"{p if lineno is None else f'{p}:{lineno}'}: '{e.key}' is given twice in one object{e.where}; "
                             "JSON would keep the last and drop the other without a word: keep one") from None
    except json.JSONDecodeError as e:
        # json's message ends "... at" where its text gave the place: the column says where in the line
        raise LeanAgentError(f"{p}:{lineno or e.lineno}: {what} ({e.msg.removesuffix(' at')} at column {e.colno})") from None
    except (RecursionError, ValueError) as e:
        if (reason := _parse_failure(e)) is None:
            raise
        raise LeanAgentError(f"{p if lineno is None else f'{p}:{lineno}'}: {what} ({reason})") from None
    if (at := _lone_surrogate(text, value)) is not None:
        line = lineno or text.count("\n", 0, at) + 1
        raise LeanAgentError(f"{p}:{line}: a string holds a lone UTF-16 surrogate ({text[at:at + 6]}), not text")
    return value


def read_json(path: str | os.PathLike) -> Any:
    p = require_file(path, "JSON file")
    try:
        with p.open(encoding="utf-8-sig") as f:  # a byte order mark, as some Windows editors write, is skipped
            text = f.read()
    except UnicodeDecodeError as e:
        raise LeanAgentError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise unreadable(p, e) from None
    return _loads(text, p, None)


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """Yield (line number, record) for each non-blank line; a byte order mark opening the file is skipped."""
    p = require_file(path, "JSONL file")
    try:
        f = p.open("rb")
    except OSError as e:
        raise unreadable(p, e) from None
    with f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise LeanAgentError(f"{p}:{lineno}: not UTF-8 text ({e.reason} at byte {e.start} of the line)") from None
            if line.strip():
                yield lineno, _loads(line, p, lineno)


def write_target(path: str | os.PathLike) -> Path:
    """Where writing an output the user named puts the bytes: a symbolic link's target (the atomic rename would
    replace the link and leave the file it names as it was). Files of our own folders replace a link instead."""
    return Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """Write to a temporary file beside `path` and rename it into place only if the block succeeds."""
    target = Path(path)
    created = missing_folders(target.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with open(tmp, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        _publish(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        remove_empty_folders(created)
        raise


def sync_to_disk(path: str | os.PathLike) -> None:
    """fsync a file another writer closed (safetensors, torch.save, Lightning's checkpoints): before a rename or
    a record (state.json) points at it, so that a power cut cannot leave the pointer and lose what it names."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """For writers that take a file name (safetensors, matplotlib): `write(tmp_path)` then rename."""
    target = Path(path)
    created = missing_folders(target.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        sync_to_disk(tmp)
        _publish(tmp, target)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        remove_empty_folders(created)
        code = _os_error_code(e)
        if code is not None:  # safetensors reports a full disk as "I/O error: ... (os error 28)", not as an OSError
            raise OSError(code, os.strerror(code), str(target)) from e
        raise


def write_safetensors(path: str | os.PathLike, tensors: dict[str, Any], metadata: dict[str, str]) -> None:
    """A safetensors file whose bytes depend only on the tensors and metadata (temporary name, then rename).

    safetensors writes the metadata from a hash map, in an order that changes from one process to the
    next, so two exports of the same weights differed in bytes while a record names the file by its
    SHA-256. The header is rewritten in place with the metadata in key order: the same length, so the
    tensors' offsets and data are untouched and nothing is held in memory beyond the header.
    """
    from safetensors.torch import save_file

    def write(tmp: str) -> None:
        save_file(tensors, tmp, metadata=metadata)
        sort_safetensors_metadata(tmp)

    atomic_write(path, write)


def sort_safetensors_metadata(path: str | os.PathLike) -> None:
    """Put a safetensors file's `__metadata__` keys in order, in place (a header of another layout is left as it is)."""
    with open(path, "r+b") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        if "__metadata__" not in header:
            return
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) <= size:
            f.seek(8)
            f.write(text.ljust(size))


def _os_error_code(error: BaseException) -> int | None:
    if isinstance(error, OSError):
        return None  # already what the CLI reads
    found = re.search(r"\(os error (\d+)\)", str(error))
    return int(found.group(1)) if found else None


def write_csv(path: str | os.PathLike, rows: list[dict[str, Any]]) -> None:
    """Rows of one shape as CSV with a header, written atomically."""
    import csv

    with atomic_open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in blocks: the fingerprint records of data and weights carry."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as e:
        raise unreadable(Path(path), e) from None
    return digest.hexdigest()


def file_fingerprints(paths: Iterable[str | os.PathLike]) -> dict[str, str]:
    """{path as given: `file_sha256`} for each of `paths` that is a file (records skip what is absent)."""
    return {str(path): file_sha256(path) for path in paths if Path(path).is_file()}


def write_json(path: str | os.PathLike, obj: Any) -> None:
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
