"""Reading a node's state, so that it cannot be lost to another writer, and what a node carries
of ours (docs/design/other-writers.md)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from rebalancer.core import model
from rebalancer.core.nodestate import sealing
from rebalancer.core.nodestate.encoding import decode_original, parse_time
from rebalancer.core.nodestate.keys import Keys
from rebalancer.core.nodestate.values import (
    Drift,
    LendSpec,
    NodeState,
    Original,
    Phase,
    StateError,
)


def read(node: model.NodeView, keys: Keys) -> NodeState | StateError:
    """The node's state, or why it cannot be read. Read once per node value and key set (the
    node's ``memo``): a tick asks it of every node several times, and a value never changes."""
    memo_key = ("state", *_identity(keys))
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
    unverified = sealing.verify(node, keys)
    if unverified is not None:
        # Never acted on as written: the planner takes it back at once, within what the pool's
        # specification confirms (docs/design/node-state-integrity.md).
        value = ann.get(keys.signature, "")
        drift.insert(0, Drift(model.Reason.STATE_UNVERIFIED, keys.signature, value, unverified))
    return NodeState(
        phase=phase,
        original=original,
        since=since,
        decision=ann.get(keys.decision),
        deadline=deadline,
        drift=tuple(drift),
        verified=unverified is None,
    )


def _identity(keys: Keys) -> tuple[str, tuple[str, ...]]:
    """What a read depends on in ``keys``, cheap to hash: the prefix and the accepted key ids."""
    return keys.prefix, keys.seal.ids if keys.seal is not None else ()


_IN_POOL_KEYS: dict[tuple[int, int], tuple[Keys, tuple[model.Taint, ...], str]] = {}


def _in_pool_key(keys: Keys, lent: tuple[model.Taint, ...]) -> str:
    """``read_in_pool``'s memo key: what the read depends on (the prefix, the accepted key ids,
    the lent taints' key, value and effect) as one string, whose hash is kept; made once per
    ``keys`` and ``lent`` objects (held here, so their ids stay theirs), where a tuple of
    taints was built and hashed field by field at every look-up, several per node a tick."""
    found = _IN_POOL_KEYS.get((id(keys), id(lent)))
    if found is not None and found[0] is keys and found[1] is lent:
        return found[2]
    taints = tuple((t.key, t.value, t.effect) for t in lent)
    made = repr(("state-in-pool", *_identity(keys), taints))
    if len(_IN_POOL_KEYS) >= 64:  # settings reloaded many times: start again
        _IN_POOL_KEYS.clear()
    _IN_POOL_KEYS[(id(keys), id(lent))] = (keys, lent, made)
    return made


def read_in_pool(
    node: model.NodeView, keys: Keys, lent: tuple[model.Taint, ...]
) -> NodeState | StateError:
    """``read``, for a node of a pool whose lend adds the taints ``lent``: a node read as
    serving that carries one of them (key, value and effect) has lost its original, and cannot
    be read. The planner, the counts of a tick and the actuator all read a pool's nodes so."""
    memo_key = _in_pool_key(keys, lent)
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
