"""The HTTP API's serving certificate: read from files, or made at start when none is given.

Where it sits: ``runtime.http`` asks ``context(cert_file, key_file)`` for the ``SSLContext``
its API port serves with (the probes' port is plain HTTP). The chart mounts a
``kubernetes.io/tls`` Secret it is told the name of (``http.tls.secretName``) and passes its
``tls.crt`` and ``tls.key`` paths; without one the process makes a self-signed certificate for
its own lifetime (``self_signed``), so the port is never plain text. A scraper of a
self-signed port skips verification (the ServiceMonitor's ``insecureSkipVerify``) but still
sends its token over TLS (docs/design/http-server.md#tls).

A certificate or key that cannot be read is a ``ConfigError`` naming the setting and the file.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from rebalancer.errors import ConfigError

SELF_SIGNED_DAYS = 365  # longer than any process lives; made again at every start


def context(cert_file: Path | None, key_file: Path | None) -> ssl.SSLContext:
    """A server context with the certificate in ``cert_file`` and ``key_file``, or a
    self-signed one when both are None."""
    made = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    made.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file is None and key_file is None:
        cert, key = self_signed(socket.gethostname())
        # The ssl module loads a chain only from a file: a private directory, gone at once.
        with tempfile.TemporaryDirectory(prefix="rebalancer-tls-") as where:
            cert_path, key_path = Path(where) / "tls.crt", Path(where) / "tls.key"
            cert_path.write_bytes(cert)
            key_path.touch(mode=0o600)
            key_path.write_bytes(key)
            made.load_cert_chain(cert_path, key_path)
        return made
    if cert_file is None or key_file is None:
        given = "http.tls.cert_file" if cert_file is not None else "http.tls.key_file"
        other = "http.tls.key_file" if cert_file is not None else "http.tls.cert_file"
        raise ConfigError(f"{given} is set but {other} is not: give both, or neither")
    for name, path in (("http.tls.cert_file", cert_file), ("http.tls.key_file", key_file)):
        if not path.is_file():
            raise ConfigError(f"{name}={str(path)!r}: no such file")
    try:
        made.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"http.tls.cert_file={str(cert_file)!r}, http.tls.key_file={str(key_file)!r}: "
            f"not a PEM certificate and its key ({exc})"
        ) from None
    return made


def self_signed(host: str) -> tuple[bytes, bytes]:
    """A PEM certificate and key (P-256) for ``host``, ``localhost`` and the loopback
    addresses."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64] or "rebalancer")])
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    if host and host != "localhost":
        names.insert(0, x509.DNSName(host))
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", "::1")]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return (
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
