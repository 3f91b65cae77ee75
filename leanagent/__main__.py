"""`python -m leanagent ...` is `python main.py ...`; lifelong runs launch their stages this way."""

from leanagent.entry import run

run()
