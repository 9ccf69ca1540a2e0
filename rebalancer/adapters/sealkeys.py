"""The keys that sign node state, read from the files the chart mounts from a Secret.

Where it sits: ``runtime.wiring`` calls ``load`` once at start and hands the ``Seal`` to
every reader and writer of node state inside ``nodestate.Keys``
(docs/design/node-state-integrity.md).

The directory holds ``current`` (the key the controller signs with) and, during a rotation,
``previous`` (a key whose signatures are still accepted): the chart's Secret keys of those
names, mounted as a volume, so the controller needs no right to read Secrets. A key is the
file's bytes less surrounding white space, at least 32 of them.

With no directory configured, the process signs with a key of its own, made at start and
never written anywhere: nothing another writer wrote can verify, so nothing forged is obeyed,
but neither does a state this process signed verify for the next one: after a restart every
node in flight or lent is taken back within what its pool's specification confirms (one
preemption a loan). That is said once, as a warning. The chart always configures a directory.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path

from rebalancer.core import nodestate
from rebalancer.errors import ConfigError

log = logging.getLogger(__name__)

CURRENT, PREVIOUS = "current", "previous"


def load(directory: Path | None, warn: bool = True) -> nodestate.Seal:
    """The seal of the keys in ``directory``; a key of this process's own when None, said as
    a warning when ``warn`` (the controller's: a command that only reads node state, or
    writes it once, loses nothing at its own exit). ``ConfigError`` naming the file when a
    key is missing, unreadable or too short."""
    if directory is None:
        if warn:
            log.warning(
                "no node_state_keys directory is configured: node state is signed with a key "
                "made for this process only, so after a restart every node lent or in flight "
                "is taken back (docs/configuration.md, node_state_keys)"
            )
        return nodestate.Seal(nodestate.SealKey(secrets.token_bytes(32)))
    current = _key(directory / CURRENT, required=True)
    assert current is not None
    previous = _key(directory / PREVIOUS, required=False)
    others = () if previous is None or previous.id == current.id else (previous,)
    return nodestate.Seal(current, others)


def _key(path: Path, *, required: bool) -> nodestate.SealKey | None:
    try:
        secret = path.read_bytes().strip()
    except FileNotFoundError:
        if required:
            raise ConfigError(f"node_state_keys: {path} does not exist (the signing key)") from None
        return None
    except OSError as exc:
        raise ConfigError(f"node_state_keys: {path} cannot be read: {exc.strerror}") from None
    if not secret and not required:
        return None  # the chart's Secret holds an empty ``previous`` when no rotation is on
    try:
        return nodestate.SealKey(secret)
    except ValueError as exc:
        raise ConfigError(f"node_state_keys: {path}: {exc}") from None
