"""The controller as a requester of the EvictionRequest API (KEP-4563), behind one small Protocol.

Where it sits: a reclaim notice (docs/design/reclaim-notice.md) is written as annotations on the
node and its borrowed pods, always. Where the cluster serves ``lifecycle.k8s.io/v1alpha1``
(kube-apiserver 1.37 or later with the ``EvictionRequestAPI`` gate on and the group enabled by
``--runtime-config``), the controller also files one EvictionRequest per borrowed pod, reads
what the responders say of it, and withdraws it when the notice is withdrawn
(docs/design/eviction-requests.md). ``EvictionRequests`` is the seam the runtime fakes;
``KubeEvictionRequests`` is the implementation on kubernetes-asyncio's ``ApiClient``.

What the API is, as 1.37.2 serves it (measured, docs/design/eviction-requests.md):

- ``evictionrequests`` (namespaced, with ``/status``): a requester's ``spec`` is the target pod
  (name and uid), its ``requester`` name (a domain-prefixed key outside ``*.k8s.io`` and
  ``*.kubernetes.io``; immutable, as the target is) and its ``intent``, ``Eviction`` or
  ``Withdrawn`` (the one field it changes). Its ``status`` (``observedGeneration``,
  ``TargetEvicted`` and ``Failed`` conditions) is written by the evictionrequest-controller.
- ``evictions`` (namespaced, with ``/status``): one per target, written by that controller,
  whose ``status.targetResponders`` says which responder is active and whose
  ``status.responders`` is where each responder reports (``heartbeatTime``,
  ``expectedCompletionTime``, ``completionTime``, ``message``).
- 1.37.2 ships no evictionrequest-controller: nothing sets ``observedGeneration``, creates an
  Eviction, or evicts a pod for an EvictionRequest. So the API being served does not mean it is
  handled: ``RequestState.handled`` tells the two apart, and the controller never waits on a
  request nobody handles (its deadline holds either way).

Why raw JSON over ``CustomObjectsApi``: kubernetes-asyncio has no models for this group (its
generated client predates it), and the generic calls take any group's path. Every call asks for
``_preload_content=False`` and reads the body itself, as ``adapters.writer`` does.

Errors: every refusal is one ``WriteError`` line naming the object (``Conflict`` 409,
``NotFound`` 404, ``ApiFailure`` otherwise), and a cluster that does not serve the group is
``NotServed`` (404 from the group's own path): never a traceback of the client library.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import partial
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio import client

from rebalancer.adapters.writer import (
    MERGE_PATCH,
    ApiFailure,
    Conflict,
    NotFound,
    WriteError,
    read_answer,
)
from rebalancer.errors import ConfigError

Obj = dict[str, Any]
GROUP, VERSION = "lifecycle.k8s.io", "v1alpha1"
REQUESTS, EVICTIONS = "evictionrequests", "evictions"
REQUESTER_KEY = "reclaim-notice"  # after the controller's key prefix: rebalancer.io/reclaim-notice
# The Eviction API's heartbeat deadline (currently 20 minutes): a responder silent for longer is
# passed over for the next one.
HEARTBEAT_DEADLINE = timedelta(minutes=20)
# The responder the evictionrequest-controller adds last to every pod's Eviction (priority 100):
# it evicts the pod through the pods/eviction subresource, as a reclaim does.
DEFAULT_EVICTOR = "imperative-eviction.k8s.io/evictor"
_RESERVED = (".k8s.io", ".kubernetes.io")
_UUID_SHAPE = "00000000-0000-0000-0000-000000000000"
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_PREFIXED_KEY = re.compile(
    rf"{_DNS_LABEL}(\.{_DNS_LABEL})*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)


class NotServed(WriteError):
    """The cluster serves no ``lifecycle.k8s.io/v1alpha1`` EvictionRequests: it is older than
    1.37, or its ``EvictionRequestAPI`` gate or the group's ``--runtime-config`` is off."""


class Intent(StrEnum):
    EVICTION = "Eviction"
    WITHDRAWN = "Withdrawn"


