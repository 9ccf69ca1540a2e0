"""The controller's own settings (``Settings``) and the blocks only it has.

Where it sits: at the top of the schema; ``load`` (rebalancer/settings/loader.py) makes one,
and ``rebalancer run`` builds its values from it: ``keys()``, each of ``pools``, and the
adapters' configuration (``runtime.adapterconfig``: the leader election's timings, the metrics
adapter's settings).
"""

from __future__ import annotations

import typing
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal

import pydantic
from pydantic import Field
from pydantic_core import PydanticCustomError

from rebalancer.adapters import auditurl
from rebalancer.core import audit, clocks, nodestate
from rebalancer.core.concurrency import LEND_CONCURRENCY
from rebalancer.settings.pool import PoolSettings
from rebalancer.settings.prometheus import PrometheusSettings
from rebalancer.settings.values import (
    NAME,
    NAME_PATTERN,
    Duration,
    PositiveDuration,
    SettingsBlock,
)


class LeaderElectionSettings(SettingsBlock):
    enabled: bool = True
    lease_name: str = Field(default="rebalancer", min_length=1)
    lease_namespace: str = Field(default="default", min_length=1)
    lease_duration: PositiveDuration = timedelta(seconds=15)
    renew_deadline: PositiveDuration = timedelta(seconds=10)
    retry_period: PositiveDuration = timedelta(seconds=2)

    @pydantic.model_validator(mode="after")
    def _ordered(self) -> LeaderElectionSettings:
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise PydanticCustomError(
                "timings",
                "needs retry_period < renew_deadline < lease_duration, got {got}",
                {
                    "got": ", ".join(
                        f"{t.total_seconds():g}s"
                        for t in (self.retry_period, self.renew_deadline, self.lease_duration)
                    )
                },
            )
        return self


class AuditSettings(SettingsBlock):
    url: str = Field(default=auditurl.DEFAULT_URL, min_length=1)

    @pydantic.field_validator("url")
    @classmethod
    def _supported(cls, value: str) -> str:
        if not value.startswith(AUDIT_SCHEMES):
            raise PydanticCustomError(
                "audit_url",
                "the audit log is kept in SQLite (sqlite+aiosqlite:///PATH) or PostgreSQL "
                "(postgresql+asyncpg://USER@HOST/DB)",
            )
        return value


AUDIT_SCHEMES = ("sqlite+aiosqlite://", "postgresql+asyncpg://")  # the drivers installed


class AlertmanagerSettings(SettingsBlock):
    """``POST /api/v1/alertmanager`` (docs/design/alertmanager.md)."""

    # Only with ``http.authentication: none`` (a port behind a proxy of its own): a notification
    # must carry ``Authorization: Bearer <token>``. With the cluster's authentication the token
    # is a service account's, reviewed; this one is refused (``Settings._one_kind_of_token``).
    token: pydantic.SecretStr | None = None
    # A firing alert holds its pool at most this long after its last notification: keep the
    # receiver's route ``repeat_interval`` well under it.
    max_age: PositiveDuration = timedelta(hours=1)
    # ... and at most this long after its own startsAt, however often it is posted: a replayed
    # notification cannot hold a pool longer; an alert firing longer stops holding it.
    max_life: PositiveDuration = timedelta(hours=12)


class TakerSettings(SettingsBlock):
    """Who counts as a taker besides pending pods, for the pools that lend only to takers
    (docs/design/takers.md#kueue-workloads)."""

    # The pods of Kueue Workloads waiting for quota (kueue.x-k8s.io, read as v1beta2): the
    # jobs Kueue holds back have no pod yet. Off: a cluster without Kueue's CRDs is untouched.
    kueue_workloads: bool = False


class TlsSettings(SettingsBlock):
    """The API port's certificate: both files (PEM; the chart mounts a ``kubernetes.io/tls``
    Secret), or neither, and the process makes a self-signed one at start."""

    cert_file: Path | None = None
    key_file: Path | None = None

    @pydantic.model_validator(mode="after")
    def _both_or_neither(self) -> TlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            given, missing = (
                ("cert_file", "key_file") if self.key_file is None else ("key_file", "cert_file")
            )
            raise PydanticCustomError(
                "tls_pair",
                "{given} is set but {missing} is not: give both (a certificate and its key), "
                "or neither for a self-signed certificate",
                {"given": given, "missing": missing},
            )
        return self


Authentication = Literal["kubernetes", "none"]
AUTHENTICATIONS: tuple[str, ...] = typing.get_args(Authentication)


class HttpSettings(SettingsBlock):
    """The HTTP API (TLS, every request reviewed by the cluster) and the probes' plain port
    (docs/http.md)."""

    host: str = Field(default="0.0.0.0", min_length=1)  # all interfaces: it serves in a pod
    port: int = Field(default=8443, ge=1, le=65535)  # the API: TLS, a bearer token each request
    health_port: int = Field(default=8081, ge=1, le=65535)  # /healthz and /readyz only, plain
    # kubernetes: TokenReview and SubjectAccessReview for every request. none: anyone who
    # reaches the port may do anything it serves (for a port fronted by a proxy of its own).
    authentication: Authentication = "kubernetes"
    # The audience a token must be minted for to post to the Alertmanager receiver (a
    # projected service-account token); reads take the API server's own audience.
    alertmanager_audience: str = Field(default="rebalancer", min_length=1)
    tls: TlsSettings = TlsSettings()

    @pydantic.model_validator(mode="after")
    def _two_ports(self) -> HttpSettings:
        if self.port == self.health_port:
            raise PydanticCustomError(
                "ports",
                "port and health_port are both {port}: the probes have a port of their own",
                {"port": self.port},
            )
        return self


LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LOG_LEVELS: tuple[str, ...] = typing.get_args(LogLevel)


def _upper(value: object) -> object:
    return value.upper() if isinstance(value, str) else value


def _a_second_or_more(value: timedelta) -> timedelta:
    if value < timedelta(seconds=1):
        raise PydanticCustomError(
            "duration",
            "must be at least 1s: the API server states its clock to the second",
        )
    return value


class Settings(SettingsBlock):
    """Everything ``rebalancer run`` is configured with. Made by ``load``."""

    # Which cluster this controller runs in: on every audit record, on the Events it records and
    # in rebalancer_cluster_info, so that a fleet sharing one audit store and one dashboard can
    # tell its controllers apart (docs/design/fleet.md). The default is a name, not '': an
    # empty label value is an absent label to Prometheus, and schema version 2 gave the audit
    # rows written before it this same name.
    cluster_name: str = Field(
        default=audit.DEFAULT_CLUSTER,
        json_schema_extra={"pattern": NAME_PATTERN, "maxLength": 63},
    )
    key_prefix: str = Field(
        default="rebalancer.io/",
        json_schema_extra={"pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/$"},
    )
    # A directory holding ``current`` (the key node state is signed with) and, while a
    # rotation is under way, ``previous`` (still accepted); None: a key of the process's own
    # (docs/design/node-state-integrity.md). The chart mounts its Secret here.
    node_state_keys: str | None = Field(default=None, min_length=1)
    dry_run: bool = False
    paused: bool = False  # every pool: no lending; safety reclaims still happen
    frozen: bool = False  # every pool: nothing moves at all, not even safety reclaims
    tick_interval: PositiveDuration = timedelta(seconds=30)
    strategy_timeout: PositiveDuration = timedelta(seconds=10)
    # A clock (the API server's, a pool's Prometheus) further than this from the controller's,
    # for certain, stops lending (docs/design/clocks.md).
    clock_skew_bound: Annotated[Duration, pydantic.AfterValidator(_a_second_or_more)] = (
        clocks.DEFAULT_BOUND
    )
    lend_concurrency: int = Field(default=LEND_CONCURRENCY, ge=1, le=64)  # a tick's lends at once
    log_level: Annotated[
        LogLevel,
        pydantic.BeforeValidator(_upper),
        pydantic.WithJsonSchema({"enum": [*LOG_LEVELS, *(v.lower() for v in LOG_LEVELS)]}),
    ] = "INFO"
    leader_election: LeaderElectionSettings = LeaderElectionSettings()
    prometheus: PrometheusSettings = PrometheusSettings()
    audit: AuditSettings = AuditSettings()
    http: HttpSettings = HttpSettings()
    alertmanager: AlertmanagerSettings = AlertmanagerSettings()
    pools: tuple[PoolSettings, ...] = ()
    # After ``pools``: whether any pool reads takers is checked against them (``_takers_read``)
    takers: TakerSettings = TakerSettings()

    @pydantic.field_validator("cluster_name")
    @classmethod
    def _cluster_label(cls, value: str) -> str:
        if len(value) > 63 or not NAME.fullmatch(value):
            raise PydanticCustomError(
                "cluster_name",
                "a cluster name is 1 to 63 lower-case letters, digits and '-', starting and "
                "ending with a letter or digit, e.g. prod-eu-1",
            )
        return value

    @pydantic.field_validator("key_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        try:
            nodestate.Keys(prefix=value)
        except ValueError:
            raise PydanticCustomError(
                "prefix", "must be a DNS subdomain followed by '/', e.g. 'rebalancer.io/'"
            ) from None
        return value

    @pydantic.field_validator("alertmanager")
    @classmethod
    def _one_kind_of_token(
        cls, value: AlertmanagerSettings, info: pydantic.ValidationInfo
    ) -> AlertmanagerSettings:
        """A shared ``alertmanager.token`` is for a port whose authentication is off: with the
        cluster's, Alertmanager sends a service-account token, and one header cannot carry
        both."""
        http_settings = info.data.get("http")
        if (
            value.token is not None
            and http_settings is not None
            and http_settings.authentication == "kubernetes"
        ):
            raise PydanticCustomError(
                "token_with_reviews",
                "token is set but http.authentication is kubernetes: Alertmanager sends a "
                "service-account token (docs/http.md#alertmanager); unset it, or set "
                "http.authentication to none",
            )
        return value

    @pydantic.field_validator("takers")
    @classmethod
    def _takers_read(cls, value: TakerSettings, info: pydantic.ValidationInfo) -> TakerSettings:
        """Kueue Workloads are read only for pools that lend only to takers: with none, the
        watch (and the RBAC it needs) would be for nothing, so it is refused."""
        if "pools" not in info.data:  # refused already: that is the error to read
            return value
        if value.kueue_workloads and not any(p.lend_only_to_takers for p in info.data["pools"]):
            raise PydanticCustomError(
                "takers",
                "kueue_workloads is on but no pool has lend_only_to_takers: Kueue Workloads "
                "would be watched for nothing; turn it off, or a pool's lend_only_to_takers on",
            )
        return value

    # -- builders ------------------------------------------------------------------------------

    def keys(self) -> nodestate.Keys:
        return nodestate.Keys(prefix=self.key_prefix)

    def pool(self, name: str) -> PoolSettings:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)
