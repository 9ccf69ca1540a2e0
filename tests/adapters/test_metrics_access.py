"""How the metrics adapter is let into a Prometheus that demands it (``prometheus:`` settings).

Two real ways in, each read with the pool ``code`` of the backfilled series and compared with
the same read of the plain Prometheus (``prometheus``, the session's):

- ``gate``: a proxy in front of the session's Prometheus, as a managed service's frontend is,
  wanting a bearer token (read from ``bearer_token_file``, rotated under the reader) and an
  ``X-Scope-OrgID`` tenant, and refusing a request line over 4 KiB with 414;
- ``guarded``: Prometheus itself with ``--web.config.file``: TLS for ``prometheus.test`` only, a
  client certificate required, basic auth (one more Prometheus for the session).

Every settings block goes through ``Settings`` and ``adapterconfig.metrics_settings``, as the
controller's loop, ``explain``, ``check``, ``capacity`` and ``simulate --prometheus`` build it.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from rebalancer import settings
from rebalancer.adapters.metrics import Metrics
from rebalancer.adapters.promclient import RACY_NS, SecretFile
from rebalancer.core.model import NodeName, PoolMetrics, PoolName
from rebalancer.runtime import adapterconfig
from tests.support.promauth import (
    PASSWORD,
    SERVER_NAME,
    TENANT,
    USER,
    Gate,
    Pki,
    gate,
    guarded,
)
from tests.support.prometheus import Server, scrape_time

CODE = PoolName("code")
NODES = [NodeName("gpu-code-0"), NodeName("gpu-code-1")]
NOW = scrape_time(120) + timedelta(seconds=20)


def reader(url: str, **prometheus: Any) -> Metrics:
    """The adapter as every command builds it, from a ``prometheus:`` block; one attempt, so
    that a refusal is one request."""
    config = settings.Settings.model_validate(
        {"prometheus": {"url": url, "attempts": 1, **prometheus}}
    )
    return Metrics(adapterconfig.metrics_settings(config))


async def read(url: str, nodes: list[NodeName] = NODES, **prometheus: Any) -> PoolMetrics:
    metrics = reader(url, **prometheus)
    try:
        return await metrics.read(CODE, nodes, now=NOW)
    finally:
        metrics.close()


def reasons(got: PoolMetrics) -> set[str]:
    return {e.reason for e in got.errors}


@pytest.fixture
async def plain(prometheus: Server) -> PoolMetrics:
    """The read every way in must give: the same Prometheus, asked with nothing in between."""
    got = await read(prometheus.url)
    assert got.errors == ()
    assert got.demand is not None
    assert got.queue is not None
    return got


@pytest.fixture
async def proxy(prometheus: Server) -> AsyncIterator[Gate]:
    async with gate(prometheus.url, token="token-one") as served:
        yield served


def token_file(tmp_path: Path, token: str) -> Path:
    path = tmp_path / "token"
    path.write_text(token + "\n", encoding="utf-8")
    return path


# -- a bearer token and a tenant, through a proxy ---------------------------------------------


async def test_a_bearer_token_file_and_a_tenant_header_pass_the_proxy(
    proxy: Gate, plain: PoolMetrics, tmp_path: Path
) -> None:
    got = await read(
        proxy.url,
        bearer_token_file=str(token_file(tmp_path, "token-one")),
        headers={"X-Scope-OrgID": TENANT},
    )

    assert got.errors == ()
    assert (got.demand, got.queue) == (plain.demand, plain.queue)
    assert {s.method for s in proxy.seen} == {"POST"}  # the default


async def test_a_rotated_token_is_sent_by_the_next_query(
    proxy: Gate, plain: PoolMetrics, tmp_path: Path
) -> None:
    path = token_file(tmp_path, "token-one")
    metrics = reader(proxy.url, bearer_token_file=str(path), headers={"X-Scope-OrgID": TENANT})
    try:
        assert (await metrics.read(CODE, NODES, now=NOW)).errors == ()
        # Rotated: the proxy takes only the new one. Same length, written in place, at once:
        # the file's size and (coarse) time may not tell it changed; it is read again anyway.
        proxy.token = "token-two"
        path.write_text("token-two\n", encoding="utf-8")
        got = await metrics.read(CODE, NODES, now=NOW)
        assert got.errors == ()
        assert got.demand == plain.demand
        # A projected token is swapped in by a rename, as the kubelet does.
        proxy.token = "token-three-longer"
        swapped = tmp_path / "token.new"
        swapped.write_text("token-three-longer", encoding="utf-8")
        os.replace(swapped, path)
        assert (await metrics.read(CODE, NODES, now=NOW)).errors == ()
    finally:
        metrics.close()
    assert {s.headers["Authorization"] for s in proxy.seen} == {
        "Bearer token-one",
        "Bearer token-two",
        "Bearer token-three-longer",
    }


async def test_an_authorization_header_is_sent_whatever_a_netrc_says(
    proxy: Gate, plain: PoolMetrics, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A ``default`` entry names every host; requests would put its basic auth in place of the
    # header given in the settings.
    netrc = tmp_path / "netrc"
    netrc.write_text("default login someone password secret\n", encoding="utf-8")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    headers = {"X-Scope-OrgID": TENANT, "Authorization": "Bearer token-one"}

    got = await read(proxy.url, headers=headers)

    assert got.errors == ()
    assert got.demand == plain.demand
    assert {s.headers["Authorization"] for s in proxy.seen} == {"Bearer token-one"}


def test_a_token_file_is_read_again_only_when_it_may_have_changed(tmp_path: Path) -> None:
    """One ``stat`` a request; a read only for a file whose identity, size or time moved, or
    whose last change is too recent for its time to tell (``RACY_NS``)."""
    path = token_file(tmp_path, "token-one")
    old = time.time_ns() - 10 * RACY_NS
    os.utime(path, ns=(old, old))
    token = SecretFile(path, "prometheus.bearer_token_file")
    assert token.read() == "token-one"
    # Rewritten in place at the same size, its time put back: nothing tells it changed, and
    # the last read came long after its time. The cached token stands: no read.
    path.write_text("token-two\n", encoding="utf-8")
    os.utime(path, ns=(old, old))
    assert token.read() == "token-one"
    # The same, but the file's time is within a second of the last read: that read may have
    # raced a write in the same clock tick, so it is read again.
    recent = time.time_ns()
    os.utime(path, ns=(recent, recent))
    assert token.read() == "token-two"
    path.write_text("token-six\n", encoding="utf-8")
    os.utime(path, ns=(recent, recent))
    assert token.read() == "token-six"


async def test_a_refused_or_unreadable_token_is_one_reason_naming_the_setting(
    proxy: Gate, tmp_path: Path
) -> None:
    tenant = {"X-Scope-OrgID": TENANT}
    wrong = await read(
        proxy.url, bearer_token_file=str(token_file(tmp_path, "stale")), headers=tenant
    )
    missing = await read(proxy.url, bearer_token_file=str(tmp_path / "gone"), headers=tenant)
    (tmp_path / "empty").write_text("\n", encoding="utf-8")
    empty = await read(proxy.url, bearer_token_file=str(tmp_path / "empty"), headers=tenant)
    none = await read(proxy.url, headers=tenant)

    assert reasons(wrong) == {
        "Prometheus answered HTTP 401: authentication failed "
        "(the credentials of prometheus.bearer_token_file were refused)"
    }
    assert reasons(missing) == {
        f"prometheus.bearer_token_file={str(tmp_path / 'gone')!r}: No such file or directory"
    }
    assert reasons(empty) == {
        f"prometheus.bearer_token_file={str(tmp_path / 'empty')!r}: the file is empty"
    }
    assert reasons(none) == {
        "Prometheus answered HTTP 401: authentication failed (no credentials are sent: set "
        "prometheus.bearer_token_file or prometheus.basic_auth)"
    }
    # Nothing was sent without the file; each refusal was asked once (a 401 is not retried).
    assert len(proxy.seen) == len(wrong.errors) + len(none.errors)


async def test_post_carries_a_node_regex_that_a_get_url_cannot_pass_the_proxy_with(
    proxy: Gate, plain: PoolMetrics, tmp_path: Path
) -> None:
    # A pool of 300 nodes: its regex alone is about 8 KiB once written in a URL.
    many = NODES + [NodeName(f"gpu-code-{i}.pool-a.example.internal") for i in range(2, 300)]
    access: dict[str, Any] = {
        "bearer_token_file": str(token_file(tmp_path, "token-one")),
        "headers": {"X-Scope-OrgID": TENANT},
    }

    posted = await read(proxy.url, many, **access)
    got = await read(proxy.url, many, method="GET", **access)

    assert posted.errors == ()
    assert (posted.demand, posted.queue) == (plain.demand, plain.queue)
    assert reasons(got) == {"Prometheus answered HTTP 414: URI Too Long"}
    lines = {s.method: s.target_length for s in proxy.seen}
    assert lines["POST"] < 100
    assert lines["GET"] > proxy.max_url


# -- TLS, a client certificate and basic auth, served by Prometheus itself ---------------------


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.make(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def tls_prometheus(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Server]:
    with guarded(tmp_path_factory.mktemp("prometheus-tls"), pki) as server:
        yield server


def password_file(tmp_path: Path, password: str) -> str:
    path = tmp_path / "password"
    path.write_text(password, encoding="utf-8")
    return str(path)


def tls(pki: Pki, **changed: Any) -> dict[str, Any]:
    given = {
        "ca_file": str(pki.ca),
        "cert_file": str(pki.client_cert),
        "key_file": str(pki.client_key),
        "server_name": SERVER_NAME,
        **changed,
    }
    return {k: v for k, v in given.items() if v is not None}


async def test_tls_a_client_certificate_and_basic_auth_reach_prometheus(
    tls_prometheus: Server, pki: Pki, plain: PoolMetrics, tmp_path: Path
) -> None:
    basic = {"username": USER, "password_file": password_file(tmp_path, PASSWORD)}

    got = await read(tls_prometheus.url, basic_auth=basic, tls=tls(pki))
    skipped = await read(
        tls_prometheus.url,
        basic_auth=basic,
        tls=tls(pki, ca_file=None, server_name=None, insecure_skip_verify=True),
    )

    assert got.errors == ()
    assert (got.demand, got.queue) == (plain.demand, plain.queue)
    assert skipped.errors == ()
    assert skipped.demand == plain.demand


TLS_FAILED = "TLS failed, see prometheus.tls (ca_file, server_name, cert_file): "


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            "password",
            {
                "Prometheus answered HTTP 401: Unauthorized "
                "(the credentials of prometheus.basic_auth were refused)"
            },
        ),
        (
            "ca",
            {
                f"{TLS_FAILED}[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
                "unable to get local issuer certificate"
            },
        ),
        (
            "server_name",
            {
                f"{TLS_FAILED}[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
                "IP address mismatch, certificate is not valid for '127.0.0.1'."
            },
        ),
        # TLS 1.3: the server's refusal of a client without a certificate comes after the
        # handshake, as an alert or as the connection's end, whichever a request meets first.
        (
            "client_cert",
            {
                f"{TLS_FAILED}[SSL: SSLV3_ALERT_BAD_CERTIFICATE] sslv3 alert bad certificate",
                f"{TLS_FAILED}EOF occurred in violation of protocol",
            },
        ),
    ],
)
async def test_a_wrong_password_ca_name_or_no_certificate_is_a_reason_naming_the_setting(
    tls_prometheus: Server, pki: Pki, tmp_path: Path, case: str, expected: set[str]
) -> None:
    password = "wrong" if case == "password" else PASSWORD
    cases: dict[str, dict[str, Any]] = {
        "password": {},
        "ca": {"ca_file": str(pki.other_ca)},
        "server_name": {"server_name": None},
        "client_cert": {"cert_file": None, "key_file": None},
    }
    changed = cases[case]
    basic = {"username": USER, "password_file": password_file(tmp_path, password)}

    got = await read(tls_prometheus.url, basic_auth=basic, tls=tls(pki, **changed))

    assert (got.demand, got.queue) == (None, None)
    assert got.errors
    assert reasons(got) <= expected
