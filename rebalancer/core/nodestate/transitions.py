"""The transitions: each returns the metadata to write (a ``NodeChange``); none of them performs
a write, and ``apply`` shows a node as it looks once one is written."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime

from rebalancer.core import model
from rebalancer.core.nodestate import sealing
from rebalancer.core.nodestate.encoding import encode_original, format_time
from rebalancer.core.nodestate.keys import Keys
from rebalancer.core.nodestate.restoration import (
    owned_taints,
    recorded_lend,
    restore,
    restore_taints,
    spec_original,
)
from rebalancer.core.nodestate.values import (
    LendSpec,
    NodeChange,
    NodeState,
    Original,
    Phase,
    merged,
    taint_key,
)


def begin_restore_from_spec(
    node: model.NodeView,
    spec: LendSpec,
    keys: Keys,
    now: datetime,
    deadline: datetime,
    decision: str,
) -> NodeChange:
    """unreadable -> reclaiming, from the pool's specification (``spec_original``): the serving
    taints and labels are written at once, so nothing new lands, and the rebuilt original
    replaces the unreadable one so that the drain and ``finish`` go on as for any reclaim.
    The unreadable text itself is kept in the audit log (the finding and the intent's
    ``before``), not on the node."""
    original = spec_original(node, spec, keys)
    return _restoring(original, keys, now, deadline, decision)


def begin_restore_confirmed(
    node: model.NodeView,
    state: NodeState,
    spec: LendSpec,
    keys: Keys,
    now: datetime,
    deadline: datetime,
    decision: str,
) -> NodeChange:
    """unverified (in any phase) -> reclaiming: a state the controller cannot show to be its
    own is never acted on as written. Its original counts only as far as the pool's
    specification confirms it (``sealing.confirmed``): what the lend did is undone for the
    pool's own lent and serving taints alone, the labels the pool's lend changes are set to
    their serving values, any taint under our prefix goes and a serving taint still missing
    is added; every other taint and label stays as it is now. Every key of ours is written
    anew (``original`` rebuilt from what was confirmed), so the signature the write carries
    vouches only for what the controller checked. Where the original was an ordinary lend's,
    unsigned because an earlier release wrote it, the node ends as it was before the loan,
    byte for byte."""
    if state.original is None:
        return begin_restore_from_spec(node, spec, keys, now, deadline, decision)
    trusted = sealing.confirmed(state.original, spec)
    owned = owned_taints(trusted, spec, node.taints, keys)
    restored = restore_taints(node.taints, trusted, owned)
    taints = [t for t in restored.taints if not t.key.startswith(keys.prefix)]
    present = {taint_key(t) for t in taints}
    taints += [t for t in spec.remove_taints if taint_key(t) not in present]
    original = dataclasses.replace(trusted, taints=tuple(taints))
    return _restoring(original, keys, now, deadline, decision, kept=restored.kept)


def _restoring(
    original: Original,
    keys: Keys,
    now: datetime,
    deadline: datetime,
    decision: str,
    kept: tuple[model.Taint, ...] = (),
) -> NodeChange:
    """-> reclaiming from an ``original`` the controller rebuilt: its taints and labels written
    at once, and every key of ours written anew around it."""
    labels: dict[str, str | None] = dict(original.labels)
    labels[keys.state] = Phase.RECLAIMING.value
    return NodeChange(
        taints=original.taints,
        labels=labels,
        annotations={
            keys.original: encode_original(original),
            keys.since: format_time(now),
            keys.deadline: format_time(deadline),
            keys.decision: decision,
        },
        kept=kept,
    )


def begin_lend(
    node: model.NodeView, spec: LendSpec, keys: Keys, now: datetime, decision: str
) -> NodeChange:
    """serving -> lending: record the originals, and what the lend will do to the taints, before
    anything else changes."""
    changed = {key: node.labels.get(key) for key in spec.labels}
    original = Original(
        taints=node.taints,
        labels=changed,
        added=spec.add_taints,
        removed=tuple(dict.fromkeys(taint_key(t) for t in spec.remove_taints)),
    )
    return NodeChange(
        taints=None,
        labels={keys.state: Phase.LENDING.value},
        annotations={
            keys.original: encode_original(original),
            keys.since: format_time(now),
            keys.decision: decision,
            keys.deadline: None,
        },
    )


def lent_taints(original: tuple[model.Taint, ...], spec: LendSpec) -> tuple[model.Taint, ...]:
    removed = {(t.key, t.effect) for t in spec.remove_taints}
    added = {(t.key, t.effect) for t in spec.add_taints}
    kept = tuple(t for t in original if (t.key, t.effect) not in removed | added)
    return kept + spec.add_taints


def finish_lend(spec: LendSpec, state: NodeState, keys: Keys, now: datetime) -> NodeChange:
    """lending -> lent: swap taints and labels as the pool says. Needs the recorded originals.
    The taints change as ``begin_lend`` recorded, so that the restore undoes exactly this."""
    assert state.original is not None, "finish_lend needs the originals written by begin_lend"
    labels: dict[str, str | None] = dict(spec.labels)
    labels[keys.state] = Phase.LENT.value
    lend = recorded_lend(state.original, spec) or spec
    return NodeChange(
        taints=lent_taints(state.original.taints, lend),
        labels=labels,
        annotations={keys.since: format_time(now)},
    )


def begin_reclaim(
    state: NodeState,
    keys: Keys,
    now: datetime,
    deadline: datetime,
    decision: str,
    *,
    taints: Sequence[model.Taint],
    spec: LendSpec | None,
) -> NodeChange:
    """lent -> reclaiming: restore the inference taints and labels first, so nothing new lands.

    ``taints`` are the node's taints as just read; only what the lend changed is undone
    (``restore``), ``spec`` being the pool's lend spec (for a version 1 record)."""
    assert state.original is not None, "a lent node always carries its originals"
    labels: dict[str, str | None] = dict(state.original.labels)
    labels[keys.state] = Phase.RECLAIMING.value
    restored = restore(state, taints, spec, keys)
    return NodeChange(
        taints=restored.taints,
        labels=labels,
        annotations={
            keys.since: format_time(now),
            keys.deadline: format_time(deadline),
            keys.decision: decision,
        },
        kept=restored.kept,
    )


