"""``rebalancer audit``: the audit records, newest first; ``--follow`` to watch new ones come.

Where it sits: an operator's read of the store ``rebalancer run`` writes (``adapters.audit``).
The flags are read by the HTTP API's parser (``runtime.http.parse_query``), so the command and
``GET /api/v1/audit`` ask the same questions; this module prints the answer as a table, JSON
lines or YAML documents.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

from rebalancer import errors
from rebalancer.cli import common
from rebalancer.core import audit, model
from rebalancer.errors import ConfigError
from rebalancer.settings import Settings

if TYPE_CHECKING:  # the adapters are imported by the handler, not at start
    from rebalancer.adapters.audit import AuditQuery


def register(commands: Any) -> None:
    """`rebalancer audit`: its flags and handler."""
    show = common.command_parser(
        commands,
        "audit",
        help="show audit records, newest first; --follow to watch new ones come",
        description="Read the audit store the settings name (audit.url, or "
        "REBALANCER_AUDIT__URL): the newest --limit records that match, newest first. With "
        "--follow, those oldest first, then each new record as it is committed, until Ctrl-C. "
        "A TIME is RFC 3339 (2026-03-02T12:00:00Z) or a time ago (30m, 2h, 7d, 1h30m).",
    )
    common.controller_flags(show, kube=False)
    show.add_argument("--since", metavar="TIME", help="records at or after TIME")
    show.add_argument("--until", metavar="TIME", help="records before TIME")
    show.add_argument(
        "--cluster", help="only this cluster's records (a store shared by a fleet); default all"
    )
    show.add_argument("--pool", help="only this pool")
    show.add_argument("--node", help="only this node")
    show.add_argument("--action", help=f"only this action: {', '.join(model.Action)}")
    show.add_argument(
        "--kind",
        action="append",
        help=f"only this kind: {', '.join(audit.Kind)} (repeatable, or comma-separated)",
    )
    show.add_argument("--limit", type=int, default=100, help="at most this many records (100)")
    show.add_argument(
        "--oldest-first",
        action="store_true",
        help="the oldest --limit records (from --since on), oldest first",
    )
    show.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="then print each new record as it is committed, until Ctrl-C",
    )
    show.add_argument(
        "--interval", default="2s", help="with --follow: time between reads of the store (2s)"
    )
    common.output_flag(show, "json: one object per line; yaml: one document per record")
    show.set_defaults(handler=handle)


COLUMNS = ("time", "cluster", "kind", "pool", "node", "action", "origin", "result", "message")


def handle(args: argparse.Namespace) -> int:
    import asyncio
    from datetime import UTC, datetime

    from rebalancer.adapters import audit as audit_store
    from rebalancer.runtime import wiring

    config = common.load_settings(args)
    query = audit_query(args, datetime.now(UTC))
    interval = common.duration("--interval", args.interval)
    if args.follow and query.until is not None:
        raise ConfigError(f"--until={args.until!r}: --follow runs until Ctrl-C; leave one out")
    _audit_store_exists(config)
    view = AuditView(sys.stdout, args.output)

    async def go() -> int:
        store = await wiring.open_audit_store(config)
        try:
            if not args.follow:
                view.show((await store.query(query)).records)
                return 0
            tail = audit_store.Tail(query)
            view.show(await tail.first(store))
            while True:
                await asyncio.sleep(interval)
                view.show(await tail.more(store))
        finally:
            await store.close()

    try:
        return asyncio.run(go())
    except KeyboardInterrupt:  # how --follow ends; asyncio.run has closed the store
        return 0


def audit_query(args: argparse.Namespace, now: datetime) -> AuditQuery:
    """The query ``rebalancer audit``'s flags ask for, read by the HTTP API's parser (the same
    values, the same checks); a bad flag is a ``ConfigError`` naming it and its value."""
    from dataclasses import replace

    from rebalancer.runtime import http

    given = {
        "since": args.since,
        "until": args.until,
        "cluster": args.cluster,
        "pool": args.pool,
        "node": args.node,
        "action": args.action,
    }
    params = {name: [value] for name, value in given.items() if value is not None}
    if args.kind:
        params["kind"] = args.kind
    try:
        query = http.parse_query(params, now)
    except http.BadParameter as exc:
        why = exc.message.replace("after since", "after --since")
        raise ConfigError(f"--{exc.parameter}={errors.shown(exc.value)}: {why}") from None
    if args.limit < 1:
        raise ConfigError(f"--limit={args.limit}: must be at least 1")
    return replace(query, limit=args.limit, newest_first=not args.oldest_first)


def _audit_store_exists(config: Settings) -> None:
    """Refuse to read a SQLite store that is not there: opening it would make an empty one, and
    an empty table would say "nothing happened" where the truth is "wrong file"."""
    from rebalancer import settings
    from rebalancer.adapters import audit as audit_store

    path = audit_store.sqlite_file(config.audit.url)
    if path is None or path.exists():
        return
    variable = f"{settings.ENV_PREFIX}AUDIT__URL"
    if "url" not in config.audit.model_fields_set:
        raise ConfigError(
            f"no audit store to read: audit.url is not set and the default, {path}, does not "
            f"exist here; set audit.url in the --config file or {variable} to the controller's"
        )
    raise ConfigError(
        f"audit.url names {path}, which does not exist: no audit store to read there; set "
        f"audit.url (or {variable}) to the controller's"
    )


@dataclass
class AuditView:
    """Records as a table (columns as wide as the first records need), JSON lines or YAML
    documents."""

    out: TextIO
    output: str = "text"
    widths: list[int] | None = None

    def show(self, records: Sequence[audit.AuditRecord]) -> None:
        import json

        from rebalancer.adapters.audit import json_line

        if self.output == "json":
            for record in records:
                print(json_line(record), file=self.out)
            self.out.flush()
            return
        if self.output == "yaml":
            docs = [json.loads(json_line(record)) for record in records]
            for text in common.documents(docs, "yaml"):
                print(text, file=self.out)
            self.out.flush()
            return
        rows = [audit_row(r) for r in records]
        if self.widths is None:
            self.widths = [
                max([len(c)] + [len(row[i]) for row in rows]) for i, c in enumerate(COLUMNS)
            ]
            rows.insert(0, COLUMNS)
        for row in rows:
            line = "  ".join(v.ljust(w) for v, w in zip(row, self.widths, strict=True))
            print(line.rstrip(), file=self.out)
        self.out.flush()


def audit_row(r: audit.AuditRecord) -> tuple[str, ...]:
    return (
        r.time.isoformat(timespec="seconds"),
        r.cluster,
        r.kind.value,
        r.pool,
        r.node or "-",
        r.action or "-",
        r.origin or "-",
        r.outcome or r.reason,
        r.message,
    )
