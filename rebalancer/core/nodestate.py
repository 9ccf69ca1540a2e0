"""The lend/reclaim state machine as it is written on the Node itself.

Nothing that matters lives only in memory: a restarted controller rebuilds everything from the
keys below (docs/design/node-state.md). This module is the only code that knows their names and
formats.
It reads them (``read`` returns a ``NodeState`` or a ``StateError`` value, never raises) and
computes, as pure values, the metadata each transition writes; the actuator sends those writes,
the simulator applies them to its fake nodes.

```
serving ──lend──► lending ──► lent ──reclaim──► reclaiming ──► serving
   ▲                 │                              │
   └──── rollback ◄──┘                              └── deadline passed: force, then serving
```

``original`` is written before any taint or label changes and is the only source for restore, so
a crash at any instant leaves enough on the node to put it back byte for byte.

The controller is not the only writer on its nodes: a GPU health checker, the node lifecycle
controller, a cordon add and remove taints while a node is lent. So a restore (``begin_reclaim``,
``finish``) owns only what the lend changed: it takes out the taints the lend added, puts back the
ones it removed (both by key and effect), and leaves every other taint as it is on the node now
(``restore_taints``). Where nobody else wrote, that is the original list byte for byte. Labels
follow the same rule: restore writes only the labels the lend changed.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from rebalancer.core import model

# A DNS-1123 subdomain (dot-separated labels, each starting and ending alphanumeric, at most
# 253 characters) and the slash; used with fullmatch, so no trailing newline slips through.
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_PREFIX = re.compile(rf"(?=.{{2,254}}\Z){_LABEL}(\.{_LABEL})*/")


@dataclass(frozen=True, slots=True)
class Keys:
    """Every label, annotation and taint key the controller owns, under one prefix."""

    prefix: str = "rebalancer.io/"

    def __post_init__(self) -> None:
        if not _PREFIX.fullmatch(self.prefix):
            raise ValueError(
                f"key prefix {self.prefix!r} must be a DNS subdomain followed by '/', "
                "e.g. 'rebalancer.io/'"
            )

    state = property(lambda self: self.prefix + "state")
    original = property(lambda self: self.prefix + "original")
    since = property(lambda self: self.prefix + "since")
    decision = property(lambda self: self.prefix + "decision")
    deadline = property(lambda self: self.prefix + "reclaim-deadline")
    lent_taint = property(lambda self: self.prefix + "lent")
    # operator overrides (docs/operations.md)
    window = property(lambda self: self.prefix + "window")
    lend = property(lambda self: self.prefix + "lend")
    reclaim = property(lambda self: self.prefix + "reclaim")
    paused = property(lambda self: self.prefix + "paused")
    override_until = property(lambda self: self.prefix + "override-until")
    # on the controller's own Events, not on nodes: the cluster it runs in (docs/design/fleet.md)
    cluster = property(lambda self: self.prefix + "cluster")


class Phase(StrEnum):
    SERVING = "serving"  # the state label is absent
    LENDING = "lending"
    LENT = "lent"
    RECLAIMING = "reclaiming"


TaintKey = tuple[str, str]  # (key, effect): what the API keeps unique in a node's taints


def taint_key(taint: model.Taint) -> TaintKey:
    return (taint.key, taint.effect)


@dataclass(frozen=True, slots=True)
class Original:
    """What lending changed: the whole taint list before, and each changed label's old value.

    A label that lending added has ``None`` here: restore removes it. ``added`` and ``removed``
    are what the lend did to the taints (the taints it added; the key and effect of those it
    took out), as recorded by this release (format version 2); ``None`` in a version 1 record,
    as older releases wrote it, whose restore derives them from the pool's ``LendSpec``.
    """

    taints: tuple[model.Taint, ...]
    labels: Mapping[str, str | None]
    added: tuple[model.Taint, ...] | None = None
    removed: tuple[TaintKey, ...] | None = None


@dataclass(frozen=True, slots=True)
class Drift:
    """Something another writer changed on a node that is ours to finish: the node is still
    readable, but not as the controller left it (docs/design/other-writers.md)."""

    reason: model.Reason  # its own code: state_label_lost, state_unreadable, lent_taint_lost, ...
    key: str
    value: str
    why: str

    def __str__(self) -> str:
        return f"{self.key}={self.value!r}: {self.why}"


@dataclass(frozen=True, slots=True)
class NodeState:
    phase: Phase
    original: Original | None = None
    since: datetime | None = None
    decision: str | None = None
    deadline: datetime | None = None
    # What another writer changed that the read worked around (a lost state label read as
    # lent, a garbled time read as unknown); empty when the node is as the controller left it.
    drift: tuple[Drift, ...] = ()


@dataclass(frozen=True, slots=True)
class StateError:
    """A key the controller owns holds something it cannot read. The node is left alone."""

    key: str
    value: str
    why: str

    def __str__(self) -> str:
        return f"{self.key}={self.value!r}: {self.why}"


@dataclass(frozen=True, slots=True)
class LendSpec:
    """What lending does to a node of a pool: taints out, taints in, labels set or removed."""

    remove_taints: tuple[model.Taint, ...]  # matched by key and effect
    add_taints: tuple[model.Taint, ...]
    labels: Mapping[str, str | None] = field(default_factory=dict)  # None removes the label
    # The labels a serving node of the pool carries (its ``serving_labels`` setting): what a
    # restore from the specification sets, when a node's own original cannot be read.
    serving_labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeChange:
    """The metadata one transition writes. ``None`` in a mapping deletes that key.

    ``taints`` is the whole new list (the API treats it as atomic) or ``None`` for no change;
    ``kept``, for a restore, the taints of other writers it leaves on the node (not written:
    said in the result, the outcome record and the Event).
    """

    taints: tuple[model.Taint, ...] | None
    labels: Mapping[str, str | None]
    annotations: Mapping[str, str | None]
    kept: tuple[model.Taint, ...] = ()


# ---------------------------------------------------------------------------------------------
# Reading


def format_time(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime | str:
    """An RFC 3339 time with a zone, or the reason it is not one."""
    try:
        when = datetime.fromisoformat(text.strip().replace("z", "Z"))
    except ValueError:
        return "not an RFC 3339 time such as 2026-01-31T22:00:00Z"
    if when.tzinfo is None:
        return "has no time zone; write it in UTC with a trailing Z"
    try:
        return when.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59:59-01:00 is past the last representable UTC time
        return "is out of the representable range once converted to UTC"


def read(node: model.NodeView, keys: Keys) -> NodeState | StateError:
    """The node's state, or why it cannot be read. Read once per node value and key set (the
    node's ``memo``): a tick asks it of every node several times, and a value never changes."""
    memo_key = ("state", keys.prefix)  # a Keys is its prefix; a string hashes cheaply
    found = node.memo.get(memo_key)
    if not isinstance(found, NodeState | StateError):
        found = node.memo[memo_key] = _read(node, keys)
    return found


