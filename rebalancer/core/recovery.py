"""What a restarted controller makes of what a previous run left: open intents, nodes in flight.

Where it sits: ``Reconciler.start`` (the first tick of a stretch of leadership) reads the
intents the audit store holds without a final outcome (none, or only ``in_progress`` passes of
a drain) and the nodes as the informer sees them, asks
``judge`` what each intent came to, and writes the verdicts before any write to a node. Pure:
the records and views are arguments.

Why: the audit log says what really happened. An intent a run wrote before it was killed is
not "never carried out" just because no outcome follows it: the node says how far it got. Its
``decision`` annotation names the record of the last transition it went through
(docs/design/node-state.md), so for an open intent ``X`` on node ``n``:

- ``n`` is gone, or is another node of that name (its UID is not the one ``X`` recorded):
  ``gone``;
- ``decision`` is not ``X``: ``superseded``, never carried out;
- a lend ``X`` and ``n`` lent, or a reclaim or a recovery's rollback ``X`` and ``n`` serving:
  ``applied``, by the run that wrote ``X``;
- a lend ``X`` and ``n`` serving: ``refused``, begun and then undone by that run (a pod landed);
- ``n`` lending or reclaiming under ``X``: ``interrupted``, and a recovery intent ``R`` takes
  ``n`` over: the lend is rolled back, the reclaim finished, each write naming ``R``.

A node in flight whose ``decision`` names no record at all (the audit store was replaced, or
the annotation was edited) is taken over by a recovery intent too, naming what it found.

An intent to remove the borrowed pods an earlier node of a name left (``EARLIER_PODS`` in its
detail) moves no node and so leaves no trace on one: it is ``interrupted``, and the first tick
looks for those pods again (``victims.left_by_earlier_node``) and removes any it finds under
an intent of its own. So does it for the pods of a loan whose node was deleted: ``gone``
closes that loan's intent, not its pods.
"""

from __future__ import annotations

from dataclasses import dataclass

from rebalancer.core import model, nodestate
from rebalancer.core.audit import AuditRecord
from rebalancer.core.nodestate import Phase
from rebalancer.core.outcomes import Outcome

LEND, RECLAIM, ROLLBACK = model.Action.LEND, model.Action.RECLAIM, model.Action.ROLLBACK
# The detail key of an intent that removes the pods an earlier node of the name left.
EARLIER_PODS = "earlier_pods"


@dataclass(frozen=True)
class Verdict:
    intent: AuditRecord
    result: Outcome
    message: str
    take_over: bool = False  # a recovery intent must end the transition the node is in


def judge(
    intent: AuditRecord,
    view: model.NodeView | None,
    keys: nodestate.Keys,
    begun: bool = False,
) -> Verdict:
    """What ``intent``, left without a final outcome by a previous run, came to on its node.
    ``begun``: it has ``in_progress`` outcomes already (a reclaim that was draining)."""
    if view is None:
        return Verdict(intent, Outcome.GONE, "the node no longer exists")
    uid = intent.detail.get("node_uid")
    if isinstance(uid, str) and uid and view.uid and view.uid != uid:
        # Deleted and created again under its name: what the intent was for is gone, and
        # the node there now is another, read as it is.
        return Verdict(intent, Outcome.GONE, f"the node was replaced (uid {uid}, now {view.uid})")
    if EARLIER_PODS in intent.detail:
        return Verdict(
            intent,
            Outcome.INTERRUPTED,
            "the pods an earlier node of its name left are looked for again, and removed",
        )
    state = nodestate.read(view, keys)
    if isinstance(state, nodestate.StateError):
        # Nothing can be concluded, and nothing is touched: the planner reports the node.
        return Verdict(intent, Outcome.FAILED, f"cannot tell how far it got: {state}")
    if not state.verified:
        # Its decision may be anyone's: the planner takes the node back as unverified.
        return Verdict(intent, Outcome.FAILED, f"cannot tell how far it got: {state.drift[0]}")
    if state.decision != intent.id:
        if begun:  # it did move the node; another decision has it now
            return Verdict(intent, Outcome.INTERRUPTED, "begun, then another decision took over")
        return Verdict(intent, Outcome.SUPERSEDED, "never carried out: the node shows no trace")
    phase, action = state.phase, intent.action
    if phase in (Phase.LENDING, Phase.RECLAIMING):
        return Verdict(intent, Outcome.INTERRUPTED, f"interrupted with the node {phase}", True)
    if action == LEND and phase is Phase.LENT:
        return Verdict(intent, Outcome.APPLIED, "lent: found done after a restart")
    if action in (RECLAIM, ROLLBACK) and phase is Phase.SERVING:
        return Verdict(intent, Outcome.APPLIED, "serving again: found done after a restart")
    if action == LEND and phase is Phase.SERVING:
        return Verdict(intent, Outcome.REFUSED, "begun, then rolled back before a restart")
    return Verdict(intent, Outcome.SUPERSEDED, f"never carried out: the node is {phase}")


def recovery_action(view: model.NodeView, keys: nodestate.Keys) -> model.Action:
    """What a recovery does to a node in flight: roll a lend back, or finish a reclaim."""
    state = nodestate.read(view, keys)
    lending = isinstance(state, nodestate.NodeState) and state.phase is Phase.LENDING
    return ROLLBACK if lending else RECLAIM
