"""The one exception type a user can cause; the CLI turns it into a one-line error and exit code 2."""


class LeanAgentError(Exception):
    """Bad input or inconsistent settings: the message says what to fix (file, line or field)."""


class ReportedError(LeanAgentError):
    """A child command (a lifelong stage) refused its input and printed its own `error:` line; the parent says
    where to look without a second `error:` line, and exits with the same code."""
