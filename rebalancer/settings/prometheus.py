"""The ``prometheus:`` block: where the demand queries go and how the controller is let in.

Where it sits: a block of ``Settings`` (rebalancer/settings/controller.py);
``runtime.adapterconfig.metrics_settings`` turns it into the metrics adapter's settings, for the
controller's loop, ``explain``, ``check``, ``capacity`` and the simulator's ``--prometheus``
alike. What each way in is for (a token file a projected service-account token rotates, basic
auth, client certificates, a tenant header, POST for long queries): docs/prometheus.md; why
these and not others: docs/design/prometheus-auth.md.

Files are named, never their contents: a token or password is read by the adapter when it asks
(and again whenever the file changes), so a rotated Secret needs no restart, and no credential
ever sits in the settings, their dump or an error line.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal

import pydantic
from pydantic import Field
from pydantic_core import PydanticCustomError

from rebalancer.settings.values import Duration, PositiveDuration, SettingsBlock, WholeSeconds

# RFC 9110's token: what a header's name may be made of.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Headers the HTTP client writes itself: given again, they would describe a body that is not
# the one sent.
_SET_BY_THE_CLIENT = ("content-type", "content-length", "transfer-encoding", "host")
# A DNS name (or an IP address) a certificate is checked against.
_HOST = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?")


def _a_path(value: object) -> object:
    """A file's path as text; an empty one would name the working directory."""
    if isinstance(value, Path):
        return value
    if not isinstance(value, str) or not value.strip():
        raise PydanticCustomError(
            "path", "write a file's path, e.g. /etc/rebalancer/prometheus/token"
        )
    return Path(value)


FilePath = Annotated[
    Path,
    pydantic.BeforeValidator(_a_path),
    pydantic.WithJsonSchema({"type": "string", "minLength": 1, "description": "a file's path"}),
]


class PrometheusBasicAuth(SettingsBlock):
    """HTTP basic authentication: the user, and the file holding the password (a Secret's key
    mounted as a file)."""

    username: str = Field(min_length=1, pattern=r"^[^:\x00-\x1f]+$")

    @pydantic.field_validator("username", mode="before")
    @classmethod
    def _user(cls, value: object) -> object:
        if isinstance(value, str) and (":" in value or any(ord(c) < 0x20 for c in value)):
            raise PydanticCustomError(
                "username", "a basic-auth user name has no ':' and no control character"
            )
        return value

    password_file: FilePath


class PrometheusTls(SettingsBlock):
    """How an ``https://`` Prometheus is trusted, and how the controller shows who it is."""

    ca_file: FilePath | None = None  # None: the system's trusted authorities
    cert_file: FilePath | None = None  # a client certificate (mutual TLS), with key_file
    key_file: FilePath | None = None
    # The name the server's certificate must carry (and the SNI sent), when the URL's host is
    # not it: a Service's ClusterIP, a port-forward.
    server_name: str | None = Field(default=None, pattern=_HOST.pattern.join("^$"))
    insecure_skip_verify: bool = False  # for a trial only: anyone on the path can answer

    @pydantic.field_validator("server_name", mode="before")
    @classmethod
    def _host(cls, value: object) -> object:
        if isinstance(value, str) and not _HOST.fullmatch(value):
            raise PydanticCustomError("host", "write a DNS name, e.g. prometheus.monitoring.svc")
        return value

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> PrometheusTls:
        if (self.cert_file is None) != (self.key_file is None):
            given, missing = (
                ("cert_file", "key_file") if self.key_file is None else ("key_file", "cert_file")
            )
            raise PydanticCustomError(
                "tls_pair",
                "{given} is set but {missing} is not: a client certificate needs its key",
                {"given": given, "missing": missing},
            )
        if self.insecure_skip_verify and (self.ca_file is not None or self.server_name):
            raise PydanticCustomError(
                "tls_pair",
                "insecure_skip_verify is set with ca_file or server_name, which it would "
                "ignore: keep the check (unset insecure_skip_verify) or drop them",
            )
        return self


Method = Literal["POST", "GET"]


def _upper(value: object) -> object:
    return value.upper() if isinstance(value, str) else value


class PrometheusSettings(SettingsBlock):
    url: str = "http://127.0.0.1:9090"
    timeout: PositiveDuration = timedelta(seconds=5)
    attempts: int = Field(default=3, ge=1)
    retry_budget: PositiveDuration = timedelta(seconds=10)
    backoff: Duration = timedelta(seconds=0.2)
    lookback: WholeSeconds = timedelta(minutes=10)
    resolution: WholeSeconds = timedelta(seconds=15)
    # ``Authorization: Bearer <the file's content>``, read again when the file changes: a
    # projected service-account token rotates under the controller.
    bearer_token_file: FilePath | None = None
    basic_auth: PrometheusBasicAuth | None = None
    tls: PrometheusTls = PrometheusTls()
    # Sent with every request, e.g. ``X-Scope-OrgID: <tenant>`` for Mimir, Cortex, Loki's kin.
    headers: dict[str, str] = Field(
        default_factory=dict,
        json_schema_extra={"propertyNames": {"pattern": _HEADER_NAME.pattern.join("^$")}},
    )
    # POST sends the query as a form body: a pool of many nodes makes a long regular expression
    # that a GET's URL carries, and proxies refuse long URLs (414, or a reset).
    method: Annotated[
        Method,
        pydantic.BeforeValidator(_upper),
        pydantic.WithJsonSchema({"enum": ["POST", "GET", "post", "get"]}),
    ] = "POST"

    @pydantic.field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
            raise PydanticCustomError(
                "url", "write an http:// or https:// URL, e.g. http://prometheus:9090"
            )
        return value

    @pydantic.field_validator("headers")
    @classmethod
    def _header_lines(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not _HEADER_NAME.fullmatch(name):
                raise PydanticCustomError(
                    "header",
                    "{name} is not a header name: letters, digits and !#$%&'*+-.^_`|~ only",
                    {"name": repr(name)},
                )
            if name.lower() in _SET_BY_THE_CLIENT:
                raise PydanticCustomError(
                    "header",
                    "{name} is set by the client for each request (a POST's body is a form); "
                    "leave it out",
                    {"name": name},
                )
            if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in text):
                raise PydanticCustomError(
                    "header", "the value of {name} has a control character", {"name": name}
                )
        return value

    @pydantic.model_validator(mode="after")
    def _one_way_in(self) -> PrometheusSettings:
        if self.bearer_token_file is not None and self.basic_auth is not None:
            raise PydanticCustomError(
                "prometheus_auth",
                "bearer_token_file and basic_auth are both set: a request carries one "
                "Authorization header; keep one",
            )
        given = self.bearer_token_file is not None or self.basic_auth is not None
        if given and any(name.lower() == "authorization" for name in self.headers):
            raise PydanticCustomError(
                "prometheus_auth",
                "headers has Authorization, and bearer_token_file or basic_auth sets it too; "
                "keep one",
            )
        return self

    def credentials(self) -> str:
        """The setting that says who the controller is, for an error line (a 401, an unreadable
        file) to name: ``""`` when none does."""
        if self.bearer_token_file is not None:
            return "prometheus.bearer_token_file"
        if self.basic_auth is not None:
            return "prometheus.basic_auth"
        if any(name.lower() == "authorization" for name in self.headers):
            return "prometheus.headers.Authorization"
        return ""