@dataclass(frozen=True, slots=True)
class Target:
    """The pod a request is for: its uid makes a pod re-created under the name another target."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Responder:
    """One responder of the target's Eviction: its state as the evictionrequest-controller
    assigns it (``Inactive``, ``Active``, ``Interrupted``, ``Canceled``, ``Completed``) and what
    it last reported."""

    name: str
    priority: int
    state: str
    heartbeat: datetime | None = None
    expected_completion: datetime | None = None
    completion: datetime | None = None
    message: str = ""

    def alive(self, now: datetime) -> bool:
        """Active and heard from within the API's heartbeat deadline: its word still counts."""
        return (
            self.state == "Active"
            and self.heartbeat is not None
            and now - self.heartbeat <= HEARTBEAT_DEADLINE
        )


@dataclass(frozen=True, slots=True)
class RequestState:
    """What the cluster says of our request for one pod."""

    target: Target
    intent: Intent
    generation: int
    observed_generation: int | None  # None: no evictionrequest-controller has seen it
    conditions: Mapping[str, tuple[str, str]]  # type -> (status, reason)
    responders: tuple[Responder, ...] = ()  # from the target's Eviction, when there is one

    @property
    def handled(self) -> bool:
        """A controller has seen this version of the request: someone acts on it."""
        return self.observed_generation is not None and self.observed_generation >= self.generation

    @property
    def evicted(self) -> bool:
        return self.conditions.get("TargetEvicted", ("", ""))[0] == "True"

    @property
    def failed(self) -> bool:
        return self.conditions.get("Failed", ("", ""))[0] == "True"

    def active(self) -> Responder | None:
        """The one responder working on the eviction now, if any."""
        return next((r for r in self.responders if r.state == "Active"), None)

    def answered(self) -> bool:
        """A controller handles the request and the pod's own responders are done with it: it
        is evicted, the eviction failed (no further responder), or none of its responders is
        still Active or waiting in line, so that only the default evictor
        (``imperative-eviction.k8s.io/evictor``, which calls the same Eviction API as a
        reclaim) is left. False while nothing handles the request, whatever an Eviction says:
        the notice's other answers (an acknowledgement, an exit) are read from the pod."""
        if not self.handled:
            return False
        if self.evicted or self.failed:
            return True
        own = [r for r in self.responders if r.name != DEFAULT_EVICTOR]
        pending = {"Active", "Inactive"}
        return bool(self.responders) and not any(r.state in pending for r in own)

    def expected_by(self, now: datetime) -> datetime | None:
        """When the active responder expects to be done, while a controller handles the
        request and the responder is alive; None when no one said (the notice's own deadline is
        all there is)."""
        active = self.active()
        if not self.handled or active is None or not active.alive(now):
            return None
        return active.expected_completion


class EvictionRequests(Protocol):
    requester: str  # the name our requests are filed under (``requester_name``)

    async def served(self) -> bool:
        """Whether the cluster serves the API (both resources): asked once, then cached by the
        caller."""
        ...

    async def request(self, target: Target) -> RequestState:
        """Ask for the pod's eviction (create our request, or set its intent back to
        ``Eviction``): idempotent."""
        ...

    async def state(self, target: Target) -> RequestState | None:
        """Our request for the pod and what its responders report; None when there is none."""
        ...

    async def withdraw(self, target: Target) -> RequestState | None:
        """Set our intent to ``Withdrawn`` (the notice was withdrawn); None when there was no
        request."""
        ...

    async def remove(self, target: Target) -> bool:
        """Delete our request (the pod is gone, or the reclaim is over): False when there was
        none. Deleting counts as a withdrawal too."""
        ...


# ---------------------------------------------------------------------------------------------
# Pure: names, bodies, parsing


def requester_name(prefix: str) -> str:
    """``<prefix>reclaim-notice``: the requester name the controller files under; refused, in one
    line, where the API would refuse it (not a domain-prefixed key, or a reserved domain)."""
    name = prefix + REQUESTER_KEY
    domain = name.split("/", 1)[0].lower().rstrip(".")
    if not _PREFIXED_KEY.fullmatch(name) or len(domain) > 253:
        raise ConfigError(
            f"requester name {name!r} is not a domain-prefixed key such as 'rebalancer.io/x'"
        )
    if any(domain.endswith(s) or domain == s.strip(".") for s in _RESERVED):
        raise ConfigError(
            f"requester name {name!r}: the domains *.k8s.io and *.kubernetes.io are reserved "
            "for Kubernetes' own requesters; set another key prefix"
        )
    longest = len(request_name(name, _UUID_SHAPE))
    if longest > 253:
        raise ConfigError(
            f"requester name {name!r}: a request named after it and a pod uid would be "
            f"{longest} characters, more than an object name's 253; set a shorter key prefix"
        )
    return name


