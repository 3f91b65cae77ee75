"""How a benchmark takes its arguments: a jsonargparse parser, as the app's commands do.

A benchmark keeps its own option names (`--batch-size`) and gains `--config FILE` (a YAML file of those
options) and `--print_config` (prints one, which `--config` accepts again); errors are one `error:` line
after the usage, exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from jsonargparse import ActionConfigFile, ArgumentParser, Namespace


def benchmark_parser(doc: str | None) -> ArgumentParser:
    """A parser described by the first line of a benchmark's docstring, with `--config` and `--print_config`."""
    parser = ArgumentParser(description=(doc or "").strip().splitlines()[0] if doc else None)
    parser.add_argument("--config", action=ActionConfigFile, help="a YAML file of these options, as --print_config writes it")
    return parser


def add_optional_positional(parser: ArgumentParser, name: str, nargs: str, **kwargs: Any) -> None:
    """A positional that may be left out (`nargs` "?" or "*"), whose value a `--config` file may also give.

    argparse sets a left-out positional to its default after the config file has been read, which
    would silently drop the file's value; so the positional has no default here, and the benchmark
    applies its own with `value_or`.
    """
    parser.add_argument(name, nargs=nargs, default=argparse.SUPPRESS, **kwargs)


def value_or(args: Namespace, name: str, default: Any) -> Any:
    """The parsed value of an optional positional, or `default` where neither the command line nor a config gave one."""
    value = getattr(args, name, None)
    return default if value is None or (isinstance(value, Sequence) and not isinstance(value, str) and not value) else value


def run(main: Callable[..., Any], *args: Any) -> None:
    """A benchmark's entry point: a user error (a damaged checkpoint, a missing dataset) is one `error:` line and
    exit code 2, as in the app, not a traceback. SIGTERM (`kill PID`) and Ctrl-C stop it at once with one line
    and 128 + signal, as they stop the app's commands: inside `trainer.test` Lightning's handler alone only sets
    a flag, so a benchmark embedding a large corpus went on for minutes and then ended with status 0."""
    from leanagent.errors import LeanAgentError, one_line
    from leanagent.interrupts import Interrupted, stop_on_signals

    try:
        with stop_on_signals("the benchmark"):
            main(*args)
    except Interrupted as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(e.exit_code)
    except LeanAgentError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)
