"""The few Kubernetes calls the actuator makes, behind one small Protocol.

Where it sits: ``actuator`` is the only code that writes to the cluster, and it writes only through
a ``NodeWriter``: read a node, list the pods on it, patch it with a ``NodeChange`` under an
optimistic lock, evict a pod, delete a pod at once (marked ``DisruptionTarget`` first, as
Kubernetes' own components mark the pods they delete, so a Job does not count it as failed), and
tell a borrowed pod of a reclaim (docs/design/reclaim-notice.md): its annotations and one pod
condition of the controller's own type. ``KubeWriter`` is the implementation on
kubernetes-asyncio; tests wrap it to count writes or to crash after the k-th one.

Why raw JSON: the actuator works on the API's JSON (``convert`` reads it), and the typed models
drop what they do not know and turn ``timeAdded`` into a ``datetime``, which would not restore
byte for byte. So every call asks for ``_preload_content=False`` and reads the body itself.

Why a merge patch: a node patch is ``application/merge-patch+json`` carrying
``metadata.resourceVersion``. The client would pick a strategic merge patch for a dict body, so
the content type is forced. In a merge patch a list is replaced whole, which is what the taints
need (the API treats them as one atomic list), ``null`` deletes a label or an annotation, and the
resourceVersion makes the server refuse (409) a write based on a stale read.

Writes to a pod touch only the controller's keys: the pod belongs to someone else, and the
kubelet writes its status all the time. Its annotations take a merge patch (``null`` deletes a
key, the others stay); its condition a strategic merge patch of the ``status`` subresource, where
``status.conditions`` merges by ``type`` (a merge patch would replace the list, the kubelet's
conditions with it). Neither carries a resourceVersion: a lock would make every kubelet write a
409 for us, and no one else writes our keys. Both carry ``metadata.uid`` instead: a pod
re-created under the same name is not the pod the controller judged, and kube-apiserver refuses
a patch that would change the uid (422 Invalid, cause ``metadata.uid``: field is immutable),
which is read, like a 404, as the pod being gone.

Retries (tenacity, bounded, short exponential backoff with full jitter, injectable sleep): only
what cannot have been decided by the server on our data: transport errors, 5xx, and 429 on any
write but an eviction (there 429 is a PodDisruptionBudget's answer, reported as ``BLOCKED``).
A 409 is never retried: it is raised as ``Conflict`` and the caller re-plans on a fresh read.
Retrying a patch is safe because of the lock: if a failed attempt was in fact stored, the next
attempt carries the old resourceVersion and gets 409 instead of writing twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol, TypeVar

import aiohttp
import orjson
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from rebalancer.core.nodestate import NodeChange
from rebalancer.core.outcomes import WriteOutcome
from rebalancer.errors import RebalancerError

Obj = dict[str, Any]
log = logging.getLogger(__name__)
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
_T = TypeVar("_T")


# ---------------------------------------------------------------------------------------------
# Results and errors


class WriteError(RebalancerError):
    """A call the server refused or that kept failing. ``target`` names the object."""

    def __init__(self, target: str, code: int, message: str) -> None:
        super().__init__(f"{target}: {code} {message}")
        self.target, self.code, self.message = target, code, message


class Conflict(WriteError):
    """409: the object changed since it was read (or a precondition failed). Never retried."""


class NotFound(WriteError):
    """404: the object does not exist."""


class ApiFailure(WriteError):
    """Any other refusal, or a transient failure that outlasted the retries."""


class _Transient(Exception):
    """A failure worth another attempt: 5xx, or 429 on a write that is not an eviction."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code} {message}")
        self.code, self.message = code, message


# ---------------------------------------------------------------------------------------------
# The seam


