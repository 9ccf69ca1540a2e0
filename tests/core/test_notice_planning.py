"""The reclaim notice in the planner (docs/design/reclaim-notice.md): which reclaims are noticed
and for how long, which are not, what a node under notice counts as, and when a notice is
withdrawn."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from rebalancer.core import model, nodestate, windows
from rebalancer.core.model import Action, Reason
from rebalancer.core.notice import Answer, begins, due, summary
from tests.support.factories import (
    KEYS,
    T0,
    begin_reclaim,
    borrowed_pod,
    lend,
    plan,
    policy,
    serving,
    unaccounted,
    with_overrides,
)

NOTICE = timedelta(minutes=5)
HOUR = timedelta(hours=1)
NOTICED = policy(min_serving=0, reclaim_notice=NOTICE)


def lent_with(name: str, *pods: model.PodView) -> model.NodeView:
    return lend(serving(name), T0 - 2 * HOUR, pods=pods)


def noticed(node: model.NodeView, deadline: timedelta = NOTICE) -> model.NodeView:
    """``node`` (lent) under a notice given now, for ``deadline`` from now."""
    return nodestate.apply(node, nodestate.notice(KEYS, T0 + deadline, "notice-1"))


def job(name: str, index: int = 0) -> model.PodView:
    pod = borrowed_pod(name, index)
    return dataclasses.replace(pod, created=T0 - HOUR)


def steps(result: model.PoolPlan) -> list[tuple[str, Action, timedelta]]:
    assert unaccounted(result) == []
    return [(s.node, s.action, s.notice) for s in result.steps]


def test_a_strategy_reclaim_gives_the_pools_notice_to_a_node_with_borrowed_pods() -> None:
    nodes = [lent_with("a", job("a")), lent_with("b", job("b")), serving("s")]

    result = plan(nodes, target=1, rps=5.0, pool_policy=NOTICED)

    ((_, action, notice),) = steps(result)
    assert (action, notice) == (Action.RECLAIM, NOTICE)
    (step,) = result.steps
    assert not step.urgent
    assert step.notice_note == "its borrowed pods are told 0:05:00 ahead"


def test_a_node_with_nothing_to_tell_is_reclaimed_without_notice() -> None:
    nodes = [lent_with("idle"), serving("s")]

    result = plan(nodes, target=0, rps=5.0, pool_policy=NOTICED)

    assert steps(result) == [("idle", Action.RECLAIM, timedelta(0))]
    assert result.steps[0].notice_note == "no notice: no borrowed pod runs on it"


def test_demand_above_serving_takes_a_node_back_at_once_and_cuts_a_notice_short() -> None:
    """Inference is short now: no notice, and a node already under notice is taken first (its
    job is told already: taking it preempts no other)."""
    nodes = [
        noticed(lent_with("told", job("a"))),
        lent_with("other", job("b")),
        serving("s"),
    ]

    result = plan(nodes, target=1, rps=15.0, pool_policy=NOTICED)  # needs 2, 1 serves

    assert steps(result) == [("told", Action.RECLAIM, timedelta(0))]
    (step,) = result.steps
    assert step.urgent
    assert step.reason is Reason.DEMAND_ABOVE_SERVING
    assert step.notice_note.startswith("its notice is cut short: no notice for a")


def test_a_node_under_notice_is_not_noticed_again_nor_counted_as_a_kept_loan() -> None:
    """The strategy wants one lent of two; one is under notice already: nothing moves."""
    nodes = [noticed(lent_with("told", job("a"))), lent_with("kept", job("b")), serving("s")]

    result = plan(nodes, target=1, rps=5.0, pool_policy=NOTICED)

    assert steps(result) == []


def test_a_strategy_that_wants_more_lent_withdraws_notices_before_lending() -> None:
    nodes = [
        noticed(lent_with("told", job("a"))),
        lent_with("kept", job("b")),
        serving("s1"),
        serving("s2"),
    ]

    result = plan(nodes, target=2, rps=0.0, pool_policy=NOTICED)

    assert steps(result) == [("told", Action.WITHDRAW, timedelta(0))]
    assert result.steps[0].reason is Reason.NOTICE_WITHDRAWN


def test_no_notice_is_withdrawn_under_a_pause() -> None:
    nodes = [noticed(lent_with("told", job("a"))), serving("s1"), serving("s2")]

    result = plan(nodes, target=1, rps=0.0, pool_policy=NOTICED, paused=True)

    assert [s.action for s in result.steps] == []


def test_a_window_that_closes_within_the_notice_is_noticed_to_close_with_it() -> None:
    """The window closes in three minutes, within the five of the notice: told now."""
    close = (T0 + timedelta(minutes=3)).strftime("%H:%M")
    opened = (T0 - HOUR).strftime("%H:%M")
    window = windows.parse(f"Mon-Sun {opened}-{close} UTC")
    assert isinstance(window, windows.Window)
    nodes = [lent_with("a", job("a")), serving("s")]

    result = plan(nodes, target=1, rps=0.0, pool_policy=dataclasses.replace(NOTICED, window=window))

    assert steps(result) == [("a", Action.RECLAIM, NOTICE)]
    assert result.steps[0].reason is Reason.WINDOW_CLOSING


def test_an_operators_reclaim_now_gives_no_notice() -> None:
    node = with_overrides(lent_with("a", job("a")), reclaim="now")

    result = plan([node, serving("s")], target=0, rps=0.0, pool_policy=NOTICED)

    assert steps(result) == [("a", Action.RECLAIM, timedelta(0))]
    assert result.steps[0].reason is Reason.OPERATOR_RECLAIM_NOW


def test_a_gang_told_on_one_node_is_told_on_all_of_them_and_not_preempted_at_once() -> None:
    nodes = [
        lent_with("g-0", job("gang", 0)),
        lent_with("g-1", job("gang", 1)),
        lent_with("lone", dataclasses.replace(job("lone"), priority=100)),
        serving("s"),
    ]

    result = plan(nodes, target=2, rps=0.0, pool_policy=NOTICED)  # one back: the gang's

    assert sorted(steps(result)) == [
        ("g-0", Action.RECLAIM, NOTICE),
        ("g-1", Action.RECLAIM, NOTICE),
    ]


def test_the_lead_time_a_strategy_sees_includes_the_notice() -> None:
    assert NOTICED.lead_time == NOTICE + NOTICED.reclaim_deadline + NOTICED.warmup
    # A loan's worst case does not grow: a reclaim for demand gives no notice.
    assert NOTICED.loan_risk_minutes == policy(min_serving=0).loan_risk_minutes


# ---------------------------------------------------------------------------------------------
# One node's notice, pod by pod (``core.notice``)

DEADLINE = T0 + NOTICE


def answer(
    *,
    grace: int = 30,
    acked: bool = False,
    ended: bool = False,
    checkpointed: timedelta | None = None,
    gpus: float = 8,
) -> Answer:
    return Answer(
        gpus=gpus,
        grace=timedelta(seconds=grace),
        told=T0,
        acked=acked,
        ended=ended,
        checkpointed=None if checkpointed is None else T0 - checkpointed,
    )


def test_evictions_begin_at_the_deadline_less_the_longest_grace_of_the_pods_yet_to_answer() -> None:
    pods = [answer(grace=30), answer(grace=120), answer(grace=600, acked=True)]

    assert begins(DEADLINE, pods) == DEADLINE - timedelta(seconds=120)
    assert due(DEADLINE - timedelta(seconds=121), DEADLINE, pods) is None
    assert due(DEADLINE - timedelta(seconds=120), DEADLINE, pods) == (
        "the deadline less the pods' grace (120 s)"
    )


def test_evictions_begin_at_once_when_every_pod_has_answered() -> None:
    pods = [answer(acked=True), answer(ended=True)]

    assert begins(DEADLINE, pods) is None
    assert due(T0, DEADLINE, pods) == "every borrowed pod answered"


def test_the_summary_counts_the_work_lost_by_the_pods_that_did_not_answer() -> None:
    """8 GPUs ten minutes past their checkpoint lose 4,800 GPU-seconds; a pod that saved for
    the notice loses none; one that never reported is counted apart."""
    pods = [
        answer(checkpointed=timedelta(minutes=10)),
        answer(acked=True, checkpointed=timedelta(minutes=20)),
        answer(),
    ]

    notice = summary("r-1", T0, pods, "why")

    assert notice.lost_gpu_seconds == 8 * 600
    assert (notice.pods, notice.answered, notice.unknown) == (3, 1, 1)
    assert notice.given_seconds == 0
    later = summary("r-1", T0 + timedelta(minutes=4), pods, "why")
    assert later.given_seconds == 240
    assert later.answer_seconds == (240.0,)  # its checkpoint is older than the notice


def test_a_gang_cut_short_on_one_node_is_cut_short_on_all_of_them() -> None:
    """Both nodes of a gang are under notice; demand takes one back at once: the job is lost,
    so its other node is cut short with it instead of running on half a gang."""
    nodes = [
        noticed(lent_with("g-0", job("gang", 0))),
        noticed(lent_with("g-1", job("gang", 1))),
        serving("s"),
    ]

    result = plan(nodes, target=0, rps=15.0, pool_policy=NOTICED)  # needs 2, 1 serves

    assert sorted(steps(result)) == [
        ("g-0", Action.RECLAIM, timedelta(0)),
        ("g-1", Action.RECLAIM, timedelta(0)),
    ]
    assert {s.reason for s in result.steps} == {Reason.DEMAND_ABOVE_SERVING, Reason.GANG_PREEMPTED}


def test_a_gang_whose_other_node_began_its_reclaim_leaves_a_noticed_node_to_its_notice() -> None:
    """One node of the gang answered and is being reclaimed; the other's pods may still be
    saving their part: it is left to its notice."""
    nodes = [
        begin_reclaim(lent_with("g-0", job("gang", 0))),
        noticed(lent_with("g-1", job("gang", 1))),
        serving("s"),
    ]

    result = plan(nodes, target=0, rps=0.0, pool_policy=NOTICED)

    assert steps(result) == []


def test_a_gang_is_untold_whole_or_not_at_all() -> None:
    """Both nodes of a gang are under notice: a strategy that wants one more lent cannot
    withdraw half of it, and lends a serving node; one that wants both back lent withdraws
    both."""
    gang = [
        noticed(lent_with("g-0", job("gang", 0))),
        noticed(lent_with("g-1", job("gang", 1))),
    ]
    nodes = [*gang, serving("s1"), serving("s2")]

    one = plan(nodes, target=1, rps=0.0, pool_policy=NOTICED)
    two = plan(nodes, target=2, rps=0.0, pool_policy=NOTICED)

    assert [(node, action) for node, action, _ in steps(one)] == [("s1", Action.LEND)]
    assert sorted(steps(two)) == [
        ("g-0", Action.WITHDRAW, timedelta(0)),
        ("g-1", Action.WITHDRAW, timedelta(0)),
    ]


def test_a_notice_whose_job_is_on_a_node_on_its_way_back_is_not_withdrawn() -> None:
    nodes = [
        begin_reclaim(lent_with("g-0", job("gang", 0))),
        noticed(lent_with("g-1", job("gang", 1))),
        serving("s1"),
    ]

    result = plan(nodes, target=1, rps=0.0, pool_policy=NOTICED)

    assert [action for _, action, _ in steps(result)] == [Action.LEND]


def test_a_notice_a_pod_has_acknowledged_is_not_withdrawn() -> None:
    """The job saved and is stopping: withdrawing the notice would keep its node lent for
    nothing, and leave it on part of its nodes."""
    told = noticed(lent_with("told", dataclasses.replace(job("a"), acked="notice-1")))

    result = plan([told, serving("s1")], target=1, rps=0.0, pool_policy=NOTICED)

    assert [(node, action) for node, action, _ in steps(result)] == [("s1", Action.LEND)]
