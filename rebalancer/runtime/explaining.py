"""The explanation of one node, or one pool, from a tick's snapshot and decision: the answer of
``GET /api/v1/explain`` and of ``rebalancer explain``.

Where it sits: the HTTP API answers from the running loop's last tick (``Reconciler.last``,
through ``wiring.Controller``), so a dry run's plan is one request away; the command
(``rebalancer.commands.explain``) observes and decides once, read-only, and asks the same
``answer``. Either way ``core.explain`` reads the snapshot and the decision; no rule is judged
twice in two places.

Why this part is in the runtime and not with the command: the running controller serves it, and
the runtime imports nothing of the commands above it. It is not pure enough for the core either:
which pool drives a node, and whether a pool is held, are the reconciler's to say.
"""

from __future__ import annotations

from datetime import datetime

from rebalancer.core import bounded, explain, model
from rebalancer.core.explain import Json
from rebalancer.core.tick import Decision
from rebalancer.errors import RebalancerError
from rebalancer.runtime.reconcile import Reconciler


class NotExplained(RebalancerError):
    """The node or pool asked about is not one the controller drives."""


def answer(
    reconciler: Reconciler,
    snapshot: model.Snapshot,
    decision: Decision,
    *,
    node: str | None = None,
    pool: str | None = None,
    answered: datetime | None = None,
) -> Json:
    """The explanation of ``node`` (found in whichever pool selects it) or of ``pool``, with
    whose reading it is (``read``): the loop's last tick, ``answered`` after it (the HTTP
    API), or read now (``answered`` None: ``rebalancer explain``). Both read the same inputs
    at the same ``now``, the demand history included (``observing.history_end``)."""
    doc = _answer(reconciler, snapshot, decision, node=node, pool=pool)
    if answered is None:
        doc["read"] = {"by": "explain", "age_seconds": 0.0}
    else:
        doc["read"] = {"by": "loop", "age_seconds": (answered - snapshot.now).total_seconds()}
    return doc


def _answer(
    reconciler: Reconciler,
    snapshot: model.Snapshot,
    decision: Decision,
    *,
    node: str | None,
    pool: str | None,
) -> Json:
    configs = {str(p.name): p for p in reconciler.pools}
    if pool is not None:
        config = configs.get(pool)
        if config is None or config.name not in snapshot.pools:
            known = ", ".join(configs) or "none"
            raise NotExplained(
                f"pool={bounded.quoted(pool)}: no configured pool has that name ({known})"
            )
        paused, frozen = _held(reconciler, snapshot, config.name)
        return explain.pool(
            config.name, snapshot, decision, config.policy, reconciler.keys, paused, frozen
        )
    assert node is not None
    for config in reconciler.pools:
        seen = snapshot.pools.get(config.name)
        if seen is not None and any(v.name == node for v in seen.nodes):
            paused, frozen = _held(reconciler, snapshot, config.name)
            return explain.node(
                model.NodeName(node),
                config.name,
                snapshot,
                decision,
                config.policy,
                reconciler.keys,
                paused,
                frozen,
            )
    raise NotExplained(
        f"node={bounded.quoted(node)}: no configured pool selects it, or it does not exist "
        f"(pools: {', '.join(configs) or 'none'})"
    )


def _held(
    reconciler: Reconciler, snapshot: model.Snapshot, pool: model.PoolName
) -> tuple[bool, bool]:
    controls = reconciler.pool_controls(pool)
    return snapshot.paused or controls.paused, snapshot.frozen or controls.frozen