def _read(node: model.NodeView, keys: Keys) -> NodeState | StateError:
    """The state as written, read so that it cannot be lost (docs/design/other-writers.md): a
    node that carries our ``original`` is never serving, whatever its labels say (one that
    carries a pool's lent taint is not either: ``read_in_pool``), and a garbled time next to a
    readable original is a drift, not a reason to give up."""
    raw_phase = node.labels.get(keys.state)
    ann = node.annotations
    drift: list[Drift] = []
    if raw_phase is None:
        phase = Phase.SERVING
        if keys.original in ann:
            # Another writer removed the label: lend, lent and reclaim all write the label and
            # the original together, so the node was lent or on its way; read as lent, the
            # planner takes it back through the ordinary reclaim, from its own original.
            phase = Phase.LENT
            why = f"the state label is gone but {keys.original} is there: read as lent"
            drift.append(Drift(model.Reason.STATE_LABEL_LOST, keys.state, "", why))
    else:
        try:
            phase = Phase(raw_phase)
        except ValueError:
            return StateError(keys.state, raw_phase, "not one of lending, lent, reclaiming")
        if phase is Phase.SERVING:
            return StateError(keys.state, raw_phase, "serving is written as no label")
    original: Original | None = None
    if keys.original in ann:
        decoded = decode_original(ann[keys.original])
        if isinstance(decoded, str):
            return StateError(keys.original, ann[keys.original], decoded)
        original = decoded
    if phase is not Phase.SERVING and original is None:
        return StateError(keys.state, raw_phase or "", f"no {keys.original} to restore from")
    times: list[datetime | None] = []
    for key in (keys.since, keys.deadline):
        parsed = _time_or_none(ann, key)
        if isinstance(parsed, StateError):
            # Unknown, not fatal: no cooldown or loan time is measured from it, and a missing
            # deadline counts as passed. The planner reports it and takes a lent node back.
            reason = model.Reason.STATE_UNREADABLE
            drift.append(Drift(reason, key, parsed.value, f"{parsed.why}; read as unknown"))
            parsed = None
        times.append(parsed)
    since, deadline = times
    return NodeState(
        phase=phase,
        original=original,
        since=since,
        decision=ann.get(keys.decision),
        deadline=deadline,
        drift=tuple(drift),
    )


