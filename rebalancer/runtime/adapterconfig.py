"""The adapters' own configuration built from the settings: the leader election's timings, the
metrics adapter's settings and a pool's PromQL queries.

Where it sits: ``runtime.wiring`` builds the controller with them; ``rebalancer check`` renders
the queries as the controller does and ``rebalancer capacity`` reads Prometheus as it does. Here
and not in ``rebalancer.settings``: the settings are what a person wrote, checked, and stay
below the adapters' objects; the runtime is where values become the parts that run. The default
templates the settings take from ``adapters.presets`` stay there: they are values of a field,
not adapter objects.
"""

from __future__ import annotations

from rebalancer.adapters import leadership, metrics, promclient, promql
from rebalancer.core import model
from rebalancer.settings import (
    MetricQuerySettings,
    MetricsSettings,
    PoolSettings,
    PrometheusSettings,
    Settings,
)


def timings(settings: Settings) -> leadership.Timings:
    """The leader election's timings, in seconds."""
    le = settings.leader_election
    return leadership.Timings(
        lease_duration=le.lease_duration.total_seconds(),
        renew_deadline=le.renew_deadline.total_seconds(),
        retry_period=le.retry_period.total_seconds(),
    )


def metrics_settings(settings: Settings, pool: PoolSettings | None = None) -> metrics.Settings:
    """The metrics adapter's settings, with ``pool``'s queries (the defaults without one)."""
    p = settings.prometheus
    return metrics.Settings(
        url=p.url,
        timeout=p.timeout.total_seconds(),
        attempts=p.attempts,
        retry_budget=p.retry_budget.total_seconds(),
        backoff=p.backoff.total_seconds(),
        lookback=p.lookback,
        resolution=p.resolution,
        queries=queries(pool) if pool is not None else metric_queries(MetricsSettings()),
        access=access(p),
    )


def access(p: PrometheusSettings) -> promclient.Access:
    """How the metrics adapter is let into Prometheus: the files it reads its credentials
    from, TLS, headers and the method (docs/prometheus.md)."""
    basic = p.basic_auth
    return promclient.Access(
        bearer_token_file=p.bearer_token_file,
        basic_username=None if basic is None else basic.username,
        basic_password_file=None if basic is None else basic.password_file,
        tls=promclient.Tls(
            ca_file=p.tls.ca_file,
            cert_file=p.tls.cert_file,
            key_file=p.tls.key_file,
            server_name=p.tls.server_name,
            insecure_skip_verify=p.tls.insecure_skip_verify,
        ),
        headers=tuple(p.headers.items()),
        method=p.method,
        credentials=p.credentials(),
    )


def queries(pool: PoolSettings) -> promql.Queries:
    """The metrics adapter's queries for ``pool``: demand and history in its unit."""
    return metric_queries(pool.metrics, pool.unit)


def metric_queries(
    m: MetricsSettings, unit: model.Unit = model.Unit.REQUESTS_PER_SECOND
) -> promql.Queries:
    """The adapter's queries of a metrics block, demand and history in ``unit`` (the preset's
    for it where the block leaves them out)."""
    return promql.Queries(
        demand=_query(m.demand_in(unit)),
        queue=_query(m.queue),
        running=None if m.running is None else _query(m.running),
        gpu_busy=None if m.gpu_busy is None else _query(m.gpu_busy),
        history=m.history_in(unit),
        scope=m.scope,
    )


def _query(q: MetricQuerySettings) -> promql.MetricQuery:
    return promql.MetricQuery(value=q.value, sampled=q.sampled)
