"""The lend/reclaim state machine as it is written on the Node itself.

Nothing that matters lives only in memory: a restarted controller rebuilds everything from the
keys ``Keys`` names (docs/design/node-state.md). This package is the only code that knows their
names and formats.
It reads them (``read`` returns a ``NodeState`` or a ``StateError`` value, never raises) and
computes, as pure values, the metadata each transition writes; the actuator sends those writes,
the simulator applies them to its fake nodes.

```
serving ──lend──► lending ──► lent ──reclaim──► reclaiming ──► serving
   ▲                 │          │  ▲                 ▲          (deadline passed: force)
   └──── rollback ◄──┘   notice ▼  │ withdraw        │ due
                              noticed ───────────────┘
```

Noticed is lent with a reclaim deadline on it: the borrowed pods are told, and the reclaim
begins when they have answered or their time is up (docs/design/reclaim-notice.md).

``original`` is written before any taint or label changes and is the only source for restore, so
a crash at any instant leaves enough on the node to put it back byte for byte.

The controller is not the only writer on its nodes: a GPU health checker, the node lifecycle
controller, a cordon add and remove taints while a node is lent. So a restore (``begin_reclaim``,
``finish``) owns only what the lend changed: it takes out the taints the lend added, puts back the
ones it removed (both by key and effect), and leaves every other taint as it is on the node now
(``restore_taints``). Where nobody else wrote, that is the original list byte for byte. Labels
follow the same rule: restore writes only the labels the lend changed.

One noun a module, from the bottom up:

- ``signing``: the keys that sign node state (``Seal``, ``SealKey``) and the MAC;
- ``keys``: the names of the owned keys and the seal (``Keys``);
- ``values``: ``Phase``, ``Original``, ``NodeState``, ``StateError``, ``LendSpec``, ``NodeChange``;
- ``encoding``: the text formats of times and of ``original``;
- ``reading``: ``read`` and what a node carries of ours;
- ``restoration``: what a restore owns and puts back (``restore_taints``, ``spec_original``);
- ``sealing``: what the signature covers, ``seal`` on every write, ``verify`` on every read,
  and ``confirmed``, an original trusted only as far as the pool's specification confirms it;
- ``transitions``: ``begin_lend`` ... ``finish``, and ``apply``.

Callers import this package (``from rebalancer.core import nodestate``); every name they use is
here.
"""

from rebalancer.core.nodestate.encoding import (
    decode_original,
    encode_original,
    format_time,
    parse_time,
)
from rebalancer.core.nodestate.keys import Keys
from rebalancer.core.nodestate.reading import (
    carries_ours,
    missing_lent_taints,
    read,
    read_in_pool,
    serving_labels,
)
from rebalancer.core.nodestate.restoration import (
    Restore,
    owned_taints,
    recorded_lend,
    restore,
    restore_taints,
    spec_original,
)
from rebalancer.core.nodestate.sealing import confirmed, seal, verify
from rebalancer.core.nodestate.signing import Seal, SealKey
from rebalancer.core.nodestate.transitions import (
    apply,
    begin_lend,
    begin_reclaim,
    begin_restore_confirmed,
    begin_restore_from_spec,
    finish,
    finish_lend,
    lent_taints,
    notice,
    take_over,
    withdraw,
)
from rebalancer.core.nodestate.values import (
    Drift,
    LendSpec,
    NodeChange,
    NodeState,
    Original,
    Phase,
    StateError,
    TaintKey,
    taint_key,
)

__all__ = [
    "Drift",
    "Keys",
    "LendSpec",
    "NodeChange",
    "NodeState",
    "Original",
    "Phase",
    "Restore",
    "Seal",
    "SealKey",
    "StateError",
    "TaintKey",
    "apply",
    "begin_lend",
    "begin_reclaim",
    "begin_restore_confirmed",
    "begin_restore_from_spec",
    "carries_ours",
    "confirmed",
    "decode_original",
    "encode_original",
    "finish",
    "finish_lend",
    "format_time",
    "lent_taints",
    "missing_lent_taints",
    "notice",
    "owned_taints",
    "parse_time",
    "read",
    "read_in_pool",
    "recorded_lend",
    "restore",
    "restore_taints",
    "seal",
    "serving_labels",
    "spec_original",
    "taint_key",
    "take_over",
    "verify",
    "withdraw",
]
