"""The keys that sign node state, and the MAC itself: pure computation over bytes.

Where it sits: ``Keys.seal`` carries a ``Seal`` (the key the controller signs with, and the
keys it still accepts), which ``sealing`` uses to sign what the controller writes on a Node
and to check what it reads back. Reading the key files is I/O and happens in the runtime's
wiring (``runtime.wiring``, from ``adapters.sealkeys``); here the keys are plain values.

Why an HMAC (docs/design/node-state-integrity.md): whoever can annotate a Node (a kubelet
under NodeRestriction among them) could write a state the controller would obey with its
cluster-wide right to patch nodes. A MAC under a key only the controller reads makes the state
provably its own, with no round trip to anything: the check costs microseconds per node.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass, field

from rebalancer.core import bounded

VERSION = "v1"
MIN_SECRET = 32  # bytes: the chart's key is 64 random letters and digits


@dataclass(frozen=True, slots=True)
class SealKey:
    """One signing key: its id (derived from the secret, so a rotation needs no naming) and
    the secret, which no repr, log line or audit record shows."""

    secret: bytes = field(repr=False)
    id: str = ""

    def __post_init__(self) -> None:
        if len(self.secret) < MIN_SECRET:
            raise ValueError(
                f"a node-state key needs at least {MIN_SECRET} bytes, not {len(self.secret)}"
            )
        if not self.id:
            digest = hashlib.sha256(b"rebalancer node-state key id\n" + self.secret).hexdigest()
            object.__setattr__(self, "id", digest[:12])


@dataclass(frozen=True, slots=True)
class Seal:
    """The key that signs (``current``), and every key whose signature is still accepted:
    ``current`` and the ``previous`` one(s) of a rotation under way."""

    current: SealKey
    previous: tuple[SealKey, ...] = ()

    @property
    def ids(self) -> tuple[str, ...]:
        return (self.current.id, *(k.id for k in self.previous))

    def accepted(self, key_id: str) -> SealKey | None:
        return next((k for k in (self.current, *self.previous) if k.id == key_id), None)


def sign(seal: Seal, message: bytes) -> str:
    """``v1:<key id>:<base64 MAC>`` of ``message`` under the current key."""
    return f"{VERSION}:{seal.current.id}:{_mac(seal.current, message)}"


def check(seal: Seal, message: bytes, signature: str) -> str | None:
    """None when ``signature`` is a MAC of ``message`` under an accepted key; else why not."""
    parts = signature.split(":")
    if len(parts) != 3 or parts[0] != VERSION:
        return f"not a signature of the form {VERSION}:<key id>:<MAC>"
    key = seal.accepted(parts[1])
    if key is None:
        return f"signed with key {bounded.quoted(parts[1])}, which is not one of the accepted keys"
    if not hmac.compare_digest(_mac(key, message), parts[2]):
        return "the signature does not match the values on this node"
    return None


def _mac(key: SealKey, message: bytes) -> str:
    digest = hmac.new(key.secret, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")