class NodeWriter(Protocol):
    async def get_node(self, name: str) -> Obj: ...

    async def list_nodes(self, label_selector: str) -> list[Obj]: ...

    async def list_pods(self, node: str) -> list[Obj]: ...

    async def patch_node(self, name: str, change: NodeChange, resource_version: str) -> Obj: ...

    async def evict(self, namespace: str, name: str, uid: str) -> WriteOutcome: ...

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        """Mark the pod disrupted, then delete it with grace 0; False when it was already
        gone."""
        ...

    async def annotate_pod(
        self, namespace: str, name: str, uid: str, annotations: Mapping[str, str | None]
    ) -> bool:
        """Set these annotations on the pod with ``uid`` (``None`` deletes one), leaving its
        others alone; False when the pod is gone or another pod now has its name."""
        ...

    async def set_pod_condition(
        self, namespace: str, name: str, uid: str, condition: Mapping[str, str]
    ) -> bool:
        """Set the one condition of ``condition["type"]`` on the pod with ``uid``, leaving its
        others alone; its ``lastTransitionTime`` moves only when its status changes. False when
        the pod is gone or another pod now has its name."""
        ...


# ---------------------------------------------------------------------------------------------
# Request bodies: pure, so dry-run reports exactly what would be sent


def merge_patch(change: NodeChange, resource_version: str) -> Obj:
    """The JSON merge patch for ``change``, locked to ``resource_version``."""
    meta: Obj = {"resourceVersion": resource_version}
    if change.labels:
        meta["labels"] = dict(change.labels)
    if change.annotations:
        meta["annotations"] = dict(change.annotations)
    body: Obj = {"metadata": meta}
    if change.taints is not None:
        body["spec"] = {"taints": [t.to_doc() for t in change.taints]}
    return body


def eviction_body(namespace: str, name: str, uid: str) -> Obj:
    # The uid precondition: a pod re-created under the same name is not the pod we judged.
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": uid}},
    }


DISRUPTION_REASON = "DeletionByRebalancer"


def disruption_patch(uid: str, now: datetime) -> Obj:
    """The strategic merge patch of a pod's status that says it is deleted as a disruption
    (``DisruptionTarget``, as the taint manager and the pod GC write it before they delete), so a
    Job's ``podFailurePolicy`` counts the deletion as a disruption, not a failure. Conditions
    merge by type: the pod's others stay. The uid makes the server refuse the patch on a pod
    re-created under the same name (the uid cannot change)."""
    return {
        "metadata": {"uid": uid},
        "status": {
            "conditions": [
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": DISRUPTION_REASON,
                    "message": "rebalancer: the node's reclaim deadline passed; the pod is "
                    "deleted so that the node serves inference again",
                    "lastTransitionTime": rfc3339(now),
                }
            ]
        },
    }


def annotations_patch(uid: str, annotations: Mapping[str, str | None]) -> Obj:
    """The JSON merge patch of a pod's annotations: ``None`` deletes a key, the pod's other
    annotations stay. The uid makes the server refuse it on a pod re-created under the name."""
    return {"metadata": {"uid": uid, "annotations": dict(annotations)}}


def condition_patch(
    uid: str, condition: Mapping[str, str], previous: Mapping[str, Any] | None, now: datetime
) -> Obj:
    """The strategic merge patch of a pod's status that sets ``condition`` (its ``type`` and
    ``status`` at least) and no other: conditions merge by type. ``previous`` is the pod's
    condition of that type as last read, if any: its ``lastTransitionTime`` is kept while the
    status stays, else it is ``now`` (the server sets none itself: a condition sent without one
    is stored with ``null``). A ``lastTransitionTime`` in ``condition`` is not used."""
    if not condition.get("type") or not condition.get("status"):
        raise ValueError(f"a pod condition needs a type and a status: {dict(condition)}")
    since = (previous or {}).get("lastTransitionTime")
    if not since or (previous or {}).get("status") != condition["status"]:
        since = rfc3339(now)
    wanted = {k: v for k, v in condition.items() if k != "lastTransitionTime"}
    return {
        "metadata": {"uid": uid},
        "status": {"conditions": [{**wanted, "lastTransitionTime": since}]},
    }


def pod_condition(pod: Mapping[str, Any], kind: str) -> Obj | None:
    """The pod's condition of type ``kind``, None when it has none."""
    for found in (pod.get("status") or {}).get("conditions") or ():
        if isinstance(found, dict) and found.get("type") == kind:
            return found
    return None


