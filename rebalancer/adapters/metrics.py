"""Per-pool load from Prometheus: demand (in the pool's unit), queue depth, running requests, GPU
busy per node. The PromQL it evaluates is ``adapters.promql``; reads over a span of history, step
by step, are ``adapters.ranges``.

Where it sits: each tick the runtime calls ``Metrics.read(pool, nodes)`` and puts the answer's
``demand`` and ``queue`` into the pool's ``core.model.PoolSnapshot``; the demand history of the
strategies that read one (``adaptive``, the default, ``forecast``, ...) comes from
``Metrics.history``. Nothing here decides anything.

Unknown is never zero. An empty result, a NaN or infinite value, a refused or failed query are
all "no sample" (``None``), never ``0``. A series that stopped is not unknown at once, though:
the planner keeps no memory between ticks (docs/design/safety-rules.md, section Metrics), so
this adapter hands over the LAST sample within ``lookback`` together with the time Prometheus
stamped on it, and the planner's staleness limit and grace period age it. How (see
docs/design/metrics.md):

1. ``at``: the newest raw sample time of the pool's series,
   ``max(max_over_time((<sampled>)[lookback:resolution]))``, where ``<sampled>`` is
   ``timestamp(<raw selector>)`` scoped to the pool. ``timestamp()`` of a plain selector is the
   scrape time, not the evaluation time, so a ``rate()`` that keeps answering for minutes after
   its targets went away cannot look fresh.
2. ``value``: the metric's expression evaluated AT ``at`` (``/api/v1/query?time=at``). It is the
   value the last sample gave, not a ``rate()`` tail computed from fewer and fewer samples.

Pool scoping: a pool is the set of its node names (the informer knows them). Templates use
``$scope``, which expands to ``max by (namespace, pod, node) (kube_pod_info{node=~"<names>"})``
(one series per pod on the pool's nodes; ``max by`` folds duplicate kube-state-metrics
replicas and uid changes), and metrics are joined to it ``on (namespace, pod)``.

I/O: ``adapters.promclient.Client`` (requests, synchronous; it carries the credentials, TLS,
headers and POST of ``Settings.access``) runs every request in ``asyncio.to_thread`` with a
timeout of its own. There is exactly ONE retry layer: tenacity, bounded in attempts and in total
time, on transport errors and HTTP 5xx only. The session's own adapter is given
``Retry(total=0, ...)`` with no status to retry on. A 4xx (a bad query, a refusal), a
certificate that is not trusted and a credentials file that cannot be read are never retried;
the refusals name the setting to look at. Errors never escape as exceptions: they become
``MetricError`` values naming the pool, the query and the reason.

Prometheus' clock (``measure_skew``): once a tick, ``time()`` evaluated at its own now (no
``time`` parameter) answers its clock to the millisecond; timed on the controller's clock, it is
a reading of the skew (``core.clocks``). One attempt, never retried: a retry's backoff would
widen the round trip the reading is judged by. The runtime reads the pool's samples at
Prometheus' now, and the planner ages them on it (docs/design/clocks.md).
"""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from string import Template
from typing import Any, TypeVar

import requests
import urllib3
from prometheus_api_client.exceptions import PrometheusApiClientException
from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)
from urllib3.util.retry import Retry

