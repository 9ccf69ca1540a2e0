"""``metav1.Status`` bodies for every answer that is not an object, built as kube-apiserver does.

The messages, reasons and ``details`` follow ``k8s.io/apimachinery/pkg/api/errors``: a missing
object is ``pods "x" not found`` with ``details.kind`` set to the *resource* (``pods``), a resource
of a named group is qualified (``leases.coordination.k8s.io "x" not found``), and an invalid
object is reported with its *kind* and one cause per field error. Clients branch on ``reason``
and ``code``, so these must match exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]

OPTIMISTIC_LOCK = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


@dataclass(frozen=True, slots=True)
class Cause:
    """One field error: ``type`` is the cause type (``FieldValueInvalid``...)."""

    type: str
    message: str
    field: str = ""

    def as_json(self) -> Obj:
        out: Obj = {"reason": self.type, "message": self.message}
        if self.field:
            out["field"] = self.field
        return out

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class ApiError(Exception):
    """An answer that is a failure ``Status``; ``status`` is the JSON body."""

    def __init__(self, status: Obj) -> None:
        super().__init__(status.get("message", ""))
        self.status = status

    @property
    def code(self) -> int:
        return int(self.status["code"])


def qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def _status(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    out: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        out["details"] = details
    return out


def _details(name: str, resource: str, group: str) -> Obj:
    out: Obj = {}
    if name:
        out["name"] = name
    if group:
        out["group"] = group
    if resource:
        out["kind"] = resource
    return out


def success(code: int | None = None, details: Obj | None = None) -> Obj:
    out: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
    if details is not None:
        out["details"] = details
    if code is not None:
        out["code"] = code
    return out


def not_found(resource: str, group: str, name: str) -> ApiError:
    message = f'{qualified(resource, group)} "{name}" not found'
    return ApiError(_status(404, "NotFound", message, _details(name, resource, group)))


def no_such_path() -> ApiError:
    return ApiError(
        _status(404, "NotFound", "the server could not find the requested resource", {})
    )


def already_exists(resource: str, group: str, name: str) -> ApiError:
    message = f'{qualified(resource, group)} "{name}" already exists'
    return ApiError(_status(409, "AlreadyExists", message, _details(name, resource, group)))


def conflict(resource: str, group: str, name: str, why: str = OPTIMISTIC_LOCK) -> ApiError:
    message = f'Operation cannot be fulfilled on {qualified(resource, group)} "{name}": {why}'
    return ApiError(_status(409, "Conflict", message, _details(name, resource, group)))


def invalid(kind: str, group: str, name: str, causes: list[Cause]) -> ApiError:
    qualified_kind = f"{kind}.{group}" if group else kind
    # The message names each distinct error once (apimachinery's aggregate dedupes them); the
    # causes keep every one.
    said = list(dict.fromkeys(str(c) for c in causes))
    if not said:
        message = f'{qualified_kind} "{name}" is invalid'
    elif len(said) == 1:
        message = f'{qualified_kind} "{name}" is invalid: {said[0]}'
    else:
        joined = ", ".join(said)
        message = f'{qualified_kind} "{name}" is invalid: [{joined}]'
    details = _details(name, kind, group)
    details["causes"] = [c.as_json() for c in causes]
    return ApiError(_status(422, "Invalid", message, details))


def unprocessable() -> ApiError:
    """What a JSON patch that cannot be applied gets: the server drops the patch error text."""
    message = "the server rejected our request due to an error in our request"
    return ApiError(_status(422, "Invalid", message, {}))


def bad_request(message: str) -> ApiError:
    return ApiError(_status(400, "BadRequest", message))


def method_not_allowed(resource: str, group: str, action: str) -> ApiError:
    message = f'{action} is not supported on resources of kind "{qualified(resource, group)}"'
    details = _details("", resource, group)
    return ApiError(_status(405, "MethodNotAllowed", message, details))


def unsupported_media_type(message: str) -> ApiError:
    return ApiError(_status(415, "UnsupportedMediaType", message))


def too_many_requests(
    message: str, retry_after: int = 0, causes: list[Obj] | None = None
) -> ApiError:
    details: Obj = {}
    if retry_after:
        details["retryAfterSeconds"] = retry_after
    if causes:
        details["causes"] = causes
    return ApiError(_status(429, "TooManyRequests", message, details))


def internal_error(why: str) -> ApiError:
    details = {"causes": [{"message": why}]}
    return ApiError(_status(500, "InternalError", f"Internal error occurred: {why}", details))


def expired(message: str) -> ApiError:
    return ApiError(_status(410, "Expired", message))


def unauthorized() -> ApiError:
    """What a request without valid credentials gets (``responsewriters.Unauthorized``)."""
    return ApiError(_status(401, "Unauthorized", "Unauthorized"))


def denied(resource: str, group: str, name: str, why: str) -> ApiError:
    """``apierrors.NewForbidden`` as the authorization filter calls it: ``resource`` is the
    request's resource without its subresource, and an unnamed request names no object."""
    if not resource:
        message = f"forbidden: {why}"
    elif name:
        message = f'{qualified(resource, group)} "{name}" is forbidden: {why}'
    else:
        message = f"{qualified(resource, group)} is forbidden: {why}"
    return ApiError(_status(403, "Forbidden", message, _details(name, resource, group)))


def forbidden(resource: str, group: str, name: str, why: str) -> ApiError:
    message = f'{qualified(resource, group)} "{name}" is forbidden: {why}'
    return ApiError(_status(403, "Forbidden", message, _details(name, resource, group)))


def too_large_resource_version(asked: int, current: int) -> ApiError:
    message = f"Timeout: Too large resource version: {asked}, current: {current}"
    details = {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }
    return ApiError(_status(504, "Timeout", message, details))