def request_name(requester: str, uid: str) -> str:
    """Our request's name: the requester's domain and key, then the pod's uid, so that a second
    create (after a restart) meets the first (409) and two requesters never collide. The server
    takes several requests for one pod, even from one requester: the name is what keeps ours
    one."""
    domain, key = requester.split("/", 1)
    key = re.sub(r"[^a-z0-9-]", "-", key.lower()).strip("-")
    return f"{domain.lower()}.{key}.{uid}"


def request_body(requester: str, target: Target, intent: Intent = Intent.EVICTION) -> Obj:
    """Our request for ``target``, owned by the pod: nothing else removes a request, so the
    garbage collector deletes it with its pod (deleting counts as a withdrawal) should the
    controller not live to."""
    owner = {"apiVersion": "v1", "kind": "Pod", "name": target.name, "uid": target.uid}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "EvictionRequest",
        "metadata": {
            "name": request_name(requester, target.uid),
            "namespace": target.namespace,
            "ownerReferences": [owner],
        },
        "spec": {
            "target": {"pod": {"name": target.name, "uid": target.uid}},
            "requester": requester,
            "intent": str(intent),
        },
    }


def intent_patch(intent: Intent) -> Obj:
    """The merge patch that changes only the intent (target and requester are immutable)."""
    return {"spec": {"intent": str(intent)}}


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def responders_of(eviction: Mapping[str, Any]) -> tuple[Responder, ...]:
    """The responders of an Eviction: ``targetResponders`` (name, priority, state) joined with
    what each reported in ``responders``, highest priority first."""
    status = eviction.get("status") or {}
    reports = {r.get("name"): r for r in status.get("responders") or () if isinstance(r, dict)}
    out = []
    for target in status.get("targetResponders") or ():
        if not isinstance(target, dict) or not isinstance(target.get("name"), str):
            continue
        report = reports.get(target["name"]) or {}
        out.append(
            Responder(
                name=target["name"],
                priority=int(target.get("priority") or 0),
                state=str(target.get("state") or ""),
                heartbeat=_time(report.get("heartbeatTime")),
                expected_completion=_time(report.get("expectedCompletionTime")),
                completion=_time(report.get("completionTime")),
                message=str(report.get("message") or ""),
            )
        )
    return tuple(sorted(out, key=lambda r: (-r.priority, r.name)))


def state_of(
    target: Target, request: Mapping[str, Any], evictions: Sequence[Mapping[str, Any]] = ()
) -> RequestState:
    """Our request as the server answered it, with the responders of the Eviction that targets
    the same pod (by uid), if one does."""
    meta, spec = request.get("metadata") or {}, request.get("spec") or {}
    status = request.get("status") or {}
    conditions = {
        str(c.get("type")): (str(c.get("status")), str(c.get("reason") or ""))
        for c in status.get("conditions") or ()
        if isinstance(c, dict)
    }
    observed = status.get("observedGeneration")
    eviction = next(
        (
            e
            for e in evictions
            if ((e.get("spec") or {}).get("target") or {}).get("pod", {}).get("uid") == target.uid
        ),
        None,
    )
    intent = spec.get("intent")
    return RequestState(
        target=target,
        intent=Intent(intent) if intent in tuple(Intent) else Intent.EVICTION,
        generation=int(meta.get("generation") or 1),
        observed_generation=int(observed) if isinstance(observed, int) else None,
        conditions=conditions,
        responders=responders_of(eviction) if eviction is not None else (),
    )


# ---------------------------------------------------------------------------------------------
# kubernetes-asyncio


