"""The GPU labeler: keeps its own node's ``nvidia.com/gpu.*`` labels in step with its GPUs.

Where it sits: ``rebalancer gpu-labeler`` runs this in a DaemonSet pod on each GPU node (the
chart's ``gpuLabeler``), apart from the controller, which only reads the labels through its
pools' selectors. A pass is observe, decide, apply: ask nvidia-smi (``adapters.nvidiasmi``),
read the node, let ``core.gpulabels.decide`` say which owned labels differ, and send only those
as one JSON merge patch on ``metadata.labels`` under the node's resourceVersion
(``adapters.writer.KubeWriter``, the controller's own writer). A 409 means the node changed
since it was read: it is read again and the changes decided again, a few times at most.

Why nothing changes on an error: a driver that stops answering does not make the GPUs smaller.
Removing or lowering labels then would send pods that need the GPUs elsewhere, or let pods that
select on them land where they cannot run once the driver is back; the labels stay as the last
good reading left them, the error is logged, and the next interval tries again. A node that
GPU Feature Discovery labels (``nvidia.com/gfd.timestamp``) is left alone: see
docs/design/gpu-labels.md.

Every change is logged as one line naming the node, the key, and the old and new values.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes_asyncio import client

from rebalancer.adapters import kubeclient
from rebalancer.adapters.nvidiasmi import GpuSource, NvidiaSmi
from rebalancer.adapters.writer import Conflict, KubeWriter, NodeWriter, WriteError
from rebalancer.core import gpulabels
from rebalancer.core.gpulabels import Stand, Unreadable
from rebalancer.core.nodestate import NodeChange

log = logging.getLogger("rebalancer.gpulabeler")

ATTEMPTS = 5  # reads of the node per pass when each patch meets a 409


@dataclass(frozen=True, slots=True)
class Labelled:
    """What one pass did: the changes it sent (or, on a dry run, would have sent), that it stood
    down for GPU Feature Discovery, or why nvidia-smi could not be read."""

    node: str
    changes: Mapping[str, str | None] = field(default_factory=dict)
    stood_down: bool = False
    error: str | None = None


async def label(
    writer: NodeWriter, node: str, source: GpuSource, *, dry_run: bool = False
) -> Labelled:
    """One pass. Raises ``WriteError`` when the API refuses (the node does not exist, 403) or a
    409 outlasts ``ATTEMPTS`` reads."""
    gpus = await source.query()
    if isinstance(gpus, Unreadable):
        log.warning("node %s: GPU labels left as they are: %s", node, gpus.reason)
        return Labelled(node, error=gpus.reason)
    for attempt in range(1, ATTEMPTS + 1):
        obj = await writer.get_node(node)
        meta = obj.get("metadata") or {}
        current: dict[str, str] = dict(meta.get("labels") or {})
        decision = gpulabels.decide(current, gpus)
        if decision.stand is Stand.GFD:
            return Labelled(node, stood_down=True)
        if not decision.changes:
            return Labelled(node)
        if not dry_run:
            change = NodeChange(taints=None, labels=decision.changes, annotations={})
            try:
                await writer.patch_node(node, change, str(meta.get("resourceVersion", "")))
            except Conflict:
                if attempt == ATTEMPTS:
                    raise
                continue
        for key, value in decision.changes.items():
            log.info(
                "node %s: %s%s: %s -> %s",
                node,
                "(dry run) " if dry_run else "",
                key,
                current.get(key, "(none)"),
                "(removed)" if value is None else value,
            )
        return Labelled(node, decision.changes)
    raise AssertionError("unreachable: the last attempt returns or raises")


def stand_down_line(node: str) -> str:
    return (
        f"node {node}: GPU Feature Discovery labels this node ({gpulabels.GFD_TIMESTAMP}); "
        "the GPU labeler writes nothing here"
    )


async def run(
    writer: NodeWriter,
    node: str,
    source: GpuSource,
    interval: float,
    stop: asyncio.Event,
    *,
    dry_run: bool = False,
) -> None:
    """A pass every ``interval`` seconds until ``stop`` is set. An API error is logged and tried
    again at the next pass, as an nvidia-smi error is."""
    stood_down = False
    while not stop.is_set():
        try:
            done = await label(writer, node, source, dry_run=dry_run)
        except WriteError as exc:  # the pod keeps trying; the error is the log line
            log.error("node %s: GPU labels not written: %s", node, exc)
        else:
            if done.stood_down and not stood_down:
                log.info(stand_down_line(node))
            stood_down = done.stood_down
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)


@dataclass(frozen=True, slots=True)
class Options:
    """``rebalancer gpu-labeler``'s flags, checked."""

    node: str
    interval: float = 60.0
    once: bool = False
    nvidia_smi: str = "nvidia-smi"
    timeout: float = 10.0
    kubeconfig: Path | None = None
    context: str | None = None
    dry_run: bool = False


async def main(options: Options) -> int:
    """The command: 0 when a pass (``--once``) read the GPUs, or when the loop was stopped by
    SIGTERM or SIGINT; 1 when ``--once`` could not read them."""
    source = NvidiaSmi(options.nvidia_smi, options.timeout)
    async with kubeclient.api_client(options.kubeconfig, options.context) as api:
        writer = KubeWriter(client.CoreV1Api(api))
        if options.once:
            done = await label(writer, options.node, source, dry_run=options.dry_run)
            if done.stood_down:
                log.info(stand_down_line(options.node))
            return 0 if done.error is None else 1
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(writer, options.node, source, options.interval, stop, dry_run=options.dry_run)
        return 0