def read_in_pool(
    node: model.NodeView, keys: Keys, lent: tuple[model.Taint, ...]
) -> NodeState | StateError:
    """``read``, for a node of a pool whose lend adds the taints ``lent``: a node read as
    serving that carries one of them (key, value and effect) has lost its original, and cannot
    be read. The planner, the counts of a tick and the actuator all read a pool's nodes so."""
    memo_key = ("state-in-pool", keys.prefix, lent)
    found = node.memo.get(memo_key)
    if not isinstance(found, NodeState | StateError):
        found = node.memo[memo_key] = _left_behind(node, read(node, keys), keys, lent)
    return found


def _left_behind(
    node: model.NodeView, state: NodeState | StateError, keys: Keys, lent: tuple[model.Taint, ...]
) -> NodeState | StateError:
    if isinstance(state, StateError) or state.phase is not Phase.SERVING:
        return state
    wanted = {(t.key, t.value, t.effect) for t in lent}
    found = next((t for t in node.taints if (t.key, t.value, t.effect) in wanted), None)
    if found is None:
        return state
    return StateError(found.key, str(found), f"a lent taint with no {keys.original} beside it")


def _time_or_none(ann: Mapping[str, str], key: str) -> datetime | StateError | None:
    if key not in ann:
        return None
    parsed = parse_time(ann[key])
    return StateError(key, ann[key], parsed) if isinstance(parsed, str) else parsed


def encode_original(original: Original) -> str:
    """Version 2 when the record says what the lend did to the taints, else version 1."""
    doc: dict[str, Any] = {
        "v": 1,
        "taints": [t.to_doc() for t in original.taints],
        "labels": dict(original.labels),
    }
    if original.added is not None and original.removed is not None:
        doc["v"] = 2
        doc["added"] = [t.to_doc() for t in original.added]
        doc["removed"] = [{"key": k, "effect": e} for k, e in original.removed]
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def decode_original(text: str) -> Original | str:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg} at character {exc.pos})"
    except (ValueError, RecursionError) as exc:  # an over-long integer, nesting too deep
        return f"not readable JSON ({type(exc).__name__})"
    if not isinstance(doc, dict) or type(doc.get("v")) is not int or doc["v"] not in (1, 2):
        return (
            'not a version 1 or 2 record ({"v": 2, "taints": [...], "labels": {...}, '
            '"added": [...], "removed": [...]})'
        )
    taints_doc, labels_doc = doc.get("taints"), doc.get("labels")
    if not isinstance(taints_doc, list) or not isinstance(labels_doc, dict):
        return "needs a list 'taints' and an object 'labels'"
    taints = _taints_from_docs(taints_doc)
    if isinstance(taints, str):
        return taints
    for key, value in labels_doc.items():
        if not (value is None or isinstance(value, str)):
            return f"label {key!r} must map to a string or null, not {value!r}"
    if doc["v"] == 1:
        return Original(taints=taints, labels=dict(labels_doc))
    added_doc, removed_doc = doc.get("added"), doc.get("removed")
    if not isinstance(added_doc, list) or not isinstance(removed_doc, list):
        return "a version 2 record needs the lists 'added' and 'removed'"
    added = _taints_from_docs(added_doc)
    if isinstance(added, str):
        return added
    removed: list[TaintKey] = []
    for item in removed_doc:
        if not isinstance(item, dict) or not all(
            isinstance(item.get(k), str) for k in ("key", "effect")
        ):
            return f"removed taint {item!r} needs string 'key' and 'effect'"
        removed.append((item["key"], item["effect"]))
    return Original(taints=taints, labels=dict(labels_doc), added=added, removed=tuple(removed))


