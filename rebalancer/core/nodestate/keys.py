"""The names of every label, annotation and taint key the controller owns, under one prefix."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rebalancer.core.nodestate.signing import Seal

# A DNS-1123 subdomain (dot-separated labels, each starting and ending alphanumeric, at most
# 253 characters) and the slash; used with fullmatch, so no trailing newline slips through.
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_PREFIX = re.compile(rf"(?=.{{2,254}}\Z){_LABEL}(\.{_LABEL})*/")


@dataclass(frozen=True, slots=True)
class Keys:
    """Every label, annotation and taint key the controller owns, under one prefix, and the
    ``seal`` that makes what it writes under them provably its own (None: nothing is signed
    or checked, as the simulator and the tests of the codec alone need; the controller always
    runs with one, docs/design/node-state-integrity.md). Every reader and writer of these keys
    takes a ``Keys``, so the seal goes wherever they do."""

    prefix: str = "rebalancer.io/"
    seal: Seal | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not _PREFIX.fullmatch(self.prefix):
            raise ValueError(
                f"key prefix {self.prefix!r} must be a DNS subdomain followed by '/', "
                "e.g. 'rebalancer.io/'"
            )

    state = property(lambda self: self.prefix + "state")
    original = property(lambda self: self.prefix + "original")
    since = property(lambda self: self.prefix + "since")
    decision = property(lambda self: self.prefix + "decision")
    deadline = property(lambda self: self.prefix + "reclaim-deadline")
    signature = property(lambda self: self.prefix + "signature")  # docs/design/node-state.md
    lent_taint = property(lambda self: self.prefix + "lent")
    # operator overrides (docs/operations.md)
    window = property(lambda self: self.prefix + "window")
    lend = property(lambda self: self.prefix + "lend")
    reclaim = property(lambda self: self.prefix + "reclaim")
    paused = property(lambda self: self.prefix + "paused")
    override_until = property(lambda self: self.prefix + "override-until")
    # on the controller's own Events, not on nodes: the cluster it runs in (docs/design/fleet.md)
    cluster = property(lambda self: self.prefix + "cluster")
    # on borrowed pods: a reclaim's notice, written by the controller (the deadline under
    # ``deadline``'s name, the reclaim id, a condition type) and the job's answers
    # (docs/design/reclaim-notice.md)
    reclaim_id = property(lambda self: self.prefix + "reclaim-id")
    notice_condition = property(lambda self: self.prefix + "ReclaimNotice")
    reclaim_ack = property(lambda self: self.prefix + "reclaim-ack")
    last_checkpoint = property(lambda self: self.prefix + "last-checkpoint-time")
