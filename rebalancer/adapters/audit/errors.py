"""What goes wrong with the audit store, as the runtime and the commands catch it.

Where it sits: ``UnopenedStore`` (and its ``NewerSchema``) when a store is opened, from
``sql.SqlAuditStore.open`` and ``schema.migrate``; ``UnreadableRecord`` when a stored or spooled
record is read back (``rows``); ``SpoolFull`` when ``log.AuditLog`` can keep no more of what the
store has not taken. All are ``RebalancerError``s, each message one line saying what and why.
"""

from __future__ import annotations

from rebalancer.errors import RebalancerError


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


class SpoolFull(RebalancerError):
    """The spool of records the store has not taken is full: nothing more may be done until
    the store takes them (an action with no record anywhere must not happen)."""
