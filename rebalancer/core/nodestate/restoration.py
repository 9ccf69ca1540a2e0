"""Undoing a lend: which taints it owns, and the taints a node serves with once only what the
lend changed is put back (from its own original, or from the pool's specification)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rebalancer.core import model
from rebalancer.core.nodestate.keys import Keys
from rebalancer.core.nodestate.values import LendSpec, NodeState, Original, TaintKey, taint_key


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
    (at the front when there is none), and never before an original taint of ours that stood
    before it, so that our taints keep the original's order among them and, where nobody else
    wrote, the result is the original list byte for byte. Another writer's taint with a key
    and effect the lend owns is replaced by the recorded one (the API allows one taint per key
    and effect, and the recorded one is what the pool served under); a taint another writer
    removed stays removed.
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
            # Never back before a taint of ours the original put first: another writer may have
            # moved the anchor (taken a taint off and put one of its key and effect back at the
            # front), and the original's order among our taints is what the restore owes.
            anchor = max(anchor, anchor_of[index])
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
