"""The exception types the CLI turns into one `error:` line: exit 2 for bad input, 1 for a disk that refuses a file."""

from __future__ import annotations

import errno


class LeanAgentError(Exception):
    """Bad input or inconsistent settings: the message says what to fix (file, line or field)."""


class ReportedError(LeanAgentError):
    """A child command (a lifelong stage) refused its input and printed its own `error:` line; the parent says
    where to look without a second `error:` line, and exits with the same code."""


def one_line(message: object) -> str:
    """An error is one line: a name from the input that holds a newline, a carriage return or a terminal escape
    (a file path, a theorem's name) is shown escaped, so no second line (one starting `error:`) comes from it."""
    return "".join(c if c.isprintable() or c == "\t" else repr(c)[1:-1] for c in str(message))


def refuse_repeats(values: list[str], setting: str, why: str) -> None:
    """A list setting whose entries must differ (splits, repositories, setup names): all repeats named at once."""
    if twice := sorted({v for v in values if values.count(v) > 1}):
        raise LeanAgentError(f"{setting}: {', '.join(twice)} given more than once; {why}")


# The disk, not the input: a full disk, a quota, a read-only mount.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


class WriteFailed(LeanAgentError):
    """The disk refused a file we write. Not the user's input, so exit 1, not 2; the writers remove their
    temporary files, and what was written before (an earlier checkpoint) is left as it was."""

    exit_code = 1


def write_failed(error: OSError, target: str | None = None, note: str = "") -> WriteFailed:
    """One line naming the file being written; `target` when the failing call named only a staging file."""
    names = [str(n) for n in (error.filename2, error.filename) if n]
    name = target or (names[0] if names else "a file")
    reason = error.strerror or type(error).__name__
    return WriteFailed(f"cannot write {name}: {reason}{note}; free space (or make it writable) and rerun")
