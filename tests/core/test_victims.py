"""Reclaim victims, least cost first: whole jobs together, lowest priority, then the least work
lost (GPUs times the time since the job's last checkpoint; a job that does not say is given the
median of those that do; when none says, the youngest first)."""

from __future__ import annotations

import dataclasses
import random
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer.core.model import NodeName, NodeView, PodRole, PodView, Resources
from rebalancer.core.victims import (
    Job,
    eviction_order,
    job_key,
    jobs,
    left_by_earlier_node,
)
from tests.support.factories import T0

MINUTE = timedelta(minutes=1)


def pod(
    name: str,
    job: str | None = None,
    priority: int = 0,
    age_min: int = 0,
    role: PodRole = PodRole.BORROWED,
    saved_min: float | None = None,
    gpus: int = 0,
) -> PodView:
    """A pod created ``age_min`` minutes before T0 that last saved ``saved_min`` minutes
    before T0 (None: it does not say), asking for ``gpus`` GPUs."""
    return PodView(
        namespace="training",
        name=name,
        role=role,
        priority=priority,
        job=job,
        created=T0 - timedelta(minutes=age_min),
        checkpointed=None if saved_min is None else T0 - saved_min * MINUTE,
        requests=Resources(gpu=gpus),
    )


def order(pods: list[PodView], now: datetime = T0) -> list[str]:
    """The jobs' keys, cheapest first."""
    return [j.key for j in jobs(pods, now)]


def by_key(pods: list[PodView], now: datetime = T0) -> dict[str, Job]:
    return {j.key: j for j in jobs(pods, now)}


def names(pods: tuple[PodView, ...]) -> list[str]:
    return [p.name for p in pods]


def test_only_borrowed_pods_are_ever_candidates() -> None:
    pods = [
        pod("serve", role=PodRole.INFERENCE),
        pod("exporter", role=PodRole.DAEMON),
        pod("misc", role=PodRole.OTHER),
        pod("train", job="j"),
    ]
    assert names(eviction_order(pods, T0)) == ["train"]


def test_a_jobs_pods_go_out_together_before_the_next_job() -> None:
    pods = [pod("a-0", "a", age_min=5), pod("b-0", "b", age_min=1), pod("a-1", "a", age_min=4)]
    # b started later (younger), so it goes first; then a's pods, youngest first.
    assert names(eviction_order(pods, T0)) == ["b-0", "a-1", "a-0"]


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        # lowest priority first, whatever the age
        (
            [pod("hi", "h", priority=10, age_min=0), pod("lo", "l", priority=1, age_min=60)],
            ["lo", "hi"],
        ),
        # same priority, none says when it saved: youngest job first (least work lost)
        ([pod("old", "o", age_min=60), pod("new", "n", age_min=1)], ["new", "old"]),
        # the one that saved a minute ago loses a minute; the other an hour: it goes last
        (
            [
                pod("stale", "a", age_min=90, saved_min=60),
                pod("fresh", "b", age_min=90, saved_min=1),
            ],
            ["fresh", "stale"],
        ),
        # lowest priority first, whatever either would lose
        (
            [pod("hi", "h", priority=5, saved_min=0), pod("lo", "l", priority=1, saved_min=60)],
            ["lo", "hi"],
        ),
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
    assert names(eviction_order(pods, T0)) == expected


def test_a_pod_without_a_job_is_keyed_by_its_own_name() -> None:
    assert job_key(pod("x")) == "pod:training/x"
    assert [j.key for j in jobs([pod("x"), pod("y", "j")], T0)] == ["j", "pod:training/x"]


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


def test_a_job_that_saved_a_minute_ago_goes_before_one_whose_checkpoint_is_old() -> None:
    """Same priority, size and age (named so that the key, the last tie-break, says the
    opposite): what each would lose decides."""
    pods = [
        pod("a-old-0", "a-old", age_min=120, saved_min=90),
        pod("b-new-0", "b-new", age_min=120, saved_min=1),
    ]
    assert order(pods) == ["b-new", "a-old"]
    assert by_key(pods)["a-old"].lost == 90 * MINUTE
    assert by_key(pods)["b-new"].lost == MINUTE


