"""The one Kubernetes API client of a controller process: configured, opened and closed here.

Where it sits: ``rebalancer run`` opens it once and hands the ``ApiClient`` to the informer, the
leader elector and the actuator, which each build the typed API they need on it. Why one place:
the client owns an aiohttp session (a connection pool); leaving it open warns at exit and leaks
sockets, so it lives in an async context manager that always closes it.

Configuration, in order: an explicit kubeconfig path; the in-cluster service account when the
process runs in a pod (``KUBERNETES_SERVICE_HOST`` is set); else the default kubeconfig
(``$KUBECONFIG`` or ``~/.kube/config``).

A kubeconfig given by path that is not one (missing, not text, not YAML, no clusters) is a
``ConfigError`` of one line naming the path: the client library would otherwise raise whatever
its parser tripped on (a ``UnicodeDecodeError``, a ``TypeError``), as a traceback.

The API server's clock (``ClockProbe``): every answer carries a ``Date`` header, the server's
clock cut to the second, so each request the client sends anyway (the informer's lists and
watches, the writes, the lease) is also a reading of it, timed on the controller's own clock
(``core.clocks``). ``measure_skew`` asks ``/version`` (open to every client, as ``/healthz`` is)
only when no answer came lately, so the skew is measured every tick even when a long watch
is all the traffic there is. ``now`` is the controller's clock corrected by the skew: the
clock every time written on a node is read from (docs/design/clocks.md).
"""

from __future__ import annotations

import email.utils
import logging
import os
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client, config

from rebalancer.core import clocks
from rebalancer.core.model import Clock
from rebalancer.errors import ConfigError

log = logging.getLogger(__name__)


async def configuration(kubeconfig: Path | None = None, context: str | None = None) -> Any:
    """A ``kubernetes_asyncio.client.Configuration`` for the cluster (see the module docstring)."""
    settings = client.Configuration()
    if kubeconfig is not None:
        _check(kubeconfig)
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            # Re-reads the projected service-account token as it rotates.
            # kubernetes-asyncio ships no annotations for this loader.
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=settings, try_refresh_token=True
            )
        else:
            # persist_config=False: never write refreshed credentials back into a user's file.
            await config.load_kube_config(
                config_file=str(kubeconfig) if kubeconfig is not None else None,
                context=context,
                client_configuration=settings,
                persist_config=False,
            )
    # Beyond its own ConfigException, the library's parser raises whatever it trips on (a
    # UnicodeDecodeError, a TypeError on a list where it wants a mapping, a YAMLError).
    except (
        config.ConfigException,
        OSError,
        ValueError,
        TypeError,
        KeyError,
        yaml.YAMLError,
    ) as exc:
        where = kubeconfig or "the in-cluster service account or the default kubeconfig"
        why = " ".join(f"{exc}".split())
        raise ConfigError(f"cannot configure the Kubernetes client from {where}: {why}") from exc
    return settings


