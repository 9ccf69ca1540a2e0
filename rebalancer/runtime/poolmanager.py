"""``rebalancer pools apply``: every node's labels and taints made what its pool says, once.

Where it sits: the command loads the pools file (``runtime.poolfile``) and hands the layout and
a ``NodeWriter`` (``open_writer``: the ``KubeWriter`` the actuator writes through) to ``apply``,
which

1. lists every node (one list, paged), and plans each one (``nodepools.plan_node``, pure);
2. stops before any write when two pools select one node: which pool it belongs to is the
   file's to say, and applying the others first would leave half a layout to undo;
3. with ``dry_run``, stops there: the plans are what would be written;
4. writes each change as one merge patch locked to the resourceVersion it was planned from
   (``KubeWriter.patch_node``: transport errors, 5xx and 429 retried with backoff, as for the
   actuator), at most ``concurrency`` at once.

A 409 means the node changed after it was read: it is read again and planned again, at most
``ATTEMPTS`` times in all, never written blindly. The lock is also what keeps a lend safe: a
node the controller starts lending between our list and our write has a new resourceVersion, so
the write is refused, and the node planned again is refused as lent. A node whose change did
not land is reported with why, and the others go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from kubernetes_asyncio import client

from rebalancer.adapters import convert, kubeclient
from rebalancer.adapters.writer import Conflict, KubeWriter, NodeWriter, WriteError
from rebalancer.core import model, nodepools, nodestate
from rebalancer.core.nodepools import NodePlan, Verdict

DEFAULT_CONCURRENCY = 16
ATTEMPTS = 3  # writes of one node, each after a fresh read, before it is reported as failed


@dataclass(frozen=True, slots=True)
class NodeResult:
    """One node: its last plan (made again after each 409), whether its change was stored, and
    why not when it was not (``error``)."""

    plan: NodePlan
    written: bool = False
    error: str = ""
    attempts: int = 0  # patches sent


@dataclass(frozen=True, slots=True)
class Report:
    results: tuple[NodeResult, ...]  # by node name
    dry_run: bool
    # Nodes two pools select, found before any write: when there are any, nothing was written.
    overlap: tuple[NodePlan, ...] = ()

    @property
    def plans(self) -> list[NodePlan]:
        return [r.plan for r in self.results]

    @property
    def failed(self) -> list[NodeResult]:
        return [r for r in self.results if r.error]

    @property
    def complete(self) -> bool:
        """Every node matched by a pool is as its pool says (or would be, on a dry run)."""
        left = (Verdict.REFUSED, Verdict.AMBIGUOUS)
        return not (self.overlap or self.failed or any(p.verdict in left for p in self.plans))


@asynccontextmanager
async def open_writer(
    kubeconfig: Path | None = None, context: str | None = None
) -> AsyncIterator[NodeWriter]:
    """The bare ``KubeWriter`` on a client of its own: a command, not the controller, so no
    lease gates it (every node write still carries the resourceVersion it was planned from)."""
    async with kubeclient.api_client(kubeconfig, context) as api:
        yield KubeWriter(client.CoreV1Api(api))


async def apply(
    writer: NodeWriter,
    layout: nodepools.Layout,
    keys: nodestate.Keys,
    *,
    dry_run: bool = False,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> Report:
    """Plan every node and write the changes (see the module docstring)."""
    if concurrency < 1:
        raise ValueError(f"concurrency={concurrency}: must be at least 1")
    views = {str(v.name): v for v in map(convert.node_view, await writer.list_nodes(""))}
    plans = nodepools.plan(views.values(), layout, keys)
    overlap = tuple(p for p in plans if p.verdict is Verdict.AMBIGUOUS)
    if overlap or dry_run:
        return Report(tuple(NodeResult(p) for p in plans), dry_run, overlap)
    limit = asyncio.Semaphore(concurrency)
    settled = await asyncio.gather(
        *(_settle(writer, views[p.node], p, layout, keys, limit) for p in plans)
    )
    return Report(tuple(settled), dry_run)


async def _settle(
    writer: NodeWriter,
    view: model.NodeView,
    plan: NodePlan,
    layout: nodepools.Layout,
    keys: nodestate.Keys,
    limit: asyncio.Semaphore,
) -> NodeResult:
    """Write ``plan``'s change; on a 409 read the node again and plan again."""
    sent = 0
    while plan.change is not None:
        sent += 1
        try:
            async with limit:
                await writer.patch_node(plan.node, plan.change, view.resource_version)
            return NodeResult(plan, written=True, attempts=sent)
        except Conflict:
            if sent >= ATTEMPTS:
                why = f"changed by another writer before each of {sent} writes; run again"
                return NodeResult(plan, error=why, attempts=sent)
        except WriteError as exc:  # refused, gone, or the API kept failing: this node alone
            return NodeResult(plan, error=str(exc), attempts=sent)
        try:
            async with limit:
                view = convert.node_view(await writer.get_node(plan.node))
        except WriteError as exc:
            return NodeResult(plan, error=f"read again after a 409: {exc}", attempts=sent)
        plan = nodepools.plan_node(view, layout, keys)
    return NodeResult(plan, attempts=sent)


def refusals(plans: Sequence[NodePlan]) -> dict[str, int]:
    """How many nodes were refused for each reason (``lent``, ``unreadable state``...)."""
    counts: dict[str, int] = {}
    for p in plans:
        if p.verdict is Verdict.REFUSED:
            counts[p.refusal] = counts.get(p.refusal, 0) + 1
    return dict(sorted(counts.items()))