def notice(keys: Keys, deadline: datetime, decision: str) -> NodeChange:
    """lent -> noticed: the deadline by which the borrowed pods must be gone, and the notice's
    audit record (the reclaim id the pods are told). Annotations only: the node stays lent,
    its taints and labels as they are, until the reclaim begins (``begin_reclaim``).
    ``since`` stays: the loan's age (the minimum loan, an unused loan) is the lend's."""
    return NodeChange(
        taints=None,
        labels={},
        annotations={keys.deadline: format_time(deadline), keys.decision: decision},
    )


def withdraw(keys: Keys, decision: str) -> NodeChange:
    """noticed -> lent: the notice withdrawn (``decision`` records why), the loan goes on."""
    return NodeChange(
        taints=None, labels={}, annotations={keys.deadline: None, keys.decision: decision}
    )


def take_over(keys: Keys, decision: str) -> NodeChange:
    """A transition in flight changes hands: ``decision`` (a recovery's audit record) now names
    what moves the node, so the writes that end it are traced to the record that made them."""
    return NodeChange(taints=None, labels={}, annotations={keys.decision: decision})


def finish(
    state: NodeState,
    keys: Keys,
    now: datetime,
    *,
    taints: Sequence[model.Taint],
    spec: LendSpec | None,
) -> NodeChange:
    """reclaiming or lending -> serving: what the lend changed undone, every key of ours removed.

    Used both to end a reclaim and to roll back a lend that a crash interrupted; ``taints`` and
    ``spec`` as for ``begin_reclaim`` (on a ``lending`` node the lend changed no taint yet, so
    the taints stay as they are, bar a lent taint of ours). ``since`` stays, and so does
    ``decision``: the cooldown after a reclaim is measured from the one, and the other still
    names the audit record of the last transition.
    """
    assert state.original is not None
    labels: dict[str, str | None] = dict(state.original.labels)
    labels[keys.state] = None
    annotations: dict[str, str | None] = {
        keys.original: None,
        keys.deadline: None,
        keys.since: format_time(now),
    }
    restored = restore(state, taints, spec, keys)
    return NodeChange(restored.taints, labels, annotations, kept=restored.kept)


def apply(node: model.NodeView, change: NodeChange) -> model.NodeView:
    """The node as it looks once ``change`` is written: what a fake cluster does on a patch."""
    labels = merged(node.labels, change.labels)
    annotations = merged(node.annotations, change.annotations)
    taints = node.taints if change.taints is None else change.taints
    return dataclasses.replace(node, labels=labels, taints=taints, annotations=annotations)