def rfc3339(at: datetime) -> str:
    """A time as the API writes one: UTC, to the second."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def delete_body(uid: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "gracePeriodSeconds": 0,
        "preconditions": {"uid": uid},
    }


# ---------------------------------------------------------------------------------------------
# kubernetes-asyncio


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 4
    initial: float = 0.2  # seconds; full jitter up to initial * 2**n, capped at ``maximum``
    maximum: float = 2.0
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep)


_TRANSPORT = (aiohttp.ClientError, TimeoutError, _Transient)


class KubeWriter:
    """``NodeWriter`` over a kubernetes-asyncio ``CoreV1Api``."""

    def __init__(
        self,
        core: Any,
        retry: RetryPolicy | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._core = core
        self._retry = retry or RetryPolicy()
        self._clock = clock  # when a condition it writes (disruption, notice) says it began

    async def get_node(self, name: str) -> Obj:
        target = f"node/{name}"
        return await self._retried(
            target, lambda: self._json(target, self._core.read_node(name, _preload_content=False))
        )

    async def list_nodes(self, label_selector: str) -> list[Obj]:
        items: list[Obj] = []
        token: str | None = None
        while True:
            page = await self._list_page(label_selector, token)
            items.extend(page.get("items") or ())
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    async def _list_page(self, label_selector: str, token: str | None) -> Obj:
        extra = {"_continue": token} if token else {}
        return await self._retried(
            "nodes",
            lambda: self._json(
                "nodes",
                self._core.list_node(
                    label_selector=label_selector, limit=500, _preload_content=False, **extra
                ),
            ),
        )

    async def list_pods(self, node: str) -> list[Obj]:
        # At most a node's pod capacity (110 by default): one page.
        target = f"pods on node/{node}"
        call = partial(
            self._core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={node}",
            _preload_content=False,
        )
        page = await self._retried(target, lambda: self._json(target, call()))
        return list(page.get("items") or ())

    async def patch_node(self, name: str, change: NodeChange, resource_version: str) -> Obj:
        target, body = f"node/{name}", merge_patch(change, resource_version)
        call = partial(
            self._core.patch_node, name, body, _content_type=MERGE_PATCH, _preload_content=False
        )
        return await self._retried(target, lambda: self._json(target, call()))

    async def evict(self, namespace: str, name: str, uid: str) -> WriteOutcome:
        target, body = f"pod/{namespace}/{name}", eviction_body(namespace, name, uid)
        call = partial(
            self._core.create_namespaced_pod_eviction, name, namespace, body, _preload_content=False
        )
        return await self._retried(target, lambda: self._evict_once(target, call()))

    async def _evict_once(self, target: str, pending: Awaitable[Any]) -> WriteOutcome:
        code, doc = await read_answer(pending)
        if code == 429:
            return WriteOutcome.BLOCKED
        if code == 404:
            return WriteOutcome.GONE
        _check(target, code, doc, throttle_retries=False)
        return WriteOutcome.EVICTED

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        target = f"pod/{namespace}/{name}"
        if not await self._mark_disrupted(target, namespace, name, uid):
            return False
        call = partial(
            self._core.delete_namespaced_pod,
            name,
            namespace,
            body=delete_body(uid),
            _preload_content=False,
        )
        try:
            await self._retried(target, lambda: self._json(target, call()))
        except NotFound:
            return False
        return True

    async def annotate_pod(
        self, namespace: str, name: str, uid: str, annotations: Mapping[str, str | None]
    ) -> bool:
        target, body = f"pod/{namespace}/{name}", annotations_patch(uid, annotations)
        call = partial(
            self._core.patch_namespaced_pod,
            name,
            namespace,
            body,
            _content_type=MERGE_PATCH,
            _preload_content=False,
        )
        return await self._retried(target, lambda: self._pod_write_once(target, call()))

    async def set_pod_condition(
        self, namespace: str, name: str, uid: str, condition: Mapping[str, str]
    ) -> bool:
        target = f"pod/{namespace}/{name}"
        pod = await self._read_pod(target, namespace, name)
        if pod is None or (pod.get("metadata") or {}).get("uid") != uid:
            return False
        previous = pod_condition(pod, str(condition.get("type") or ""))
        body = condition_patch(uid, condition, previous, self._clock())
        call = partial(
            self._core.patch_namespaced_pod_status,
            name,
            namespace,
            body,
            _content_type=STRATEGIC_MERGE_PATCH,
            _preload_content=False,
        )
        return await self._retried(target, lambda: self._pod_write_once(target, call()))

    async def _read_pod(self, target: str, namespace: str, name: str) -> Obj | None:
        """The pod as stored now, None when there is none. Read by a list of its one name, not a
        GET: the controller's role lists pods and never reads one by one (the chart's RBAC)."""
        call = partial(
            self._core.list_namespaced_pod,
            namespace,
            field_selector=f"metadata.name={name}",
            _preload_content=False,
        )
        page = await self._retried(target, lambda: self._json(target, call()))
        items = list(page.get("items") or ())
        return items[0] if items else None

    async def _pod_write_once(self, target: str, pending: Awaitable[Any]) -> bool:
        """One patch of a pod: False when the pod is gone or is another pod now."""
        code, doc = await read_answer(pending)
        if code == 404 or _uid_refused(code, doc):
            return False
        _check(target, code, doc, throttle_retries=True)
        return True

    async def _mark_disrupted(self, target: str, namespace: str, name: str, uid: str) -> bool:
        """``disruption_patch`` on the pod's status; False when the pod is gone. A refusal of
        any other kind (a role without ``pods/status``, a pod re-created under the name) is
        logged and the deletion goes ahead: the node must come back to inference."""
        body = disruption_patch(uid, self._clock())
        call = partial(
            self._core.patch_namespaced_pod_status,
            name,
            namespace,
            body,
            _content_type=STRATEGIC_MERGE_PATCH,
            _preload_content=False,
        )
        try:
            await self._retried(target, lambda: self._json(target, call()))
        except NotFound:
            return False
        except WriteError as exc:
            log.warning("%s: not marked DisruptionTarget before its deletion: %s", target, exc)
        return True

    async def _json(self, target: str, pending: Awaitable[Any]) -> Obj:
        code, doc = await read_answer(pending)
        _check(target, code, doc, throttle_retries=True)
        return doc

    async def _retried(self, target: str, attempt: Callable[[], Awaitable[_T]]) -> _T:
        policy = self._retry
        retrying = AsyncRetrying(
            stop=stop_after_attempt(policy.attempts),
            wait=wait_random_exponential(multiplier=policy.initial, max=policy.maximum),
            retry=retry_if_exception_type(_TRANSPORT),
            sleep=policy.sleep,
            reraise=True,
        )
        try:
            async for trial in retrying:
                with trial:
                    return await attempt()
        except _Transient as exc:
            raise ApiFailure(target, exc.code, exc.message) from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ApiFailure(target, 0, f"transport error: {exc!r}") from exc
        raise AssertionError("unreachable: tenacity either returns or re-raises")


async def read_answer(pending: Awaitable[Any]) -> tuple[int, Obj]:
    """A call made with ``_preload_content=False``: its status and its JSON body (a body that is
    not JSON, as a plain-text 404, as its first 200 characters under ``message``)."""
    response = await pending
    try:
        raw = await response.read()
        code = int(response.status)
    finally:
        response.release()
    try:
        doc = orjson.loads(raw) if raw else {}  # a node's JSON: the standard library's is 3x
    except ValueError:
        doc = {"message": raw[:200].decode("utf-8", "replace")}
    return code, doc if isinstance(doc, dict) else {}


def _uid_refused(code: int, doc: Mapping[str, Any]) -> bool:
    """Whether the server refused a patch because the pod under the name has another uid: 422
    with a ``metadata.uid`` cause (kube-apiserver names it twice), as a uid in a patch's body
    is checked."""
    if code != 422:
        return False
    causes = (doc.get("details") or {}).get("causes") or ()
    return any(isinstance(c, dict) and c.get("field") == "metadata.uid" for c in causes)


def _check(target: str, code: int, doc: Mapping[str, Any], *, throttle_retries: bool) -> None:
    if 200 <= code < 300:
        return
    message = str(doc.get("message") or doc.get("reason") or "")
    if code == 409:
        raise Conflict(target, code, message)
    if code == 404:
        raise NotFound(target, code, message)
    if code >= 500 or (code == 429 and throttle_retries):
        raise _Transient(code, message)
    raise ApiFailure(target, code, message)
