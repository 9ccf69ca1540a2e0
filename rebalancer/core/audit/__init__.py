"""Audit records: what the controller decided, from what, and what came of it (docs/audit.md).

Pure: this package builds ``AuditRecord`` values from a tick's ``Plan`` and the ``Snapshot`` it was
made from, turns them into JSON documents, and decides which of them a steady state would only
repeat (``Deduper``). Writing them (a database, stdout) is ``rebalancer.adapters.audit``; record
ids come from an injected ``new_id`` so that nothing here reads a clock or a random source.

Kinds of record:
- ``intent``: a step the actuator is about to carry out, written (and committed) before it acts;
  its id is what the actuator writes into the node's ``decision`` annotation.
- ``outcome``: what came of an intent, appended as a new row that names the intent
  (``intent_id``); the intent row itself is never changed.
- ``refusal``: (part of) an intent the planner refused, with its reason code.
- ``finding``: a bad operator annotation, a node another writer changed, or a borrowed pod's
  checkpoint that is not believed.
- ``summary``: a pool that got no step this tick, and why ("nothing to do because ...").
- ``cost``: a minute in which lending cost a pool (requests queued beyond its limit while nodes
  were away on loan), one per pool and minute: the pool's error budget is counted from these.

Refusals, findings and summaries are deduplicated (see ``Deduper``); intents and outcomes never.
See docs/audit.md for every field.

One noun a module, from the bottom up:

- ``record``: ``Kind``, ``Context``, ``AuditRecord``;
- ``documents``: records as JSON (``to_json``, ``jsonable``);
- ``inputs``: what a decision was made from (``pool_inputs``, ``node_overrides``);
- ``tick``: a tick's records (``build_tick``, ``Tick``);
- ``standalone``: records written one at a time (episodes, costs, recoveries, outcomes);
- ``dedupe``: ``Deduper``.

Callers import this package (``from rebalancer.core import audit``); every name they use is here.
"""

from rebalancer.core.audit.dedupe import DedupeKey, Deduper, dedupe_key, fingerprint
from rebalancer.core.audit.documents import jsonable, node_doc, to_json
from rebalancer.core.audit.inputs import node_overrides, pool_inputs
from rebalancer.core.audit.record import (
    DEDUPED,
    DEFAULT_CLUSTER,
    STEADY,
    AuditRecord,
    Context,
    Json,
    Kind,
    NewId,
)
from rebalancer.core.audit.standalone import (
    cost_record,
    episode_record,
    outcome_record,
    recovery_intent,
)
from rebalancer.core.audit.tick import EXCLUDED_SHOWN, Tick, build_tick, excluded_doc

__all__ = [
    "DEDUPED",
    "DEFAULT_CLUSTER",
    "EXCLUDED_SHOWN",
    "STEADY",
    "AuditRecord",
    "Context",
    "DedupeKey",
    "Deduper",
    "Json",
    "Kind",
    "NewId",
    "Tick",
    "build_tick",
    "cost_record",
    "dedupe_key",
    "episode_record",
    "excluded_doc",
    "fingerprint",
    "jsonable",
    "node_doc",
    "node_overrides",
    "outcome_record",
    "pool_inputs",
    "recovery_intent",
    "to_json",
]
