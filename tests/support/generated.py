"""Generated pools for property tests: nodes in every phase (built with the codec), nodes whose
state cannot be read, idle and busy nodes, ready and not, operator overrides valid and garbage,
and random policies. The planner's properties (``tests/core/test_planning_properties.py``) and
the tick's step (``tests/runtime/test_step.py``) draw from the same generators.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import strategies as st

from rebalancer.core import model, nodestate, windows
from rebalancer.core.model import PodRole
from rebalancer.core.policy import ALL_GUARDS, PoolPolicy
from tests.support.factories import (
    KEYS,
    LEND_SPEC,
    begin_reclaim,
    lend,
    lending,
    rebuilt,
    returned,
    serving,
)

WINDOWS = (
    "always",
    "never",
    "Mon-Fri 22:00-06:00 UTC",
    "daily 09:00-17:00 Europe/Berlin",
    "Sat,Sun 00:00-24:00",
)
GARBAGE = ("", "sometimes", "Mon-Fri 25:00-06:00", "tomorrow", "TRUE ", " now", "{}")
PHASES = ("serving", "returned", "lending", "lent", "reclaiming", "unreadable", "unknown-label")


def minutes(low: float, high: float) -> st.SearchStrategy[timedelta]:
    return st.floats(low, high).map(lambda m: timedelta(minutes=m))


def parsed_window(text: str) -> windows.Window:
    window = windows.parse(text)
    assert isinstance(window, windows.Window)
    return window


# Strategies are built once, at import: building them inside a draw costs more than the plan.
AGES = minutes(0, 180)
POLICIES = st.builds(
    PoolPolicy,
    rps_per_node=st.floats(0.5, 100.0),
    min_serving=st.integers(0, 6),
    headroom=st.floats(0.0, 1.0),
    max_lent_fraction=st.floats(0.0, 1.0),
    min_loan=minutes(0, 120),
    cooldown=minutes(0, 60),
    max_step_fraction=st.floats(0.01, 1.0),
    staleness=minutes(0.5, 10),
    stale_grace=minutes(0, 10),
    window=st.sampled_from(WINDOWS).map(parsed_window),
    zone=st.sampled_from(("UTC", "Asia/Tokyo", "America/New_York")),
    lend_spec=st.just(LEND_SPEC),
    queue_limit=st.sampled_from((0.0, 5.0, 100.0)),
    guards=st.sampled_from((ALL_GUARDS, frozenset())),  # as the controller, or a baseline
)
JOBS = st.sampled_from((None, "j1", "j2", "j3"))
PODS = st.lists(st.tuples(st.sampled_from(list(PodRole)), JOBS), max_size=4).map(
    lambda drawn: tuple(
        model.PodView("ns", f"pod-{i}", role, job=job if role is PodRole.BORROWED else None)
        for i, (role, job) in enumerate(drawn)
    )
)
PAST, FUTURE, NOW_TEXT = "past", "future", "now-exactly"
OVERRIDE_VALUES = {
    KEYS.window: st.sampled_from((*WINDOWS, *GARBAGE)),
    KEYS.lend: st.sampled_from(("never", "auto", "now", "NOW ", *GARBAGE)),
    KEYS.reclaim: st.sampled_from(("now", *GARBAGE)),
    KEYS.paused: st.sampled_from(("true", "false", *GARBAGE)),
    KEYS.override_until: st.sampled_from((PAST, FUTURE, NOW_TEXT, *GARBAGE)),
}
OVERRIDES = st.dictionaries(
    st.sampled_from(sorted(OVERRIDE_VALUES)), st.just(""), max_size=3
).flatmap(lambda chosen: st.fixed_dictionaries({key: OVERRIDE_VALUES[key] for key in chosen}))


def expiry(value: str, now: datetime) -> str:
    """Turn the symbolic expiries into times around ``now``; garbage stays garbage."""
    offsets = {PAST: -timedelta(hours=1), FUTURE: timedelta(hours=1), NOW_TEXT: timedelta(0)}
    return nodestate.format_time(now + offsets[value]) if value in offsets else value


@st.composite
def nodes(draw: st.DrawFn, name: str, now: datetime) -> model.NodeView:
    phase = draw(st.sampled_from(PHASES))
    lent_at = now - draw(AGES)
    base = serving(name)
    if phase == "returned":
        node = returned(name, lent_at - timedelta(hours=1), lent_at)
    elif phase == "lending":
        node = lending(base, lent_at)
    elif phase == "lent":
        node = lend(base, lent_at)
    elif phase == "reclaiming":
        node = begin_reclaim(lend(base, lent_at - timedelta(hours=1)), lent_at)
    elif phase == "unreadable":
        node = lend(base, lent_at)
        node = rebuilt(node, annotations={**node.annotations, KEYS.original: "[]"})
    elif phase == "unknown-label":
        node = model.NodeView(
            name=base.name, labels={**base.labels, KEYS.state: "borrowed"}, taints=base.taints
        )
    else:
        node = base
    annotations = dict(node.annotations)
    for key, value in draw(OVERRIDES).items():
        annotations[key] = expiry(value, now) if key == KEYS.override_until else value
    return rebuilt(node, pods=draw(PODS), ready=draw(st.booleans()), annotations=annotations)
