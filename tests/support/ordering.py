"""The suite's order for parallel workers: the longest modules first, one at the head of each
worker's share (longest processing time first).

pytest-xdist's ``worksteal`` hands each worker an equal, contiguous share of the collection in
its order, then lets a worker that runs out take the back half of the longest queue left. A
module of a minute that starts last keeps the whole run waiting for it while the other workers
are done (runs of the suite spent their last 4 % of tests, 2.8 minutes, on a few long modules).
So the long modules (``LONG``: 45 s or more of a worker's time each, measured with
``--durations``) begin the shares, spread over them longest first, and the rest keeps its
order. A module's tests stay together, so its fixtures are set up once on one worker.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol, TypeVar

# Longest first, each with the seconds it took in a run of the suite on four workers.
LONG = (
    "tests/test_end_to_end_safety.py",  # 200
    "tests/kubeapi/test_end_to_end_real.py",  # 110
    "tests/kubeapi/test_real_nodes.py",  # 101
    "tests/test_cli.py",  # 94
    "tests/kubeapi/test_kueue_real.py",  # 76
    "tests/test_kill9.py",  # 76
    "tests/test_other_writers_stateful.py",  # 74
    "tests/sim/test_prometheus_history.py",  # 69
    "tests/kubeapi/test_takers_differential.py",  # 55
    "tests/kubeapi/test_in_cluster.py",  # 50
)


class Item(Protocol):
    @property
    def nodeid(self) -> str: ...


T = TypeVar("T", bound=Item)


def module(item: Item) -> str:
    return item.nodeid.split("::", 1)[0]


def shares(n: int, workers: int) -> list[int]:
    """The sizes of the shares ``worksteal`` first hands out, in order."""
    sizes = []
    for i in range(workers):
        sizes.append(n // (workers - i))
        n -= sizes[-1]
    return sizes


def longest_first(items: Sequence[T], workers: int, long: Sequence[str] = LONG) -> list[T]:
    """``items`` reordered so that each of the first shares begins with long modules."""
    by_module: dict[str, list[T]] = {}
    for item in items:
        by_module.setdefault(module(item), []).append(item)
    heads: list[list[T]] = [[] for _ in range(workers)]
    present = [m for m in long if m in by_module]
    for i, name in enumerate(present):
        heads[i % workers].extend(by_module[name])
    rest = iter(item for item in items if module(item) not in present)
    order: list[T] = []
    for head, size in zip(heads, shares(len(items), workers), strict=True):
        order.extend(head)
        order.extend(itertools.islice(rest, max(0, size - len(head))))
    order.extend(rest)
    return order
