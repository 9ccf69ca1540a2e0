"""Victims by work lost, through the planner: of the lent nodes a reclaim may take, it takes
those whose jobs lose least (GPUs times the time since their last checkpoint), and a pod whose
checkpoint is not believed is reported on its node
(docs/design/reclaim-notice.md#victims-by-work-lost)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from rebalancer.core import model
from rebalancer.core.model import Action, Reason
from tests.support.factories import (
    T0,
    borrowed_pod,
    lend,
    plan,
    policy,
    serving,
    stepped,
    unaccounted,
)

RECLAIM = Action.RECLAIM
CHURN = policy(min_serving=0, max_step_fraction=1.0)
HOUR, MINUTE = timedelta(hours=1), timedelta(minutes=1)


def running(
    job: str, saved: timedelta | None = None, gpus: int = 1, index: int = 0
) -> model.PodView:
    """A pod of ``job`` running for three hours that last saved ``saved`` before T0."""
    return dataclasses.replace(
        borrowed_pod(job, index),
        created=T0 - 3 * HOUR,
        checkpointed=None if saved is None else T0 - saved,
        requests=model.Resources(gpu=gpus),
    )


def lent_with(name: str, *pods: model.PodView) -> model.NodeView:
    return lend(serving(name), T0 - 4 * HOUR, pods=pods)


def checked(result: model.PoolPlan) -> model.PoolPlan:
    assert unaccounted(result) == []
    return result


def test_a_reclaim_takes_the_node_whose_job_saved_last() -> None:
    """Three lone jobs of the same age; one node back: the job that saved a minute ago loses a
    minute, so its node goes, not the one whose job would lose two hours (named first, so that
    the name, the last tie-break, would have chosen it)."""
    nodes = [
        lent_with("a", running("a", saved=2 * HOUR)),
        lent_with("b", running("b", saved=MINUTE)),
        lent_with("c", running("c", saved=HOUR)),
    ]

    result = checked(plan(nodes, target=2, pool_policy=CHURN))

    assert stepped(result, RECLAIM) == ["b"]


def test_a_reclaim_weighs_what_each_job_holds() -> None:
    """8 GPUs that saved 20 minutes ago lose 160 GPU-minutes; 1 GPU an hour ago, 60."""
    nodes = [
        lent_with("wide", running("wide", saved=20 * MINUTE, gpus=8)),
        lent_with("narrow", running("narrow", saved=HOUR, gpus=1)),
    ]

    result = checked(plan(nodes, target=1, pool_policy=CHURN))

    assert stepped(result, RECLAIM) == ["narrow"]


def test_a_job_that_says_nothing_is_not_protected_by_its_silence() -> None:
    """Reporters at 10 and 50 minutes: the silent job counts as 30, so it goes before the one
    at 50, though it has run three hours (by age alone it would have been kept last)."""
    nodes = [
        lent_with("r10", running("r10", saved=10 * MINUTE)),
        lent_with("r50", running("r50", saved=50 * MINUTE)),
        lent_with("silent", running("silent")),
    ]

    result = checked(plan(nodes, target=1, pool_policy=CHURN))

    assert sorted(stepped(result, RECLAIM)) == ["r10", "silent"]


def test_a_checkpoint_not_believed_is_a_finding_on_the_pods_node() -> None:
    bad = model.Unbelieved(
        "rebalancer.io/last-checkpoint-time", "last tuesday", "not an RFC 3339 time"
    )
    pod = dataclasses.replace(running("job"), unbelieved=bad)
    other = dataclasses.replace(
        model.PodView("ns", "serving-0", model.PodRole.DAEMON), unbelieved=bad
    )
    node = lent_with("n", pod, other)

    result = checked(plan([node], target=1, pool_policy=CHURN))

    [finding] = [f for f in result.findings if f.reason is Reason.CHECKPOINT_NOT_BELIEVED]
    assert (finding.node, finding.key, finding.value) == (
        "n",
        "rebalancer.io/last-checkpoint-time",
        "last tuesday",
    )
    assert finding.message.startswith(
        "pod ns/job-worker-0: rebalancer.io/last-checkpoint-time='last tuesday' is not believed: "
        "not an RFC 3339 time"
    )
    assert stepped(result, RECLAIM) == []  # reported only: nothing is refused or taken for it