class KubeEvictionRequests:
    """``EvictionRequests`` over a kubernetes-asyncio ``ApiClient`` (``CustomObjectsApi``'s
    generic calls on the built-in group)."""

    def __init__(self, api: Any, requester: str = "rebalancer.io/" + REQUESTER_KEY) -> None:
        self._custom: Any = client.CustomObjectsApi(api)
        self.requester = requester

    async def served(self) -> bool:
        code, doc = await read_answer(
            self._custom.get_api_resources(GROUP, VERSION, _preload_content=False)
        )
        if code == 404:
            return False
        _check(f"{GROUP}/{VERSION}", code, doc)
        names = {r.get("name") for r in doc.get("resources") or () if isinstance(r, dict)}
        return {REQUESTS, EVICTIONS} <= names

    async def request(self, target: Target) -> RequestState:
        where = self._where(target)
        body = request_body(self.requester, target)
        code, doc = await self._call(
            where, self._custom.create_namespaced_custom_object, target.namespace, REQUESTS, body
        )
        if code == 409:  # there already (a restart): ours, asked again whatever it said
            return await self._request_again(target)
        _check(where, code, doc)
        return await self._with_responders(target, doc)

    async def _request_again(self, target: Target) -> RequestState:
        where = self._where(target)
        code, doc = await self._ours(self._custom.get_namespaced_custom_object, target)
        _check(where, code, doc)
        spec = doc.get("spec") or {}
        pod = (spec.get("target") or {}).get("pod") or {}
        if spec.get("requester") != self.requester or pod.get("uid") != target.uid:
            raise Conflict(
                where,
                409,
                f"exists for requester {spec.get('requester')!r} and pod uid {pod.get('uid')!r}, "
                f"not ours ({self.requester!r}, {target.uid!r}): left as it is",
            )
        if spec.get("intent") == Intent.EVICTION:
            return await self._with_responders(target, doc)
        return await self._set_intent(target, Intent.EVICTION)

    async def state(self, target: Target) -> RequestState | None:
        where = self._where(target)
        code, doc = await self._ours(self._custom.get_namespaced_custom_object, target)
        if code == 404:
            return None
        _check(where, code, doc)
        return await self._with_responders(target, doc)

    async def withdraw(self, target: Target) -> RequestState | None:
        try:
            return await self._set_intent(target, Intent.WITHDRAWN)
        except NotFound:
            return None

    async def remove(self, target: Target) -> bool:
        where = self._where(target)
        code, doc = await self._ours(self._custom.delete_namespaced_custom_object, target)
        if code == 404:
            return False
        _check(where, code, doc)
        return True

    async def _set_intent(self, target: Target, intent: Intent) -> RequestState:
        where = self._where(target)
        code, doc = await self._call(
            where,
            partial(self._custom.patch_namespaced_custom_object, _content_type=MERGE_PATCH),
            target.namespace,
            REQUESTS,
            request_name(self.requester, target.uid),
            intent_patch(intent),
        )
        _check(where, code, doc)
        return await self._with_responders(target, doc)

    async def _with_responders(self, target: Target, request: Obj) -> RequestState:
        where = f"{EVICTIONS} in namespace {target.namespace}"
        code, doc = await self._call(
            where, self._custom.list_namespaced_custom_object, target.namespace, EVICTIONS
        )
        _check(where, code, doc)
        return state_of(target, request, [e for e in doc.get("items") or () if isinstance(e, dict)])

    async def _ours(self, method: Callable[..., Awaitable[Any]], target: Target) -> tuple[int, Obj]:
        """``method`` on our request for ``target``, by its name."""
        name = request_name(self.requester, target.uid)
        return await self._call(self._where(target), method, target.namespace, REQUESTS, name)

    def _where(self, target: Target) -> str:
        return f"EvictionRequest {target.namespace}/{request_name(self.requester, target.uid)}"

    async def _call(
        self, where: str, method: Callable[..., Awaitable[Any]], *args: Any
    ) -> tuple[int, Obj]:
        try:
            code, doc = await read_answer(method(GROUP, VERSION, *args, _preload_content=False))
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiFailure(where, 0, f"transport error: {exc!r}") from exc
        if code == 404 and _group_missing(doc):
            raise NotServed(where, code, f"the cluster serves no {GROUP}/{VERSION}")
        return code, doc


def _group_missing(doc: Mapping[str, Any]) -> bool:
    """A 404 of the path itself (the group is not served), not of a named object: the server
    answers it without a ``details.name`` (or, for a whole unknown group, as plain text)."""
    details = doc.get("details")
    return not (isinstance(details, dict) and details.get("name"))


def _check(where: str, code: int, doc: Mapping[str, Any]) -> None:
    if 200 <= code < 300:
        return
    message = " ".join(str(doc.get("message") or doc.get("reason") or "").split())
    if code == 409:
        raise Conflict(where, code, message)
    if code == 404:
        raise NotFound(where, code, message)
    raise ApiFailure(where, code, message)