def _taints_from_docs(docs: list[Any]) -> tuple[model.Taint, ...] | str:
    taints: list[model.Taint] = []
    for item in docs:
        taint = _taint_from_doc(item)
        if taint is None:
            return (
                f"taint {item!r} needs string 'key' and 'effect', and optional string 'value' "
                "and 'timeAdded'"
            )
        taints.append(taint)
    return tuple(taints)


def _taint_from_doc(item: Any) -> model.Taint | None:
    if not isinstance(item, dict):
        return None
    key, effect, value = item.get("key"), item.get("effect"), item.get("value")
    added = item.get("timeAdded")
    if not isinstance(key, str) or not isinstance(effect, str):
        return None
    if any(v is not None and not isinstance(v, str) for v in (value, added)):
        return None
    return model.Taint(key=key, effect=effect, value=value, time_added=added)


def serving_labels(node: model.NodeView, state: NodeState) -> Mapping[str, str]:
    """The labels the node has (or will have again) when it serves: used for pool membership."""
    if state.original is None:
        return node.labels
    labels = dict(node.labels)
    for key, value in state.original.labels.items():
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value
    return labels


def carries_ours(node: model.NodeView, keys: Keys, lent: tuple[model.Taint, ...] = ()) -> bool:
    """Whether the node carries a key that says the controller has not finished with it: the
    state label, ``original``, or a lent taint (ours by prefix, or one of ``lent`` by key and
    effect). ``since`` and ``decision`` stay after a reclaim, so they do not count."""
    if keys.state in node.labels or keys.original in node.annotations:
        return True
    wanted = {(t.key, t.effect) for t in lent}
    return any(t.key.startswith(keys.prefix) or (t.key, t.effect) in wanted for t in node.taints)


def missing_lent_taints(node: model.NodeView, spec: LendSpec) -> tuple[model.Taint, ...]:
    """The lent taints of ``spec`` a node does not carry (by key and effect): on a lent node,
    what another writer removed, so that pods with no toleration may land on it."""
    present = {(t.key, t.effect) for t in node.taints}
    return tuple(t for t in spec.add_taints if (t.key, t.effect) not in present)


def spec_original(node: model.NodeView, spec: LendSpec, keys: Keys) -> Original:
    """What a node serves with by its pool's specification alone, for a node whose own
    ``original`` cannot be read: the taints it has now without the pool's lent taints and
    ours, with the serving taints added where missing (by key and effect), and each label the
    lend changes at its serving value (removed when the pool names none). Everything another
    writer put on the node stays, in its place."""
    lent = {(t.key, t.effect) for t in spec.add_taints}
    kept = [
        t
        for t in node.taints
        if (t.key, t.effect) not in lent and not t.key.startswith(keys.prefix)
    ]
    present = {(t.key, t.effect) for t in kept}
    serving = tuple(t for t in spec.remove_taints if (t.key, t.effect) not in present)
    labels: dict[str, str | None] = dict.fromkeys(spec.labels)
    labels.update(spec.serving_labels)
    return Original(taints=(*kept, *serving), labels=labels)


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
    )


# ---------------------------------------------------------------------------------------------
# Transitions: each returns the metadata to write; none of them performs a write.


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


def recorded_lend(original: Original, spec: LendSpec | None) -> LendSpec | None:
    """What the lend did to the taints: as recorded (version 2), else as the pool's ``spec``
    says now (a version 1 record); None when neither can say (a version 1 record of a node no
    pool selects)."""
    if original.added is not None and original.removed is not None:
        removed = tuple(model.Taint(key=k, effect=e) for k, e in original.removed)
        return LendSpec(removed, original.added, spec.labels if spec is not None else {})
    return spec


