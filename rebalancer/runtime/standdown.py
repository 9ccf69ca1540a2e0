"""Stop the controller before its loans are taken back for good: the chart's pre-delete hook.

``helm uninstall`` runs the hook while the controller still runs. Taking the loans back first
would race it: the controller, seeing idle nodes and pending training again, could lend them
once more between the reclaim and its own deletion. So the hook first scales the controller's
Deployment to 0 and waits until no pod of it is left (a pod on its way out finishes the step in
flight and releases its lease, ``rebalancer run``'s SIGTERM), and only then takes every loan
back (``takeback.reclaim_wave``). Scaled to 0, nothing lends again; if the reclaim then fails,
the uninstall stops with the controller down and every node's state on the node, for the
runbook (docs/upgrade-uninstall.md).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rebalancer.errors import RebalancerError


class NotStopped(RebalancerError):
    """The controller's Deployment could not be scaled down, or its pods outlived the wait."""


@dataclass(frozen=True, slots=True)
class Stopped:
    deployment: str
    namespace: str
    waited: float  # seconds until no pod of it was left
    pods: int  # how many there were when it was scaled down


async def stop_controller(
    api: Any,
    namespace: str,
    deployment: str,
    timeout: float,
    *,
    poll: float = 1.0,
) -> Stopped:
    """Scale ``namespace/deployment`` to 0 and wait until none of its pods is left."""
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    where = f"deployment/{deployment} in namespace {namespace}"
    try:
        found = await apps.read_namespaced_deployment(deployment, namespace)
        await apps.patch_namespaced_deployment_scale(
            deployment, namespace, {"spec": {"replicas": 0}}
        )
    except ApiException as exc:
        raise NotStopped(f"{where}: not scaled to 0: {exc.status} {exc.reason}") from None
    selector = ",".join(f"{k}={v}" for k, v in (found.spec.selector.match_labels or {}).items())
    if not selector:
        raise NotStopped(f"{where}: its selector has no matchLabels to find its pods by")
    began = time.monotonic()
    first: int | None = None
    while True:
        pods = await core.list_namespaced_pod(namespace, label_selector=selector)
        left = len(pods.items)
        first = left if first is None else first
        if left == 0:
            return Stopped(deployment, namespace, time.monotonic() - began, first)
        if time.monotonic() - began >= timeout:
            names = ", ".join(p.metadata.name for p in pods.items)
            raise NotStopped(f"{where}: scaled to 0, but {left} pod(s) still run: {names}")
        await asyncio.sleep(poll)
