"""``sandbox.refusals``: the demo's refusals for want of a taker, a line per pool and reason."""

from __future__ import annotations

from sandbox import refusals

HOPPER = (
    "no pending job would run on another node: job training/hopper-006: pod "
    "training/hopper-006-0-0: t4-1 node affinity gpu-pool In ['l20', 't4', 'a100'], "
    "nvidia.com/gpu.family In ['hopper']; job training/48gb-011: pod training/48gb-011-0-0: "
    "t4-1 node affinity nvidia.com/gpu.memory Gt 40000"
)


def test_refusals_of_one_reason_add_up_whatever_jobs_they_name() -> None:
    groups: dict[str, refusals.Refusals] = {}
    refusals.add(groups, HOPPER, 2)
    refusals.add(groups, HOPPER.replace("hopper-006", "hopper-007"), 1)
    refusals.add(groups, "every pending job (3) fits on nodes lent already", 1)
    refusals.add(groups, "every pending job (5) fits on nodes lent already", 2)
    assert set(groups) == {
        "no pending job would run on another node",
        "every pending job fits on nodes lent already",
    }
    named = groups["no pending job would run on another node"]
    assert (named.count, named.nodes) == (2, 3)
    assert named.jobs == {"training/hopper-006", "training/hopper-007", "training/48gb-011"}
    lines = refusals.lines({"t4": groups})
    assert lines == [
        "    t4    2 ticks, 3 nodes in all: no pending job would run on another node; "
        "waiting: 2 hopper, 1 48gb",
        "    t4    2 ticks, 3 nodes in all: every pending job fits on nodes lent already",
        "          (48gb: gpu.memory Gt 40000; hopper: gpu.family In hopper)",
    ]


def test_a_line_is_cut_to_a_terminal_and_says_so() -> None:
    assert refusals.fit("x" * 120) == "x" * 120
    cut = refusals.fit("x" * 121)
    assert len(cut) == 120
    assert cut.endswith("...")
    assert refusals.brief(HOPPER) == (
        "no pending job would run on another node; waiting: 1 48gb, 1 hopper"
    )