def owned_taints(
    original: Original, spec: LendSpec | None, now: Sequence[model.Taint], keys: Keys
) -> set[TaintKey]:
    """The keys and effects of the taints a restore owns: those the lend added or removed.

    Without a record of the lend and without a spec (a version 1 record on a node no pool
    selects), the lend's doing is read off the node: the controller's own lent taint, and any
    original taint the node no longer has (putting one back errs toward inference)."""
    lend = recorded_lend(original, spec)
    if lend is not None:
        return {taint_key(t) for t in (*lend.remove_taints, *lend.add_taints)}
    present = {taint_key(t) for t in now}
    gone = {taint_key(t) for t in original.taints} - present
    return gone | {taint_key(t) for t in now if t.key == keys.lent_taint}


@dataclass(frozen=True, slots=True)
class Restore:
    """The taints a restore writes, and what of other writers' work it keeps or leaves."""

    taints: tuple[model.Taint, ...]
    kept: tuple[model.Taint, ...]  # on the node now and not in the original: another writer's
    left_removed: tuple[model.Taint, ...]  # in the original, not ours, removed by another writer


def restore_taints(now: Sequence[model.Taint], original: Original, owned: set[TaintKey]) -> Restore:
    """The node's taints once what the lend changed is undone, and nothing else.

    Every taint whose key and effect the lend owns (``owned``) is taken off the node, and the
    original's taints of those keys are put back; every other taint stays exactly as it is now
    (value, ``timeAdded``, order). A taint the lend removed goes back where it stood in the
    original list: right after the nearest original taint before it that is still on the node
    (at the front when there is none), so that where nobody else wrote, the result is the
    original list byte for byte. Another writer's taint with a key and effect the lend owns is
    replaced by the recorded one (the API allows one taint per key and effect, and the recorded
    one is what the pool served under); a taint another writer removed stays removed.
    """
    kept = [t for t in now if taint_key(t) not in owned]
    # Pair each original taint that is not ours with the taint on the node now of the same key
    # and effect, in order (the API keeps them unique; the pairing is also exact for lists
    # that are not, as a hand-written record may be).
    unpaired = list(range(len(kept)))
    anchor_of: dict[int, int] = {}  # original index -> index in ``kept``
    for index, taint in enumerate(original.taints):
        if taint_key(taint) in owned:
            continue
        match = next((i for i in unpaired if taint_key(kept[i]) == taint_key(taint)), None)
        if match is not None:
            unpaired.remove(match)
            anchor_of[index] = match
    after: dict[int, list[model.Taint]] = {}  # kept index (-1: the front) -> put back there
    anchor = -1
    for index, taint in enumerate(original.taints):
        if taint_key(taint) in owned:
            after.setdefault(anchor, []).append(taint)
        elif index in anchor_of:
            anchor = anchor_of[index]
    result = list(after.get(-1, []))
    for i, taint in enumerate(kept):
        result.append(taint)
        result.extend(after.get(i, []))
    left = tuple(
        t for i, t in enumerate(original.taints) if taint_key(t) not in owned and i not in anchor_of
    )
    foreign = tuple(t for t in kept if t not in original.taints)
    return Restore(taints=tuple(result), kept=foreign, left_removed=left)


def restore(
    state: NodeState, taints: Sequence[model.Taint], spec: LendSpec | None, keys: Keys
) -> Restore:
    """``restore_taints`` for a node whose state is ``state`` and whose taints now are
    ``taints``; ``spec`` is its pool's (None when no pool selects it)."""
    assert state.original is not None, "a node in flight or lent always carries its originals"
    owned = owned_taints(state.original, spec, taints, keys)
    return restore_taints(taints, state.original, owned)


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
    labels = _merge(node.labels, change.labels)
    annotations = _merge(node.annotations, change.annotations)
    taints = node.taints if change.taints is None else change.taints
    return dataclasses.replace(node, labels=labels, taints=taints, annotations=annotations)


def _merge(current: Mapping[str, str], change: Mapping[str, str | None]) -> dict[str, str]:
    merged = dict(current)
    for key, value in change.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged
