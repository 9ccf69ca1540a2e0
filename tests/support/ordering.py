"""The suite's order for parallel workers: the longest modules first, at the heads of the
workers' shares (longest processing time first).

pytest-xdist's ``worksteal`` hands each worker an equal, contiguous share of the collection in
its order, then lets a worker that runs out take the back half of the longest queue left. A
module of a minute that starts last keeps the whole run waiting for it while the other workers
are done (runs of the suite spent their last 4 % of tests, 2.8 minutes, on a few long modules).
So the long modules (``LONG``: 15 s or more of a worker's time each, measured with
``--durations``) begin the shares, each, longest first, on the share whose long modules add up
to the least so far (longest processing time first), and the rest keeps its order. A steal
takes the back of a queue: a module at the head of a share stays whole on its worker, its
fixtures set up once, where one in the middle of the rest may be cut (in one run
``tests/chart/test_monitoring.py``'s Prometheus was set up on three workers, 50, 32 and 19 s,
two of them waiting for the first's blocks; ``tests/test_demo.py``'s demo on two, 19 and 15 s).
And the tests left for the end, when the workers steal from one another, are the short ones.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

# The seconds each took of a worker's time in runs of the suite on four workers, set up once.
LONG: Mapping[str, float] = {
    "tests/test_end_to_end_safety.py": 200,
    "tests/kubeapi/test_end_to_end_real.py": 120,
    "tests/kubeapi/test_real_nodes.py": 105,
    "tests/test_cli.py": 94,
    "tests/kubeapi/test_kueue_real.py": 76,
    "tests/test_kill9.py": 76,
    "tests/test_other_writers_stateful.py": 74,
    "tests/sim/test_prometheus_history.py": 69,
    "tests/test_cli_run.py": 63,
    "tests/chart/test_monitoring.py": 60,
    "tests/kubeapi/test_takers_differential.py": 55,
    "tests/kubeapi/test_in_cluster.py": 50,
    "tests/test_dashboard_end_to_end.py": 37,
    "tests/chart/test_image.py": 34,
    "tests/sim/test_training_queue.py": 30,
    "tests/test_cli_other_writers.py": 27,
    "tests/adapters/test_convergence.py": 26,
    "tests/test_demo.py": 25,
    "tests/test_cli_explain.py": 25,
    "tests/test_uninstall.py": 23,
    "tests/kubeapi/test_notice_job.py": 23,
    "tests/sim/test_reclaim_notice.py": 22,
    "tests/sim/test_configured_pool.py": 21,
    "tests/test_cli_check.py": 20,
    "tests/strategies/test_totality.py": 19,
    "tests/adapters/test_actuator_crash.py": 18,
    "tests/core/test_planning_stateful.py": 17,
    "tests/adapters/test_gate.py": 16,
    "tests/test_kill9_audit_disk_full.py": 16,
    "tests/test_alertmanager_end_to_end.py": 16,
    "tests/test_cli_status.py": 15,
}


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


def longest_first(items: Sequence[T], workers: int, long: Mapping[str, float] = LONG) -> list[T]:
    """``items`` reordered so that each of the first shares begins with long modules."""
    by_module: dict[str, list[T]] = {}
    for item in items:
        by_module.setdefault(module(item), []).append(item)
    heads: list[list[T]] = [[] for _ in range(workers)]
    seconds = [0.0] * workers
    present = sorted((m for m in long if m in by_module), key=lambda m: -long[m])
    for name in present:
        least = seconds.index(min(seconds))
        heads[least].extend(by_module[name])
        seconds[least] += long[name]
    rest = iter(item for item in items if module(item) not in present)
    order: list[T] = []
    for head, size in zip(heads, shares(len(items), workers), strict=True):
        order.extend(head)
        order.extend(itertools.islice(rest, max(0, size - len(head))))
    order.extend(rest)
    return order
