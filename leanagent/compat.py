"""Private names of Lightning and jsonargparse that leanagent relies on, each in one place.

tests/test_compat.py fails with the name of the private API when an upgrade changes one of them.
"""

from __future__ import annotations

from typing import Any


def add_subcommand(parser: Any, name: str, subparser: Any, help: str) -> None:
    """Add a subcommand to a parser whose subcommands LightningCLI already created.

    LightningCLI calls `parser.add_subcommands()` itself and keeps no public handle on the action it
    returns, and jsonargparse allows that call once per parser; the action is `_subcommands_action`.
    """
    action = getattr(parser, "_subcommands_action", None)
    if action is None:
        raise RuntimeError("jsonargparse: ArgumentParser._subcommands_action is gone; leanagent.compat.add_subcommand needs updating")
    action.add_subcommand(name, subparser, help=help)
