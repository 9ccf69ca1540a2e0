"""TokenReview and SubjectAccessReview, answered as kube-apiserver answers them.

``POST /apis/authentication.k8s.io/v1/tokenreviews`` says whether ``spec.token`` is one of the
served ``auth.Access``'s tokens, and whose. The static tokens are audience-agnostic, as the real
server's ``--token-auth-file`` tokens are (``WrapAudienceAgnosticToken``): valid for the API
server's own audience only, so a review that asks other ``spec.audiences`` is not
authenticated. ``POST /apis/authorization.k8s.io/v1/subjectaccessreviews`` says whether RBAC
(``rbac.allows``) grants ``spec.user`` and ``spec.groups`` the resource or non-resource
attributes asked; ``system:masters`` is allowed everything.

Both are create-only and stored nowhere; the one who asks needs ``create`` on them (the
``auth`` middleware checks it like any request). Without ``Access`` the emulator knows no
token: every token review answers "not authenticated", every access review "no opinion".
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from sandbox.emulator import rbac, status
from sandbox.emulator.auth import MASTERS, Access
from sandbox.emulator.rbac import Attributes, User

Obj = dict[str, Any]
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"  # the tests' real server's issuer


def token_review(access: Access | None, body: Obj) -> Obj:
    spec = body.get("spec") or {}
    token = spec.get("token") or ""
    asked = list(spec.get("audiences") or [])
    user = access.tokens.get(token) if access is not None and token else None
    answer: Obj
    if user is None:
        answer = {"authenticated": False, "error": "invalid bearer token"}
    elif asked and API_AUDIENCE not in asked:
        answer = {
            "authenticated": False,
            "error": f"token audiences {[API_AUDIENCE]} is invalid for the target audiences "
            f"{asked}",
        }
    else:
        answer = {
            "authenticated": True,
            "user": {"username": user.name, "groups": list(user.groups)},
            "audiences": asked or [API_AUDIENCE],
        }
    return _reviewed(body, "authentication.k8s.io/v1", "TokenReview", answer)


def access_review(access: Access | None, store: Any, body: Obj) -> Obj:
    spec = body.get("spec") or {}
    user = User(str(spec.get("user") or ""), tuple(spec.get("groups") or ()))
    non_resource, resource = spec.get("nonResourceAttributes"), spec.get("resourceAttributes")
    if non_resource is not None:
        attrs = Attributes(
            verb=str(non_resource.get("verb") or ""),
            resource_request=False,
            path=str(non_resource.get("path") or ""),
        )
    else:
        r = resource or {}
        attrs = Attributes(
            verb=str(r.get("verb") or ""),
            resource_request=True,
            group=str(r.get("group") or ""),
            version=str(r.get("version") or ""),
            resource=str(r.get("resource") or ""),
            subresource=str(r.get("subresource") or ""),
            namespace=str(r.get("namespace") or ""),
            name=str(r.get("name") or ""),
        )
    allowed = access is not None and (MASTERS in user.groups or rbac.allows(store, user, attrs))
    answer: Obj = {"allowed": allowed}
    if not allowed:
        answer["reason"] = ""  # RBAC says no more than that; the real server answers the same
    return _reviewed(body, "authorization.k8s.io/v1", "SubjectAccessReview", answer)


def _reviewed(body: Obj, api_version: str, kind: str, answer: Obj) -> Obj:
    return {
        "kind": kind,
        "apiVersion": api_version,
        "metadata": {"creationTimestamp": None},
        "spec": body.get("spec") or {},
        "status": answer,
    }


async def read(request: web.Request) -> Obj | web.Response:
    try:
        body = await request.json()
    except ValueError as exc:
        error = status.bad_request(f"the body is not JSON: {exc}")
        return web.json_response(error.status, status=error.code)
    if not isinstance(body, dict):
        error = status.bad_request("the body is not a review object")
        return web.json_response(error.status, status=error.code)
    return body
