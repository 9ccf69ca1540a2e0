"""Signing what the controller writes on a Node, and checking it when read back.

Where it sits: ``read`` checks every state in flight or lent (``verify``); the actuator passes
every node write through ``seal`` (the change plus the signature of the values it leaves); a
state that does not verify is taken back within what its pool's specification confirms
(``confirmed``). docs/design/node-state-integrity.md says why each choice.

What is signed: the node's UID, the key prefix, and the exact text of every key the
controller writes and later acts on (``covered``): the state label, ``original``, ``since``,
``decision`` and ``reclaim-deadline`` (absent keys too, so removing one breaks the signature).
The UID makes a signed state copied onto a node re-created under the same name fail; the
prefix keeps two controllers with one key but different prefixes apart. The pending audit
records (``<prefix>audit-pending``) are written by another writer of ours, the ledger, on its
own: they carry a signature of their own (``sign_text``), so that the ledger never has to
vouch for a state it did not check.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

from rebalancer.core import model
from rebalancer.core.nodestate import signing
from rebalancer.core.nodestate.keys import Keys
from rebalancer.core.nodestate.values import LendSpec, NodeChange, Original, merged, taint_key


def covered(keys: Keys) -> tuple[str, ...]:
    """The annotations the state signature covers; the state label is covered beside them."""
    return (keys.original, keys.since, keys.decision, keys.deadline)


def message(uid: str, keys: Keys, labels: Mapping[str, str], ann: Mapping[str, str]) -> bytes:
    doc = {
        "uid": uid,
        "prefix": keys.prefix,
        "state": labels.get(keys.state),
        **{name: ann.get(name) for name in covered(keys)},
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return b"rebalancer node-state v1\n" + text.encode()


def carries_state(node: model.NodeView, keys: Keys) -> bool:
    """Whether the node carries a state to act on: the state label or an ``original``. A
    serving node's ``since`` and ``decision`` alone steer nothing an override cannot (a later
    lend overwrites both), so they are not checked there."""
    return keys.state in node.labels or keys.original in node.annotations


def verify(node: model.NodeView, keys: Keys) -> str | None:
    """None when the node's state is the controller's own (or nothing is checked: no seal, or
    no state to act on); else why it is not."""
    if keys.seal is None or not carries_state(node, keys):
        return None
    signature = node.annotations.get(keys.signature)
    if signature is None:
        return (
            "not signed by the controller (written by another writer, or by a release before "
            "signatures)"
        )
    # Another writer may remove the state label alone (read as lent, a drift of its own:
    # docs/design/other-writers.md); the rest is still the controller's if it verifies with
    # the label the controller wrote, whichever of the three that was.
    labels = [node.labels]
    if keys.state not in node.labels:
        labels = [{keys.state: phase} for phase in ("lending", "lent", "reclaiming")]
    found = ""
    for candidate in labels:
        text = message(node.uid, keys, candidate, node.annotations)
        found = signing.check(keys.seal, text, signature) or ""
        if not found:
            return None
    return f"{found} (node uid {node.uid or 'unknown'})"


def seal(node: model.NodeView, change: NodeChange, keys: Keys) -> NodeChange:
    """``change`` with the signature of the values it leaves on ``node``. The write is locked
    to the version of ``node`` that was read, so what the signature covers and the change does
    not touch is what was read: it must have verified, or the change must set every covered
    key (a state that did not verify is never signed as it is)."""
    if keys.seal is None:
        return change
    touched = set(change.annotations) | ({keys.state} if keys.state in change.labels else set())
    every = {keys.state, *covered(keys)}
    assert every <= touched or verify(node, keys) is None, (
        f"node {node.name}: a write would sign a state that did not verify"
    )
    labels = merged(node.labels, change.labels)
    annotations = merged(node.annotations, change.annotations)
    signature = signing.sign(keys.seal, message(node.uid, keys, labels, annotations))
    return dataclasses.replace(
        change, annotations={**change.annotations, keys.signature: signature}
    )


def sign_text(keys: Keys, uid: str, name: str, text: str | None) -> str | None:
    """The signature of one annotation of ours written on its own (``name``, its ``text``),
    for the node ``uid``; None with no seal or no text."""
    if keys.seal is None or text is None:
        return None
    return signing.sign(keys.seal, _text_message(keys, uid, name, text))


def check_text(keys: Keys, uid: str, name: str, text: str, signature: str | None) -> str | None:
    """None when ``signature`` signs ``text`` as ``name`` on the node ``uid``; else why not."""
    if keys.seal is None:
        return None
    if signature is None:
        return "not signed by the controller"
    return signing.check(keys.seal, _text_message(keys, uid, name, text), signature)


def confirmed(original: Original, spec: LendSpec) -> Original:
    """``original`` trusted only as far as the pool's ``spec`` confirms it, for a state that
    did not verify (an original written by a release before signatures, or by someone else):
    the taints it says the lend added count only if they are the pool's lent taints, those it
    says the lend removed only if they are the pool's serving taints (put back as the pool
    names them), and the labels only those the pool's lend changes, at the pool's serving
    value where it names one. An unsigned original of an ordinary lend is confirmed whole, so
    an upgrade with nodes lent restores them byte for byte; a forged one cannot make a restore
    strip a foreign taint or write a foreign label."""
    lent = {taint_key(t) for t in spec.add_taints}
    serving = {taint_key(t): t for t in spec.remove_taints}
    added = original.added if original.added is not None else spec.add_taints
    removed = (
        original.removed
        if original.removed is not None
        else tuple(dict.fromkeys(taint_key(t) for t in spec.remove_taints))
    )
    taints = tuple(serving.get(taint_key(t), t) for t in original.taints)
    labels = {key: spec.serving_labels.get(key, original.labels.get(key)) for key in spec.labels}
    return Original(
        taints=taints,
        labels=labels,
        added=tuple(t for t in added if taint_key(t) in lent),
        removed=tuple(k for k in removed if k in serving),
    )


def _text_message(keys: Keys, uid: str, name: str, text: str) -> bytes:
    doc = {"uid": uid, "prefix": keys.prefix, "name": name, "text": text}
    body = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return b"rebalancer annotation v1\n" + body.encode()
