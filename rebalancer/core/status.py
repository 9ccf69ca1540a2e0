"""``rebalancer status``: each pool and each of its nodes in rows, as ``kubectl get`` would print
them, from one snapshot.

Where it sits: ``rebalancer.commands.status`` observes once as the loop does (read-only, the
reconciler's ``preview``) and hands the snapshot here; the rows are read from what is on the
Nodes (their state label and annotations, as ``nodestate.read`` reads them) and from the
pool's error budget as the snapshot counts it. Pure: no clock, no I/O.

Why a command and no status resource (a CRD): the truth is on the Node already, where the
actuator writes it and every reader reads it; a second copy in a custom resource would be one
more object to install, upgrade, grant and keep in step, and one that could disagree with the
Node. ``kubectl get nodes -L <prefix>state`` shows the phase with nothing installed
(docs/operations.md); this command adds what a label cannot: counts, notices, pauses and the
budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rebalancer.core import model, nodestate, overrides
from rebalancer.core.model import PoolName

Json = dict[str, Any]
PHASES = ("serving", "lending", "lent", "noticed", "reclaiming", "unreadable")


@dataclass(frozen=True)
class Held:
    """Whether a pool is paused or frozen, by its settings or the global switch."""

    paused: bool = False
    frozen: bool = False


def status(
    snapshot: model.Snapshot,
    held: dict[PoolName, Held],
    keys: nodestate.Keys,
    only: PoolName | None = None,
) -> Json:
    """The document: ``pools`` (a row each) and ``nodes`` (a row each, by pool then name)."""
    names = [p for p in snapshot.pools if only is None or p == only]
    return {
        "as_of": _time(snapshot.now),
        "pools": [_pool_row(p, snapshot, held.get(p, Held()), keys) for p in names],
        "nodes": [
            _node_row(p, view, keys, snapshot.now)
            for p in names
            for view in sorted(snapshot.pools[p].nodes, key=lambda v: v.name)
        ],
    }


def phase(view: model.NodeView, keys: nodestate.Keys) -> str:
    """The node's phase in words; a loan under a reclaim notice is ``noticed``."""
    state = nodestate.read(view, keys)
    if isinstance(state, nodestate.StateError):
        return "unreadable"
    return "noticed" if state.noticed else state.phase.value


def _pool_row(name: PoolName, snapshot: model.Snapshot, held: Held, keys: nodestate.Keys) -> Json:
    seen = snapshot.pools[name]
    counts = dict.fromkeys(PHASES, 0)
    for view in seen.nodes:
        counts[phase(view, keys)] += 1
    budget = seen.budget
    return {
        "pool": str(name),
        "nodes": len(seen.nodes),
        **counts,
        "paused": snapshot.paused or held.paused,
        "frozen": snapshot.frozen or held.frozen,
        "budget_left_minutes": None
        if budget is None
        else max(budget.allowed_minutes - budget.spent_minutes, 0),
        "budget": None if budget is None else budget.spent_text,
    }


def _node_row(pool: PoolName, view: model.NodeView, keys: nodestate.Keys, now: datetime) -> Json:
    state = nodestate.read(view, keys)
    since = None if isinstance(state, nodestate.StateError) else state.since
    decision = None if isinstance(state, nodestate.StateError) else state.decision
    deadline = None if isinstance(state, nodestate.StateError) else state.deadline
    return {
        "node": str(view.name),
        "pool": str(pool),
        "phase": phase(view, keys),
        "since": _time(since) if since else None,
        "for_seconds": (now - since).total_seconds() if since else None,
        "decision": decision,
        "deadline": _time(deadline) if deadline else None,
        "overrides": _overrides(view, keys),
    }


def _overrides(view: model.NodeView, keys: nodestate.Keys) -> list[str]:
    """The node's overrides that are set, as ``key=value``; one that cannot be read as
    ``key=?``."""
    parsed = overrides.parse(view.annotations, keys)
    ov = parsed.overrides
    out = [f"lend={ov.lend.value}"] if ov.lend is not overrides.LendMode.AUTO else []
    out += ["reclaim=now"] * ov.reclaim_now + ["paused"] * ov.paused
    out += [f"window={ov.window}"] if ov.window else []
    out += [f"{p.key.removeprefix(keys.prefix)}=?" for p in parsed.problems]
    return out


# ---------------------------------------------------------------------------------------------
# Words for a person: two tables, as kubectl prints them


POOL_COLUMNS = (
    ("POOL", "pool"),
    ("NODES", "nodes"),
    ("SERVING", "serving"),
    ("LENDING", "lending"),
    ("LENT", "lent"),
    ("NOTICED", "noticed"),
    ("RECLAIMING", "reclaiming"),
    ("PAUSED", "paused"),
    ("BUDGET LEFT", "budget_left_minutes"),
)
NODE_COLUMNS = (
    ("NODE", "node"),
    ("POOL", "pool"),
    ("PHASE", "phase"),
    ("FOR", "for_seconds"),
    ("DECISION", "decision"),
    ("OVERRIDES", "overrides"),
)


def lines(doc: Json) -> list[str]:
    """The pools' table, a blank line, the nodes' table."""
    pools = table(POOL_COLUMNS, [_pool_cells(r) for r in doc["pools"]])
    nodes = table(NODE_COLUMNS, [_node_cells(r) for r in doc["nodes"]])
    return [*pools, "", *nodes]


def _pool_cells(row: Json) -> list[str]:
    left = row["budget_left_minutes"]
    cells = {
        **{k: str(v) for k, v in row.items()},
        "paused": "frozen" if row["frozen"] else ("yes" if row["paused"] else "no"),
        "budget_left_minutes": "-" if left is None else f"{left}m",
    }
    return [cells[key] for _, key in POOL_COLUMNS]


def _node_cells(row: Json) -> list[str]:
    seconds = row["for_seconds"]
    cells = {
        **{k: str(v) for k, v in row.items()},
        "for_seconds": "-" if seconds is None else age(seconds),
        "decision": row["decision"] or "-",
        "overrides": ",".join(row["overrides"]) or "-",
    }
    return [cells[key] for _, key in NODE_COLUMNS]


def table(columns: Sequence[tuple[str, str]], rows: Iterable[list[str]]) -> list[str]:
    """Columns padded to their widest cell, three spaces apart, as ``kubectl get``."""
    grid = [[title for title, _ in columns], *rows]
    widths = [max(len(r[i]) for r in grid) for i in range(len(columns))]
    return ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in grid]


def age(seconds: float) -> str:
    """As kubectl's AGE: ``45s``, ``12m``, ``3h20m``, ``2d4h``."""
    whole = max(int(seconds), 0)
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    return f"{minutes}m" if minutes else f"{secs}s"


def _time(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")
