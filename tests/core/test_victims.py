"""Reclaim victims, least cost first: whole jobs together, lowest priority, youngest first."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from rebalancer.core.model import NodeName, NodeView, PodRole, PodView
from rebalancer.core.victims import (
    eviction_order,
    job_key,
    jobs,
    left_by_earlier_node,
)
from tests.support.factories import T0


def pod(
    name: str,
    job: str | None = None,
    priority: int = 0,
    age_min: int = 0,
    role: PodRole = PodRole.BORROWED,
) -> PodView:
    return PodView(
        namespace="training",
        name=name,
        role=role,
        priority=priority,
        job=job,
        created=T0 - timedelta(minutes=age_min),
    )


def names(pods: tuple[PodView, ...]) -> list[str]:
    return [p.name for p in pods]


def test_only_borrowed_pods_are_ever_candidates() -> None:
    pods = [
        pod("serve", role=PodRole.INFERENCE),
        pod("exporter", role=PodRole.DAEMON),
        pod("misc", role=PodRole.OTHER),
        pod("train", job="j"),
    ]
    assert names(eviction_order(pods)) == ["train"]


def test_a_jobs_pods_go_out_together_before_the_next_job() -> None:
    pods = [pod("a-0", "a", age_min=5), pod("b-0", "b", age_min=1), pod("a-1", "a", age_min=4)]
    # b started later (younger), so it goes first; then a's pods, youngest first.
    assert names(eviction_order(pods)) == ["b-0", "a-1", "a-0"]


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        # lowest priority first, whatever the age
        (
            [pod("hi", "h", priority=10, age_min=0), pod("lo", "l", priority=1, age_min=60)],
            ["lo", "hi"],
        ),
        # same priority: youngest job first (least work lost)
        ([pod("old", "o", age_min=60), pod("new", "n", age_min=1)], ["new", "old"]),
        # a job is as important as its most important pod
        (
            [pod("m-0", "m", priority=0), pod("m-1", "m", priority=9), pod("s", "s", priority=5)],
            ["s", "m-0", "m-1"],
        ),
        # same priority and age: the smaller job first, then by name
        ([pod("g-0", "g"), pod("g-1", "g"), pod("k-0", "k")], ["k-0", "g-0", "g-1"]),
        # a pod without a job is a job of its own
        ([pod("lone-b"), pod("lone-a")], ["lone-a", "lone-b"]),
    ],
)
def test_eviction_order_is_least_cost_first(pods: list[PodView], expected: list[str]) -> None:
    assert names(eviction_order(pods)) == expected


def test_a_pod_without_a_job_is_keyed_by_its_own_name() -> None:
    assert job_key(pod("x")) == "pod:training/x"
    assert [j.key for j in jobs([pod("x"), pod("y", "j")])] == ["j", "pod:training/x"]


def test_a_node_runs_what_an_earlier_node_of_its_name_left_only_if_borrowed_and_bound_before() -> (
    None
):
    created = T0 + timedelta(seconds=6)

    def bound(name: str, at: timedelta, role: PodRole = PodRole.BORROWED) -> PodView:
        return dataclasses.replace(pod(name, role=role), bound=T0 + at)

    pods = (
        bound("left", timedelta(0)),  # on the earlier node, 6 s before this one
        bound("same-second", timedelta(seconds=6)),  # may have been bound to this very node
        bound("after", timedelta(seconds=7)),
        bound("serving", timedelta(0), role=PodRole.INFERENCE),
        bound("stray", timedelta(0), role=PodRole.OTHER),  # no toleration: no loan's
        bound("exporter", timedelta(0), role=PodRole.DAEMON),
        dataclasses.replace(pod("unknown"), bound=None),
    )
    node = NodeView(NodeName("n"), {}, (), pods=pods, uid="u2", created=created)
    assert names(left_by_earlier_node(node)) == ["left"]
    # A node whose creation is not known says nothing of what came before it.
    assert left_by_earlier_node(dataclasses.replace(node, created=None)) == ()
