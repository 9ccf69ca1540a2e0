"""An audit record as a row of ``audit_records`` and as a JSON line, and back from either.

Where it sits: ``sql.SqlAuditStore`` writes ``to_row`` and reads ``from_row``; ``log.AuditLog``
prints each record it stores as a ``json_line``; ``adapters.ledger`` reads back, with
``from_json``, a record kept on a Node while the store failed. A value that does not read back
(a row written by a newer release, or by hand) is an ``UnreadableRecord`` naming the record, the
column and the value, never a record with a guess in it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

import sqlalchemy as sa

from rebalancer.adapters.audit import errors, schema
from rebalancer.core import audit, model
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.outcomes import Outcome

E = TypeVar("E", bound=StrEnum)


def to_row(r: AuditRecord) -> dict[str, Any]:
    doc = audit.to_json(r)
    doc["time"] = r.time
    return doc


def _optional(kind: type[E], row: sa.RowMapping | Mapping[str, Any], column: str) -> E | None:
    """A column read back into its vocabulary; a value outside it (a row written by a newer
    version, or by hand) is an error naming the record, the column and the value."""
    value = row[column]
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        known = ", ".join(m.value for m in kind)
        raise errors.UnreadableRecord(
            f"audit record {row['id']}: {column}={value!r} is not one of {known}"
        ) from None


def from_row(row: sa.RowMapping | Mapping[str, Any]) -> AuditRecord:
    """A record from a row of the table (a ``RowMapping``) or a dict of the same columns."""
    return AuditRecord(
        id=row["id"],
        time=row["time"],
        kind=Kind(row["kind"]),
        controller=row["controller"],
        term=row["term"],
        pool=row["pool"],
        node=row["node"],
        action=_optional(model.Action, row, "action"),
        origin=_optional(model.Origin, row, "origin"),
        reason=row["reason"],
        message=row["message"],
        count=row["count"],
        strategy=row["strategy"],
        params=row["params"],
        inputs=row["inputs"],
        before=row["before"],
        after=row["after"],
        pods=tuple(row["pods"]),
        dry_run=bool(row["dry_run"]),
        error=row["error"],
        outcome=_optional(Outcome, row, "outcome"),
        intent_id=row["intent_id"],
        detail=row["detail"],
        cluster=row["cluster"],
    )


def json_line(record: AuditRecord) -> str:
    return json.dumps(audit.to_json(record), sort_keys=True, separators=(",", ":"))


def from_json(doc: Mapping[str, Any]) -> AuditRecord:
    """A record back from its JSON form (``core.audit.to_json``, a ``json_line``): how a record
    kept on a Node while the store failed is read back (``adapters.ledger``). Raises
    ``UnreadableRecord`` naming what is wrong."""
    try:
        when = datetime.fromisoformat(str(doc["time"]).replace("Z", "+00:00"))
        row = {**{c.name: None for c in schema.records.columns}, **doc, "time": when}
        row["pods"] = row["pods"] or ()
        for column in ("params", "inputs", "detail"):
            row[column] = row[column] or {}
        return from_row(row)
    except (KeyError, TypeError, ValueError) as exc:
        raise errors.UnreadableRecord(f"audit record {doc.get('id')!r}: {exc}") from None