def _check(path: Path) -> None:
    """Refuse, in one line naming ``path``, a file that cannot be a kubeconfig."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _unusable(path, "does not exist") from None
    except IsADirectoryError:
        raise _unusable(path, "is a directory, not a file") from None
    except UnicodeDecodeError:
        raise _not_one(path, "not UTF-8 text") from None
    except OSError as exc:
        raise _unusable(path, f"cannot be read ({exc.strerror})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise _not_one(path, f"not valid YAML{where}") from None
    if doc is None:
        raise _not_one(path, "an empty file")
    if not isinstance(doc, dict):
        kind = "list" if isinstance(doc, list) else "string" if isinstance(doc, str) else "value"
        raise _not_one(path, f"a YAML {kind}, not a mapping")
    for key in ("clusters", "contexts"):
        if not doc.get(key) or not isinstance(doc[key], list):
            raise _not_one(path, f"no list of {key}")


def _not_one(path: Path, why: str) -> ConfigError:
    return _unusable(
        path,
        f"not a kubeconfig ({why}); give a file with clusters, users and contexts, as kubectl "
        "writes it",
    )


def _unusable(path: Path, why: str) -> ConfigError:
    return ConfigError(f"cannot configure the Kubernetes client from {path}: {why}")


@asynccontextmanager
async def api_client(
    kubeconfig: Path | None = None, context: str | None = None
) -> AsyncIterator[Any]:
    """An open ``ApiClient`` for the cluster (see the module docstring), as ``opened`` opens it."""
    async with opened(await configuration(kubeconfig, context)) as api:
        yield api


@asynccontextmanager
async def opened(settings: Any) -> AsyncIterator[Any]:
    """An open ``ApiClient`` on ``settings`` (a ``Configuration``), closed with its connection
    pool when the block ends.

    Its requests go through the proxy the environment names for the API server, read once here
    as kubectl reads it (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``), unless the kubeconfig
    names one (``proxy-url``); they never read ``~/.netrc``, which kubectl does not either.
    The library's own session looks the environment up at every request instead
    (``trust_env``): a thread hop for the proxy and another for ``~/.netrc``, three quarters of
    a request's CPU (docs/design/scale.md), and a ``~/.netrc`` naming the API server's host
    makes every request fail beside a bearer token.
    """
    async with client.ApiClient(settings) as api:
        rest, library = api.rest_client, api.rest_client.pool_manager
        async with library:  # closed last, with the connection pool it owns
            rest.pool_manager = aiohttp.ClientSession(
                connector=library.connector,
                connector_owner=False,
                read_bufsize=2**21,  # as the library's: a watch event may be 1.5 MiB (etcd's limit)
            )
            rest.proxy = rest.proxy or environment_proxy(settings.host)
            if rest.proxy:
                where = urllib.parse.urlsplit(rest.proxy).netloc.rpartition("@")[2]
                log.info("the API server %s is reached through the proxy %s", settings.host, where)
            yield api


def environment_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url``, or None (``NO_PROXY`` names its host)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.hostname is None or urllib.request.proxy_bypass(parsed.hostname):
        return None
    return urllib.request.getproxies().get(parsed.scheme)


def _utc_now() -> datetime:
    return datetime.now(UTC)


class ClockProbe:
    """The API server's clock as its answers state it (see the module docstring)."""

    def __init__(self, clock: Clock = _utc_now, fresh: timedelta = timedelta(seconds=5)) -> None:
        self.clock = clock  # the controller's own clock: what the skew is measured against
        self.fresh = fresh  # a reading this recent makes a probe request needless
        self.estimator = clocks.Estimator(clocks.Against.APISERVER)
        self.last: datetime | None = None  # when the newest reading was received
        self.api: Any = None  # the client watched, which ``measure_skew`` probes with
        self._dates: dict[str, datetime] = {}  # the last ``Date`` header read, and its time

    def watch(self, api: Any) -> None:
        """Read the clock of every answer ``api`` gets: its one request call is timed."""
        self.api, inner = api, api.rest_client.request

        async def timed(*args: Any, **kwargs: Any) -> Any:
            sent = self.clock()
            try:
                response = await inner(*args, **kwargs)
            except client.ApiException as exc:  # a refusal is an answer, with a Date too
                headers: Any = exc.headers
                self.observe(sent, self.clock(), headers.get("Date") if headers else None)
                raise
            self.observe(sent, self.clock(), _header(response, "Date"))
            return response

        api.rest_client.request = timed

    def observe(self, sent: datetime, received: datetime, date: str | None) -> None:
        """One answer: sent and received on the controller's clock, its ``Date`` header."""
        if not date:
            return
        server = self._dates.get(date)
        if server is None:
            server = _date(date)
            if server is None:
                return  # not a date: no reading, never a guess
            self._dates = {date: server}  # the answers of one second share their Date
        reading = clocks.Reading(sent, received, server, clocks.SECOND)
        self.estimator = clocks.add(self.estimator, reading)
        self.last = received

    def skew(self) -> clocks.Skew | None:
        return clocks.estimate(self.estimator, self.clock())

    async def measure_skew(self) -> clocks.Skew | None:
        """The skew now; asks ``/version`` first when no answer came within ``fresh``. A
        failed probe is no reading (the estimate keeps what the recent ones say)."""
        now = self.clock()
        if self.api is not None and (self.last is None or now - self.last > self.fresh):
            try:
                await client.VersionApi(self.api).get_code()
            except Exception as exc:  # the skew is what the readings so far say
                log.debug("the API server's clock could not be probed: %s", exc)
        return self.skew()

    def now(self) -> datetime:
        """The API server's now, from the controller's clock (``clocks.corrected``)."""
        own = self.clock()
        return clocks.corrected(own, clocks.estimate(self.estimator, own))


def _date(header: str) -> datetime | None:
    """A ``Date`` header's time in UTC; None when it is not a date with a zone."""
    try:
        server = email.utils.parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    return None if server.tzinfo is None else server.astimezone(UTC)


def _header(response: Any, name: str) -> str | None:
    """A header of the library's ``RESTResponse`` or, for a watch, aiohttp's own response."""
    if hasattr(response, "getheader"):
        found = response.getheader(name)
    else:
        found = getattr(response, "headers", {}).get(name)
    return found if isinstance(found, str) else None
