"""How many reclaims and lends go out at once: the one home of the numbers the command, the
settings and the runtime share.

Where it sits: ``commands.reclaim.reclaim_wave`` (``rebalancer reclaim``) sends at most this many
API calls at a time, the reconcile step as many of a tick's reclaims, and ``rebalancer reclaim``
offers them as its ``--concurrency`` default and bound; a tick's lends go ``LEND_CONCURRENCY`` at
a time unless the settings say otherwise (``lend_concurrency``). Why here: the command builds its
parser (the help names both numbers) without importing the runtime, which loads the Kubernetes
client, and the core is the one layer every other may import. Constants only, no I/O.
"""

from __future__ import annotations

RECLAIM_CONCURRENCY = 32  # a wave of 50 nodes gets its serving taints in about 2 s (bench)
RECLAIM_MAX_CONCURRENCY = 64
# Each lend lists its node's pods once it is marked, a consistent read that kube-apiserver
# answers after etcd's next progress notification, which concurrent lists share: on a real
# server 100 lends took 2.48 s at 4 at a time and 1.28 s at 8 (500 nodes), the median list
# falling from 69 to 41 ms; at 5,000 nodes 3.18 s at 8 (docs/design/scale.md), so 16. Lends
# are never urgent: no more at once than that (reclaims go 32 at a time).
LEND_CONCURRENCY = 16
