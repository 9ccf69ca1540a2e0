"""What goes wrong with the audit store, as the runtime and the commands catch it.

Where it sits: ``UnopenedStore`` (and its ``NewerSchema``) when a store is opened, from
``sql.SqlAuditStore.open`` and ``schema.migrate``; ``UnreadableRecord`` when a stored or spooled
record is read back (``rows``); ``SpoolFull`` when ``log.AuditLog`` can keep no more of what the
store has not taken. All are ``RebalancerError``s, each message one line saying what and why.

``log.AuditLog`` raises ``rebalancer.errors.StoreFailed`` from a store's own failure
(``own_failure``) and lets anything else through as it is: the runtime must not take a bug of
ours on the way to the store for a full disk, and act as if the store failed.
"""

from __future__ import annotations

from sqlalchemy import exc as sa_exc

from rebalancer.errors import RebalancerError, StoreFailed


class UnopenedStore(RebalancerError):
    """The audit store cannot be opened (a path that cannot be made, a server that refuses)."""


class NewerSchema(UnopenedStore):
    """The store was migrated by a newer release (a downgrade): this one refuses it, in one
    line, and leaves it as it is; its rows may mean what this release does not know."""

    def __init__(self, found: int, reads: int, url: str = "") -> None:
        where = f"audit.url={url!r}: " if url else ""
        super().__init__(
            f"{where}the audit store is at schema version {found}, newer than version {reads} "
            "that this release reads: run the release that migrated it (or a newer one); "
            "nothing in the store was changed"
        )
        self.found, self.reads, self.url = found, reads, url


class UnreadableRecord(RebalancerError):
    """A stored record that does not read back as one (see ``rows``)."""


class SpoolFull(StoreFailed):
    """The spool of records the store has not taken is full: nothing more may be done until
    the store takes them (an action with no record anywhere must not happen). A failure of
    the store's, as the one that filled the spool."""


def own_failure(error: BaseException) -> bool:
    """Whether ``error`` is the store's own failure, not a bug on the way to it: the operating
    system's (a disk, a socket, a timeout: ``OSError``), the database's answer through its
    driver (``sqlalchemy.exc.DBAPIError``: a full or read-only database, a server that
    refuses, a lost connection), a wait for a pooled connection that timed out, a store that
    could not be opened (``UnreachableStore`` raises why), or one already said to fail."""
    return isinstance(
        error, OSError | sa_exc.DBAPIError | sa_exc.TimeoutError | UnopenedStore | StoreFailed
    )