def test_gpus_weigh_what_a_job_would_lose() -> None:
    """8 GPUs that saved 10 minutes ago lose 80 GPU-minutes; 1 GPU 60 minutes ago, 60."""
    pods = [
        pod("wide-0", "wide", age_min=120, saved_min=10, gpus=8),
        pod("narrow-0", "narrow", age_min=120, saved_min=60, gpus=1),
    ]
    assert order(pods) == ["narrow", "wide"]
    assert by_key(pods)["wide"].cost == 8 * (10 * MINUTE // timedelta(microseconds=1))


def test_a_jobs_gpus_are_those_of_all_its_pods_and_at_least_one() -> None:
    pods = [
        pod("g-0", "g", gpus=4),
        pod("g-1", "g", gpus=4),
        pod("g-launcher", "g"),  # asks for none: adds nothing
        pod("cpu-0", "cpu"),  # a job that asks for none weighs as one
    ]
    found = by_key(pods)
    assert found["g"].gpus == 8
    assert found["cpu"].gpus == 1


def test_a_job_that_does_not_say_is_given_the_median_of_those_that_do() -> None:
    """Reporters at 10 and 50 minutes: the silent job of the same size ranks as 30 minutes,
    after one at 25 and before one at 35 (the median of 10, 25, 35, 50 is 30 as well)."""
    reporters = [
        pod(f"r{m}-0", f"r{m}", age_min=240, saved_min=m, gpus=1) for m in (10, 25, 35, 50)
    ]
    silent = pod("silent-0", "silent", age_min=240, gpus=1)
    assert order([*reporters, silent]) == ["r10", "r25", "silent", "r35", "r50"]
    assert by_key([reporters[0], reporters[3], silent])["silent"].lost == 30 * MINUTE
    assert not by_key([*reporters, silent])["silent"].reported
    assert by_key([*reporters, silent])["r10"].reported


def test_the_median_of_an_odd_count_is_the_middle_one() -> None:
    pods = [pod(f"r{m}-0", f"r{m}", age_min=240, saved_min=m) for m in (5, 20, 200)]
    assert by_key([*pods, pod("silent-0", "silent", age_min=240)])["silent"].lost == 20 * MINUTE


def test_the_prior_is_never_more_than_the_job_has_run() -> None:
    """A silent job that started 5 minutes ago can lose at most 5 minutes, whatever the others
    say: it goes before a reporter at 10 minutes."""
    pods = [
        pod("r-0", "r", age_min=240, saved_min=10),
        pod("r-1", "r2", age_min=240, saved_min=50),
        pod("young-0", "young", age_min=5),
    ]
    assert by_key(pods)["young"].lost == 5 * MINUTE
    assert order(pods) == ["young", "r", "r2"]


def test_when_none_says_each_job_loses_what_it_has_run() -> None:
    pods = [pod("a-0", "a", age_min=30, gpus=2), pod("b-0", "b", age_min=50, gpus=1)]
    assert by_key(pods)["a"].lost == 30 * MINUTE
    assert order(pods) == ["b", "a"]  # 50 GPU-minutes before 60


def test_a_gang_loses_back_to_its_oldest_checkpoint_and_goes_out_whole() -> None:
    gang = [
        pod("g-0", "g", age_min=120, saved_min=5, gpus=1),
        pod("g-1", "g", age_min=120, saved_min=40, gpus=1),  # this one is the gang's loss
        pod("g-2", "g", age_min=120, gpus=1),  # says nothing: the others speak for the gang
    ]
    other = pod("o-0", "o", age_min=180, saved_min=150, gpus=1)
    found = by_key([*gang, other])
    assert found["g"].lost == 40 * MINUTE
    assert found["g"].reported
    # 3 GPUs x 40 minutes = 120 GPU-minutes before 1 x 150: the gang first, its three pods
    # together, whatever order they came in.
    assert names(eviction_order([gang[0], other, gang[2], gang[1]], T0)) == [
        "g-0",
        "g-1",
        "g-2",
        "o-0",
    ]


def test_a_checkpoint_ahead_of_now_counts_as_saved_just_now() -> None:
    """A clock ahead makes a job look as if it just saved: it loses nothing, never less."""
    ahead = pod("ahead-0", "ahead", age_min=60, saved_min=-30)
    now_ = pod("now-0", "now", age_min=60, saved_min=0)
    found = by_key([ahead, now_])
    assert found["ahead"].lost == timedelta(0)
    assert found["ahead"].cost == found["now"].cost == 0


def test_a_checkpoint_cannot_claim_more_than_the_job_has_run() -> None:
    """A view whose checkpoint is before its job began (the adapter does not believe one before
    its pod was created; a view built otherwise) is held to the time the job has run."""
    claims = pod("claims-0", "claims", age_min=10, saved_min=600)
    assert by_key([claims])["claims"].lost == 10 * MINUTE


def test_now_is_the_callers_the_order_moves_with_it() -> None:
    """Costs are taken at ``now``: an hour later both have lost an hour more, and the weight
    of GPUs turns the order around."""
    pods = [
        pod("wide-0", "wide", age_min=600, saved_min=0, gpus=4),
        pod("narrow-0", "narrow", age_min=600, saved_min=100, gpus=1),
    ]
    assert order(pods) == ["wide", "narrow"]  # 0 before 100 GPU-minutes
    assert order(pods, T0 + 60 * MINUTE) == ["narrow", "wide"]  # 160 before 240


# ---------------------------------------------------------------------------------------------
# Properties

SAVED = st.one_of(st.none(), st.integers(min_value=-60, max_value=600))


@st.composite
def borrowed(draw: st.DrawFn) -> list[PodView]:
    count = draw(st.integers(min_value=1, max_value=12))
    return [
        pod(
            f"p{i}",
            draw(st.sampled_from(["a", "b", "c", "d", None])),
            priority=draw(st.integers(min_value=0, max_value=2)),
            age_min=draw(st.integers(min_value=0, max_value=600)),
            saved_min=draw(SAVED),
            gpus=draw(st.integers(min_value=0, max_value=8)),
        )
        for i in range(count)
    ]


@settings(max_examples=200, deadline=None)
@given(borrowed(), st.randoms())
def test_every_pod_once_jobs_whole_priority_first_whatever_the_input_order(
    pods: list[PodView], shuffle: random.Random
) -> None:
    ordered = eviction_order(pods, T0)
    assert sorted(names(ordered)) == sorted(p.name for p in pods)
    keys = [job_key(p) for p in ordered]
    # each job's pods in one run: a job, once left, never comes back
    assert len([k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]) == len(set(keys))
    ranked = jobs(pods, T0)
    assert [j.priority for j in ranked] == sorted(j.priority for j in ranked)
    assert all(j.lost >= timedelta(0) for j in ranked)
    again = list(pods)
    shuffle.shuffle(again)
    assert eviction_order(again, T0) == ordered


@settings(max_examples=200, deadline=None)
@given(borrowed())
def test_saying_nothing_costs_the_median_of_those_that_say(pods: list[PodView]) -> None:
    """A silent job's loss is the reporters' median, no more than it has run: not saying
    neither protects a job (it is not the dearest) nor singles it out (not the cheapest)."""
    ranked = jobs(pods, T0)
    said = sorted(j.lost for j in ranked if j.reported)
    for job in ranked:
        ran = max(T0 - job.started, timedelta(0))
        if job.reported:
            assert job.lost <= ran
        elif said:
            middle = len(said) // 2
            median = said[middle] if len(said) % 2 else (said[middle - 1] + said[middle]) / 2
            assert job.lost == min(median, ran)
        else:
            assert job.lost == ran


@settings(max_examples=200, deadline=None)
@given(borrowed(), st.integers(min_value=1, max_value=600))
def test_an_older_checkpoint_never_makes_a_lone_job_cheaper(
    pods: list[PodView], earlier: int
) -> None:
    """Saying one saved longer ago can only make a job dearer: no job is taken sooner for it."""
    lone = pod("lone", "lone", age_min=1200, saved_min=30, gpus=1)
    older = pod("lone", "lone", age_min=1200, saved_min=30 + earlier, gpus=1)
    before = by_key([*pods, lone])["lone"]
    after = by_key([*pods, older])["lone"]
    assert after.cost >= before.cost
