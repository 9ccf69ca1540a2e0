"""How many reclaims go out at once: the one home of the numbers the command and the runtime share.

Where it sits: ``runtime.takeback.reclaim_wave`` (``rebalancer reclaim``) sends at most this many
API calls at a time, the reconcile step as many of a tick's reclaims, and ``rebalancer reclaim``
offers them as its ``--concurrency`` default and bound. Why here: the command builds its parser
(the help names both numbers) without importing the runtime, which loads the Kubernetes client,
and the core is the one layer every other may import. Constants only, no I/O.
"""

from __future__ import annotations

RECLAIM_CONCURRENCY = 32  # a wave of 50 nodes gets its serving taints in about 2 s (bench)
RECLAIM_MAX_CONCURRENCY = 64