from rebalancer.adapters.promclient import Access, Client, CredentialsUnreadable
from rebalancer.adapters.promql import MetricQuery, Queries
from rebalancer.core import bounded, clocks
from rebalancer.core.model import (
    Clock,
    DemandHistory,
    HistoryResult,
    MetricError,
    NodeName,
    PoolMetrics,
    PoolName,
    Sample,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

# A Kubernetes node name is a DNS subdomain: nothing in it needs more than escaping the dot.
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_STATUS = re.compile(r"HTTP Status Code (\d{3})")
_SSL_REASON = re.compile(r"\[SSL[^\]]*\][^(\"]*")  # [SSL: CODE] words, before "(_ssl.c:...)"
_SSL_INNER = re.compile(r"SSL\w*Error\(\d+, '([^'(]+)")  # SSLEOFError(8, 'EOF occurred in ...')

MAX_POINTS = 10_000  # per range request: under Prometheus' limit of 11,000 points per series


@dataclass(frozen=True)
class Settings:
    url: str = "http://127.0.0.1:9090"
    timeout: float = 5.0  # seconds, per HTTP request (connect and read)
    attempts: int = 3  # in all, first try included
    retry_budget: float = 10.0  # seconds: no new attempt starts after this
    backoff: float = 0.2  # seconds before the first retry, doubled each time
    lookback: timedelta = timedelta(minutes=10)  # no sample older than this is handed over
    resolution: timedelta = timedelta(seconds=15)  # subquery step when looking for the last sample
    queries: Queries = Queries()  # noqa: RUF009 (frozen: one shared default is safe)
    access: Access = field(default_factory=Access)


class QueryFailed(Exception):
    """A request failed for good (after retries, or at once for a refusal)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _transient(exc: BaseException) -> bool:
    """Transport errors and 5xx are worth another attempt; 4xx (a bad query), a certificate
    that is not trusted and a credentials file that cannot be read never are."""
    if isinstance(exc, requests.exceptions.SSLError | CredentialsUnreadable):
        return False
    if isinstance(exc, requests.exceptions.RequestException | urllib3.exceptions.HTTPError):
        return True
    if isinstance(exc, PrometheusApiClientException):
        m = _STATUS.search(str(exc))
        return m is not None and m.group(1).startswith("5")
    return False


def _describe(exc: BaseException, credentials: str = "", url: str = "") -> str:
    """One line for ``exc``; a refusal of who the controller is, or of the server's
    certificate, names the setting to look at (``credentials``: the one that says who it is);
    a server not reached is named by ``url`` (less any user and password in it)."""
    if isinstance(exc, CredentialsUnreadable):
        return str(exc)
    if isinstance(exc, requests.exceptions.SSLError):
        return (
            f"TLS failed, see prometheus.tls (ca_file, server_name, cert_file): {_tls_reason(exc)}"
        )
    at = f" at {_without_userinfo(url)}" if url else ""
    if isinstance(exc, requests.exceptions.Timeout):
        return f"timed out{at} ({type(exc).__name__})"
    if isinstance(exc, requests.exceptions.ConnectionError):
        return f"cannot reach Prometheus{at} ({type(exc).__name__})"
    if isinstance(exc, PrometheusApiClientException):
        text = str(exc)
        m = _STATUS.search(text)
        if m is not None:
            said = f"Prometheus answered HTTP {m.group(1)}: {_error_text(text[m.end() :])}"
            return said + _credentials_hint(m.group(1), credentials)
        return text[:300]
    if isinstance(exc, ValueError):  # from _vector, or a body that is not JSON
        return str(exc)[:300]
    return f"{type(exc).__name__}: {exc}"[:300]


def _without_userinfo(url: str) -> str:
    """``url`` less a ``user:password@``: said on stderr and in the log, it must not carry one."""
    scheme, sep, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme}{sep}{host.rpartition('@')[2]}{slash}{path}"


def _credentials_hint(status: str, credentials: str) -> str:
    if status not in ("401", "403"):
        return ""
    if credentials:
        return f" (the credentials of {credentials} were refused)"
    return " (no credentials are sent: set prometheus.bearer_token_file or prometheus.basic_auth)"


def _tls_reason(exc: BaseException) -> str:
    """The innermost reason of a TLS failure (``CERTIFICATE_VERIFY_FAILED``, a hostname
    mismatch), not urllib3's nesting of wrappers around it."""
    text = str(exc)
    m = _SSL_REASON.search(text) or _SSL_INNER.search(text)
    return (m.group(m.lastindex or 0).strip() if m else text)[:300]


def _error_text(rest: str) -> str:
    """Prometheus' ``error`` field from the library's ``" (b'<json body>')"`` message tail."""
    rest = rest.strip()
    if rest.startswith("(") and rest.endswith(")"):
        rest = rest[1:-1]
    try:
        body = ast.literal_eval(rest)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return rest[:300]
    try:
        error = json.loads(body)["error"]
    except (ValueError, TypeError, KeyError, RecursionError):
        # Not Prometheus' JSON: a proxy's or the web server's own page ("Unauthorized").
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
        return " ".join(text.split())[:300]
    return str(error)[:300]


def node_regex(nodes: Iterable[str]) -> str:
    """An RE2 alternation matching exactly these node names, escaped for a PromQL string."""
    names = sorted(set(nodes))
    bad = [n for n in names if not _NODE_NAME.match(n)]
    if bad:
        raise ValueError(f"not a node name: {bad[0]!r}")
    # In a PromQL double-quoted string a backslash is written twice.
    return "|".join(n.replace(".", "\\\\.") for n in names)


def render(template: str, pool: str, nodes: Iterable[str], scope: str, **extra: str) -> str:
    regex = node_regex(nodes)
    scope_expr = Template(scope).substitute(nodes=regex, pool=pool)
    return Template(template).substitute(scope=scope_expr, nodes=regex, pool=pool, **extra)


def promql_duration(d: timedelta) -> str:
    """``d`` as PromQL writes a duration: whole seconds, ``"60s"``."""
    seconds = int(d.total_seconds())
    if seconds <= 0 or d.total_seconds() != seconds:
        raise ValueError(f"a duration must be whole seconds > 0, not {d}")
    return f"{seconds}s"


def finite_value(raw: object) -> float | None:
    """A sample's value, or None for anything but a finite number >= 0: never a zero."""
    if not isinstance(raw, str | int | float):
        return None  # Prometheus sends sample values as strings; anything else is garbage
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _vector(result: object, key: str = "value") -> list[dict[str, Any]]:
    """The result as a list of series, or ``ValueError`` (a scalar or string query, say)."""
    if not isinstance(result, list) or not all(
        isinstance(r, dict) and isinstance(r.get("metric"), dict) and key in r for r in result
    ):
        raise ValueError(f"unexpected answer (not an instant or range vector): {result!r:.200}")
    return result


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def _scalar_time(answer: object) -> datetime:
    """The evaluation time of a scalar answer ``[<time>, "<value>"]``, or ``ValueError``."""
    if not (isinstance(answer, list) and len(answer) == 2):
        raise ValueError(f"unexpected answer to time() (not a scalar): {answer!r:.200}")
    ts = finite_value(answer[0])
    if ts is None:
        raise ValueError(f"unexpected time in the answer to time(): {answer[0]!r:.100}")
    return _utc(ts)


class Metrics:
    """The Prometheus adapter. One instance per controller; safe to share between tasks."""

    def __init__(
        self,
        settings: Settings,
        *,
        client: Client | None = None,
        clock: Clock = lambda: datetime.now(UTC),
    ) -> None:
        self.settings = settings
        self.clock = clock  # the controller's own: what Prometheus' skew is measured against
        self.estimator = clocks.Estimator(clocks.Against.PROMETHEUS)
        # What requests itself uses when nobody asks for retries (``Retry(0, read=False)``, no
        # status list): nothing is repeated below tenacity, and a read timeout stays a
        # ``ReadTimeout``.
        no_retry = Retry(total=0, read=False, status_forcelist=())
        self._client = client or Client(settings.url, settings.access, no_retry, settings.timeout)

    def close(self) -> None:
        self._client.close()

    async def measure_skew(self) -> clocks.Skew | None:
        """Prometheus' clock against the controller's, from one ``time()`` now and the recent
        readings; a failed query is no reading (see the module docstring)."""
        timeout = self.settings.timeout
        sent = self.clock()
        try:
            answer = await asyncio.wait_for(
                asyncio.to_thread(self._client.custom_query, "time()", timeout=timeout),
                timeout + 1.0,
            )
            server = _scalar_time(answer)
        except Exception as exc:  # unreachable, refused, garbled: the readings so far stand
            why = _describe(exc, self.settings.access.credentials)
            log.debug("Prometheus' clock could not be read: %s", why)
        else:
            received = self.clock()
            reading = clocks.Reading(sent, received, server, clocks.MILLISECOND)
            self.estimator = clocks.add(self.estimator, reading)
        return clocks.estimate(self.estimator, self.clock())

    async def _call(self, fn: Callable[[], T]) -> T:
        """``fn`` off the event loop, retried on transient failures; raises ``QueryFailed``."""
        s = self.settings
        retrying = AsyncRetrying(
            stop=stop_after_attempt(max(1, s.attempts)) | stop_after_delay(s.retry_budget),
            wait=wait_exponential(multiplier=s.backoff, max=max(s.backoff, 2.0)),
            retry=retry_if_exception(_transient),
            reraise=False,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await asyncio.to_thread(fn)
        except RetryError as exc:
            last = exc.last_attempt.exception()
            tries = exc.last_attempt.attempt_number
            said = _describe(last, s.access.credentials, s.url) if last is not None else "failed"
            raise QueryFailed(f"{said}; gave up after {tries} attempts") from None
        except Exception as exc:  # a refusal (4xx) or a malformed answer: not retried
            raise QueryFailed(_describe(exc, s.access.credentials, s.url)) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def query_instant(self, query: str, at: datetime | None) -> list[dict[str, Any]]:
        """``query``'s series at ``at`` (Prometheus' own now when None), retried on transient
        failures; raises ``QueryFailed``."""
        params = {} if at is None else {"time": f"{at.timestamp():.3f}"}
        timeout = self.settings.timeout

        def run() -> list[dict[str, Any]]:
            return _vector(self._client.custom_query(query, params=params, timeout=timeout))

        return await self._call(run)

    async def query_range(
        self, query: str, start: datetime, end: datetime, step: timedelta
    ) -> list[dict[str, Any]]:
        """``query``'s series on ``[start, end]`` at ``step``, retried on transient failures;
        raises ``QueryFailed``. At most ``MAX_POINTS`` steps."""
        timeout = self.settings.timeout
        step_s = promql_duration(step)

        def run() -> list[dict[str, Any]]:
            return _vector(
                self._client.custom_query_range(
                    query, start_time=start, end_time=end, step=step_s, timeout=timeout
                ),
                key="values",
            )

        return await self._call(run)

    async def _last(
        self,
        pool: PoolName,
        metric: str,
        q: MetricQuery,
        nodes: Sequence[str],
        now: datetime | None,
        by: str | None,
    ) -> tuple[dict[str, Sample], list[MetricError]]:
        """Last sample(s) within the lookback, keyed by the ``by`` label ("" when not per-node)."""
        s = self.settings
        errors: list[MetricError] = []
        try:
            sampled = render(q.sampled, pool, nodes, s.queries.scope)
            value_q = render(q.value, pool, nodes, s.queries.scope)
            window = f"[{promql_duration(s.lookback)}:{promql_duration(s.resolution)}]"
        except (ValueError, KeyError) as exc:
            return {}, [MetricError(pool, metric, q.value, f"cannot build the query: {exc}")]
        group = f" by ({by})" if by else ""
        at_q = f"max{group} (max_over_time(({sampled}){window}))"
        try:
            times = await self.query_instant(at_q, now)
        except QueryFailed as exc:
            return {}, [MetricError(pool, metric, at_q, exc.reason)]
        found: dict[str, Sample] = {}
        for series in times:
            key = str(series.get("metric", {}).get(by, "")) if by else ""
            ts = finite_value(series["value"][1])
            if ts is None or (by and not key):
                continue
            at = _utc(ts)
            try:
                values = await self.query_instant(value_q, at)
            except QueryFailed as exc:
                errors.append(MetricError(pool, metric, value_q, exc.reason))
                continue
            if by:
                values = [v for v in values if v.get("metric", {}).get(by) == key]
            if len(values) > 1:
                errors.append(
                    MetricError(
                        pool,
                        metric,
                        value_q,
                        f"{len(values)} series where one was expected; aggregate it (sum)",
                    )
                )
                continue
            if not values:
                continue  # the sample exists but the expression has no value: unknown
            raw = values[0]["value"][1]
            value = finite_value(raw)
            if value is None:
                reason = f"the value is {bounded.quoted(str(raw))}, not a finite number >= 0"
                errors.append(MetricError(pool, metric, value_q, reason))
                continue
            found[key] = Sample(value=value, at=at)
        return found, errors

    async def read(
        self, pool: PoolName, nodes: Iterable[NodeName], now: datetime | None = None
    ) -> PoolMetrics:
        """The pool's last samples at ``now`` (Prometheus' own clock when ``None``)."""
        q = self.settings.queries
        names = sorted(set(nodes))
        errors: list[MetricError] = []
        if not names:
            return PoolMetrics(pool=pool, demand=None, queue=None)

        async def one(
            metric: str, mq: MetricQuery | None, by: str | None = None
        ) -> dict[str, Sample]:
            if mq is None:
                return {}
            found, errs = await self._last(pool, metric, mq, names, now, by)
            errors.extend(errs)
            return found

        demand, queue, running, busy = await asyncio.gather(
            one("demand", q.demand),
            one("queue", q.queue),
            one("running", q.running),
            one("gpu_busy", q.gpu_busy, by="node"),
        )
        # Not logged here: the caller logs ``errors`` once (``Reconciler._read``).
        return PoolMetrics(
            pool=pool,
            demand=demand.get(""),
            queue=queue.get(""),
            running=running.get(""),
            gpu_busy={NodeName(k): v for k, v in busy.items()},
            errors=tuple(errors),
        )

    async def history(
        self,
        pool: PoolName,
        nodes: Iterable[NodeName],
        since: datetime,
        until: datetime,
        step: timedelta,
    ) -> HistoryResult:
        """Demand on the grid ``since + i*step`` for ``[since, until)``; gaps are ``None``.

        ``values[i]`` is the history expression evaluated at the END of bucket ``i``
        (``since + (i+1)*step``) with ``$window`` = ``step``: the rate over that bucket.
        """
        n = math.floor((until - since) / step)
        empty = DemandHistory(start=since, step=step, values=[None] * max(n, 0), end_index=0)
        names = sorted(set(nodes))
        if n <= 0 or not names:
            return HistoryResult(DemandHistory(since, step, [None] * max(n, 0), max(n, 0)))
        try:
            query = render(
                self.settings.queries.history,
                pool,
                names,
                self.settings.queries.scope,
                window=promql_duration(step),
            )
        except (ValueError, KeyError) as exc:
            err = MetricError(pool, "history", self.settings.queries.history, str(exc))
            return HistoryResult(empty, err)
        values: list[float | None] = [None] * n
        # Prometheus refuses a range query of more than 11,000 points per series (a week and
        # a day at one-minute steps is 11,520): ask for the grid in pieces it accepts.
        for first in range(0, n, MAX_POINTS):
            last = min(n, first + MAX_POINTS) - 1
            try:
                result = await self.query_range(
                    query, since + step * (first + 1), since + step * (last + 1), step
                )
            except QueryFailed as exc:
                return HistoryResult(empty, MetricError(pool, "history", query, exc.reason))
            if len(result) > 1:
                why = f"{len(result)} series; aggregate it (sum)"
                return HistoryResult(empty, MetricError(pool, "history", query, why))
            for ts, raw in result[0]["values"] if result else []:
                i = round((float(ts) - since.timestamp()) / step.total_seconds()) - 1
                if first <= i <= last:
                    values[i] = finite_value(raw)
        return HistoryResult(DemandHistory(start=since, step=step, values=values, end_index=n))
