"""The suite's order for parallel workers (tests/support/ordering.py)."""

from __future__ import annotations

from dataclasses import dataclass

from tests.support.ordering import longest_first, module, shares


@dataclass(frozen=True)
class Item:
    nodeid: str


def items(counts: dict[str, int]) -> list[Item]:
    return [Item(f"{m}::test_{i}") for m, n in counts.items() for i in range(n)]


def test_each_share_begins_with_a_long_module_longest_first_and_nothing_is_lost() -> None:
    collected = items({"a.py": 30, "long2.py": 2, "b.py": 50, "long1.py": 1, "c.py": 17})
    ordered = longest_first(collected, 4, long={"long2.py": 5, "long1.py": 10, "absent.py": 20})
    assert sorted(i.nodeid for i in ordered) == sorted(i.nodeid for i in collected)
    sizes = shares(len(ordered), 4)
    assert sizes == [25, 25, 25, 25]
    starts = [sum(sizes[:k]) for k in range(4)]
    assert [module(ordered[s]) for s in starts[:2]] == ["long1.py", "long2.py"]
    # The rest keeps its order, and every module's tests stay together.
    rest = [i for i in ordered if module(i) not in ("long1.py", "long2.py")]
    assert rest == [i for i in collected if module(i) not in ("long1.py", "long2.py")]
    runs: list[str] = []  # the modules in the order they run, a module cut at a share's edge twice
    for item in ordered:
        if not runs or runs[-1] != module(item):
            runs.append(module(item))
    assert runs == ["long1.py", "a.py", "long2.py", "a.py", "b.py", "c.py"]


def test_shares_are_what_worksteal_hands_out() -> None:
    assert shares(10, 4) == [2, 2, 3, 3]
    assert sum(shares(2475, 4)) == 2475


def test_each_long_module_goes_to_the_share_with_the_least_long_time_so_far() -> None:
    long = {"a.py": 10, "b.py": 6, "c.py": 5, "d.py": 4}
    collected = items({"d.py": 1, "c.py": 1, "rest.py": 10, "b.py": 1, "a.py": 1})
    ordered = longest_first(collected, 2, long=long)
    starts = [0, shares(len(ordered), 2)[0]]
    # a (10) to the first share; b (6), then c (5) to the second (11); d (4) to the first
    # (14). Dealt in turn they would be a and c (15) against b and d (10).
    assert [module(i) for i in ordered[starts[0] : starts[0] + 2]] == ["a.py", "d.py"]
    assert [module(i) for i in ordered[starts[1] : starts[1] + 2]] == ["b.py", "c.py"]
    assert len(ordered) == len(collected)
