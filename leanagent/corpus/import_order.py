"""Files in import order (imports before importers), with `graphlib` doing the sort and finding cycles.

Ties go to the file listed first, so a corpus that is already in import order keeps its order
(what LeanDojo writes), and a merged or copied corpus comes out the same on every run.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Mapping
from graphlib import CycleError, TopologicalSorter
from typing import TypeVar

Node = TypeVar("Node", bound=Hashable)


class ImportCycle(Exception):
    """`files` form a cycle: each imports the next, and the last is the first again."""

    def __init__(self, files: list) -> None:
        super().__init__(" -> ".join(map(str, files)))
        self.files = files


def imports_first(imports: Mapping[Node, Iterable[Node]]) -> list[Node]:
    """Every file of `imports` (file -> the files it imports) after all it imports; among the files
    ready at a time, the earliest in `imports` first. Imported files must be keys of `imports` too.

    Raises ImportCycle, starting from the earliest listed file of the cycle that graphlib reports.
    """
    position = {node: i for i, node in enumerate(imports)}
    sorter = TopologicalSorter(imports)
    try:
        sorter.prepare()
    except CycleError as error:
        cycle = error.args[1][::-1]  # graphlib lists each file before its importer; a cycle reads importer first
        start = min(range(len(cycle) - 1), key=lambda i: position[cycle[i]])
        raise ImportCycle(cycle[start:-1] + cycle[:start] + [cycle[start]]) from None
    order: list[Node] = []
    ready: list[int] = []
    nodes = list(imports)
    while sorter.is_active():
        for node in sorter.get_ready():
            heapq.heappush(ready, position[node])
        node = nodes[heapq.heappop(ready)]
        order.append(node)
        sorter.done(node)
    return order
