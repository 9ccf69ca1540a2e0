"""The HTTP client the metrics adapter asks Prometheus with: credentials, TLS, headers, POST.

Where it sits: ``adapters.metrics.Metrics`` builds one ``Client`` from its ``Access`` (made from
the ``prometheus:`` settings by ``runtime.adapterconfig``) and calls ``custom_query`` and
``custom_query_range`` from worker threads. ``Client`` asks through ``PrometheusConnect`` (same
calls, same ``PrometheusApiClientException`` on a refusal) over a session that carries the
access, but sends the query as a form body when the method is POST: the library's own POST
(0.7) puts it in the URL still, and a pool of many nodes writes a regular expression of all
their names that a proxy's URL limit refuses (docs/design/prometheus-auth.md).

Credentials are files, read when a request is made and read again only when the file changed
(``SecretFile``: one ``stat`` a request), so a projected service-account token or a rotated
Secret is picked up by the next query without a restart. A file that cannot be read, or is
empty, is a ``CredentialsUnreadable`` naming the setting: the request fails, the tick reports
it, nothing crashes.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
import requests.adapters
import requests.auth
import urllib3
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry


@dataclass(frozen=True)
class Tls:
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str | None = None
    insecure_skip_verify: bool = False


@dataclass(frozen=True)
class Access:
    """How the controller is let in: at most one of bearer and basic, each a file."""

    bearer_token_file: Path | None = None
    basic_username: str | None = None
    basic_password_file: Path | None = None
    tls: Tls = field(default_factory=Tls)
    headers: tuple[tuple[str, str], ...] = ()
    method: str = "POST"
    credentials: str = ""  # the setting that names them, for error lines ("" when none)


class CredentialsUnreadable(Exception):
    """A token or password file cannot be read, or is empty; the message names the setting."""


# A file's time is the kernel's coarse clock (a few milliseconds): a file written again within
# that tick, at the same size, in place, stats the same. As git does with its index, a file
# read less than this after its last change is read again until a read comes later than that.
RACY_NS = 1_000_000_000


class SecretFile:
    """A file's text, read again only when its identity, size or time changed.

    A projected token is swapped in by a symlink rename (``..data``): ``stat`` follows the link,
    so the new file has a new inode and is read once. Safe to share between threads.
    """

    def __init__(self, path: Path, setting: str) -> None:
        self.path = path
        self.setting = setting
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int, int] | None = None
        self._read_at = 0  # time.time_ns() of the last read
        self._text = ""

    def _fresh(self, key: tuple[int, int, int, int], mtime_ns: int) -> bool:
        return key == self._seen and self._read_at - mtime_ns > RACY_NS

    def read(self) -> str:
        try:
            st = os.stat(self.path)
            key = (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)
            with self._lock:
                if not self._fresh(key, st.st_mtime_ns):
                    self._read_at = time.time_ns()
                    self._text = self.path.read_text(encoding="utf-8").strip()
                    self._seen = key
                text = self._text
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise CredentialsUnreadable(f"{self.setting}={str(self.path)!r}: {why}") from None
        if not text:
            raise CredentialsUnreadable(f"{self.setting}={str(self.path)!r}: the file is empty")
        return text


class BearerFile(requests.auth.AuthBase):
    def __init__(self, token: SecretFile) -> None:
        self.token = token

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        r.headers["Authorization"] = f"Bearer {self.token.read()}"
        return r


class BasicFile(requests.auth.AuthBase):
    def __init__(self, username: str, password: SecretFile) -> None:
        self.username = username
        self.password = password

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        return requests.auth.HTTPBasicAuth(self.username, self.password.read())(r)


class _NoNetrc(requests.auth.AuthBase):
    """No credentials of requests' own finding: given as a session's auth, it keeps requests
    from reading ``~/.netrc``, whose entry for the host (or ``default`` one, for every host)
    would otherwise replace an ``Authorization`` given in ``prometheus.headers``."""

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        return r


class _NamedTls(requests.adapters.HTTPAdapter):
    """Sends ``server_name`` as SNI and checks the certificate against it, not the URL's host."""

    def __init__(self, server_name: str, **kwargs: Any) -> None:
        self.server_name = server_name
        super().__init__(**kwargs)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["server_hostname"] = self.server_name
        kwargs["assert_hostname"] = self.server_name
        super().init_poolmanager(*args, **kwargs)


def auth_of(access: Access) -> requests.auth.AuthBase | None:
    if access.bearer_token_file is not None:
        return BearerFile(SecretFile(access.bearer_token_file, "prometheus.bearer_token_file"))
    if access.basic_username is not None and access.basic_password_file is not None:
        password = SecretFile(access.basic_password_file, "prometheus.basic_auth.password_file")
        return BasicFile(access.basic_username, password)
    return None


def session_of(access: Access) -> requests.Session:
    """A session that carries the credentials, the headers and the TLS settings on every
    request, the library's own calls included."""
    session = requests.Session()
    session.auth = auth_of(access) or _NoNetrc()
    session.headers.update(dict(access.headers))
    tls = access.tls
    if tls.insecure_skip_verify:
        session.verify = False
    elif tls.ca_file is not None:
        session.verify = str(tls.ca_file)
    if tls.cert_file is not None and tls.key_file is not None:
        session.cert = (str(tls.cert_file), str(tls.key_file))
    return session


class Client:
    """Prometheus' query API over ``session_of(access)``, with ``PrometheusConnect``'s calls and
    errors. A GET is the library's own; a POST (the default) sends the query as a form body,
    where the library's POST leaves it in the URL."""

    def __init__(self, url: str, access: Access, retry: Retry, timeout: float) -> None:
        self.url = url.rstrip("/")
        self._method = access.method
        self._timeout = timeout
        self._session = session_of(access)
        self._connect = PrometheusConnect(
            self.url, retry=retry, session=self._session, timeout=timeout, method="GET"
        )
        if access.tls.server_name:  # mounted over the library's adapter for the same URL
            self._session.mount(self.url, _NamedTls(access.tls.server_name, max_retries=retry))
        if access.tls.insecure_skip_verify:
            # Said once, by whoever builds the client, not by urllib3 on every request.
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)

    def close(self) -> None:
        self._session.close()

    def _posted(self, path: str, fields: Mapping[str, Any], timeout: float | None) -> Any:
        # ``verify`` given here, as the library gives it: requests lets REQUESTS_CA_BUNDLE (or
        # CURL_CA_BUNDLE) in the environment override a session's own, and so ``tls.ca_file``.
        response = self._session.post(
            f"{self.url}/api/v1/{path}",
            data=fields,
            timeout=timeout or self._timeout,
            verify=self._session.verify,
        )
        if response.status_code != 200:
            raise PrometheusApiClientException(
                f"HTTP Status Code {response.status_code} ({response.content!r})"
            )
        return response.json()["data"]["result"]

    def custom_query(
        self, query: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        if self._method == "GET":
            return self._connect.custom_query(query, params, timeout)
        return self._posted("query", {"query": str(query), **(params or {})}, timeout)

    def custom_query_range(
        self,
        query: str,
        start_time: datetime,
        end_time: datetime,
        step: str,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        if self._method == "GET":
            return self._connect.custom_query_range(
                query, start_time, end_time, step, params, timeout
            )
        fields = {
            "query": str(query),
            "start": round(start_time.timestamp()),
            "end": round(end_time.timestamp()),
            "step": step,
            **(params or {}),
        }
        return self._posted("query_range", fields, timeout)
