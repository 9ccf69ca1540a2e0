"""Prometheus that demands credentials, two ways, for the tests of ``prometheus:``'s ways in.

``Pki`` makes a certificate authority, a server certificate for ``prometheus.test`` only (so
the URL's ``127.0.0.1`` does not match it and ``tls.server_name`` is needed), a client
certificate, and a second authority that signed nothing the server shows (a wrong ``ca_file``).

``guarded`` runs Prometheus itself over the backfilled series with ``--web.config.file``: TLS,
a client certificate required and verified, and basic auth (a bcrypt hash, cost 4: the lowest,
the test's password is no secret).

``Gate`` is an aiohttp proxy in front of a plain Prometheus, as a managed service's frontend
is: it wants ``Authorization: Bearer <token>`` (the token a test sets, and may change, as a
rotated service-account token is), an ``X-Scope-OrgID`` tenant, and refuses a request line
longer than ``max_url`` with 414, as proxies with a URL limit do. It records what it was sent.
"""

from __future__ import annotations

import contextlib
import datetime
import ssl
import urllib.request
from base64 import b64encode
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import bcrypt
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.processes import free_port
from tests.support.prometheus import Server, backfill, generate, openmetrics, serving

SERVER_NAME = "prometheus.test"
USER = "rebalancer"
PASSWORD = "correct horse battery staple"
TENANT = "team-a"


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _authority(common: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    common: str,
    usage: x509.ObjectIdentifier,
    names: list[x509.GeneralName],
) -> tuple[bytes, bytes]:
    ca_cert, ca_key = ca
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


@dataclass(frozen=True)
class Pki:
    """The files of a small public key infrastructure, all PEM, in one directory."""

    ca: Path
    other_ca: Path  # signed nothing the server shows
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def make(cls, where: Path) -> Pki:
        where.mkdir(parents=True, exist_ok=True)
        ca = _authority("rebalancer test CA")
        other, _ = _authority("another CA")
        server = _leaf(
            ca, SERVER_NAME, ExtendedKeyUsageOID.SERVER_AUTH, [x509.DNSName(SERVER_NAME)]
        )
        client = _leaf(ca, USER, ExtendedKeyUsageOID.CLIENT_AUTH, [])
        files = {
            "ca": ca[0].public_bytes(serialization.Encoding.PEM),
            "other_ca": other.public_bytes(serialization.Encoding.PEM),
            "server_cert": server[0],
            "server_key": server[1],
            "client_cert": client[0],
            "client_key": client[1],
        }
        paths = {}
        for name, content in files.items():
            path = where / f"{name}.pem"
            path.write_bytes(content)
            paths[name] = path
        return cls(**paths)


def web_config(where: Path, pki: Pki) -> Path:
    """Prometheus' ``--web.config.file``: TLS, a client certificate required, basic auth."""
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    path = where / "web.yml"
    path.write_text(
        "tls_server_config:\n"
        f"  cert_file: {pki.server_cert}\n"
        f"  key_file: {pki.server_key}\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        f"  client_ca_file: {pki.ca}\n"
        f"basic_auth_users:\n  {USER}: '{hashed}'\n",
        encoding="utf-8",
    )
    return path


def _ready_with(pki: Pki) -> urllib.request.OpenerDirector:
    """An opener that shows the client certificate and trusts the CA, for readiness."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.check_hostname = False  # the URL is 127.0.0.1; the certificate is for SERVER_NAME
    context.load_cert_chain(pki.client_cert, pki.client_key)
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
    token = b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    opener.addheaders = [("Authorization", f"Basic {token}")]
    return opener


@contextlib.contextmanager
def guarded(workdir: Path, pki: Pki) -> Iterator[Server]:
    """A Prometheus over the backfilled series that serves only TLS, to a client with a
    certificate of ``pki``'s CA and the basic-auth password; its URL is ``https://``."""
    data = generate()
    store, backfill_cmd = backfill(workdir, openmetrics(data))
    config = web_config(workdir, pki)
    with serving(
        workdir, store, flags=[f"--web.config.file={config}"], opener=_ready_with(pki)
    ) as (url, proc, cmd):
        yield Server(url, proc, cmd, backfill_cmd, data)


@dataclass
class Seen:
    method: str
    target_length: int  # the request line's target: path and query string
    headers: dict[str, str]


@dataclass
class Gate:
    """A proxy in front of ``upstream`` that wants a bearer token and a tenant."""

    upstream: str
    token: str
    tenant: str = TENANT
    max_url: int = 4096
    port: int = field(default_factory=free_port)
    seen: list[Seen] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(Seen(request.method, len(request.raw_path), dict(request.headers)))
        if len(request.raw_path) > self.max_url:
            return web.Response(status=414, text="URI Too Long")
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response(
                {"status": "error", "error": "authentication failed"}, status=401
            )
        if request.headers.get("X-Scope-OrgID") != self.tenant:
            return web.json_response({"status": "error", "error": "no org id"}, status=401)
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "")}
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method,
                self.upstream + request.raw_path,
                data=body or None,
                headers=headers if body else None,
            ) as answer,
        ):
            return web.Response(
                status=answer.status,
                body=await answer.read(),
                content_type=answer.content_type,
            )


@contextlib.asynccontextmanager
async def gate(upstream: str, token: str) -> AsyncIterator[Gate]:
    """A ``Gate`` serving on 127.0.0.1 for the block."""
    proxy = Gate(upstream, token)
    # aiohttp's own request-line limit (8190) would answer first with 400: lift it, so the
    # limit that answers is the proxy's ``max_url``.
    app = web.Application(handler_args={"max_line_size": 1 << 20})
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", proxy.port)
    await site.start()
    try:
        yield proxy
    finally:
        await runner.cleanup()
