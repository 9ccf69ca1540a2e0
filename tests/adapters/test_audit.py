"""The audit log against real databases: SQLite in a temp file and a PostgreSQL started here.

Every store test runs on both backends. PostgreSQL comes from ``tests/support/postgres.py``
(initdb + pg_ctl in a temporary directory, one server per session, a fresh database per test);
when it cannot be started the tests fail and say what is missing.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from rebalancer.adapters import writer
from rebalancer.adapters.audit import (
    LATE,
    MIGRATIONS,
    SCHEMA_VERSION,
    AuditLog,
    AuditQuery,
    AuditStore,
    Cursor,
    MemoryAuditStore,
    NewerSchema,
    SqlAuditStore,
    Tail,
    UlidFactory,
    UnopenedStore,
    UnreadableRecord,
    json_line,
    migrate,
    schema_version,
    sqlite_file,
)
from rebalancer.adapters.audit import records as audit_records
from rebalancer.core import audit, model, nodestate
from rebalancer.core.audit import AuditRecord, Context, Deduper, Kind
from rebalancer.core.outcomes import ActionResult, Outcome, Write, WriteKind, WriteOutcome
from rebalancer.errors import StoreFailed
from tests.support import factories as f
from tests.support.factories import audit_record
from tests.support.postgres import PostgresServer

CTX = Context(controller="rebalancer-0", term=3, strategy="forecast", params={"safety": 0.15})
POLICY = f.policy()


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(params=["sqlite", "postgres"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'audit' / 'audit.sqlite3'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return await server.create_database(f"audit_{uuid.uuid4().hex[:12]}")


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[SqlAuditStore]:
    opened = await SqlAuditStore.open(db_url)
    try:
        yield opened
    finally:
        await opened.close()


class Lines:
    """A sink that keeps the JSON lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)

    @property
    def docs(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.lines]


def tick(
    nodes: Sequence[model.NodeView],
    *,
    target: int | None,
    rps: float | None = 0.0,
    age: timedelta = timedelta(seconds=30),
    now: datetime = f.T0,
    ids: UlidFactory | None = None,
) -> tuple[model.Snapshot, audit.Tick]:
    sample = None if rps is None else f.demand(rps, age, now)
    snapshot = model.Snapshot(now=now, pools={f.POOL: f.pool_snapshot(nodes, sample)})
    proposals = {} if target is None else {f.POOL: f.proposal(target)}
    plan = f.planned(snapshot, proposals, {f.POOL: POLICY})
    built = audit.build_tick(
        plan, snapshot, CTX, ids or UlidFactory(), proposals, {f.POOL: POLICY}, f.KEYS
    )
    return snapshot, built


def lend_result(node: model.NodeView, decision: str) -> ActionResult:
    """What the actuator reports for a complete lend, with the exact bodies it would send."""
    begin = nodestate.begin_lend(node, f.LEND_SPEC, f.KEYS, f.T0, decision)
    lending = nodestate.apply(node, begin)
    state = nodestate.read(lending, f.KEYS)
    assert isinstance(state, nodestate.NodeState)
    finish = nodestate.finish_lend(f.LEND_SPEC, state, f.KEYS, f.T0)
    target = f"node/{node.name}"
    return ActionResult(
        node=str(node.name),
        action=model.Action.LEND,
        outcome=Outcome.APPLIED,
        message="lent",
        writes=(
            Write(
                WriteKind.BEGIN_LEND, target, writer.merge_patch(begin, "7"), WriteOutcome.APPLIED
            ),
            Write(
                WriteKind.FINISH_LEND, target, writer.merge_patch(finish, "8"), WriteOutcome.APPLIED
            ),
        ),
    )


# ---------------------------------------------------------------------------------------------
# Intent, then outcome


async def test_intent_is_stored_before_the_outcome_and_both_are_readable(
    store: SqlAuditStore,
) -> None:
    nodes = f.serving_nodes(3)
    _, built = tick(nodes, target=1, rps=5.0)
    lines = Lines()
    log = AuditLog(store, sink=lines)
    written = await log.tick(built.records)
    (intent,) = [r for r in written if r.kind is Kind.INTENT]
    assert (intent.pool, intent.node, intent.action, intent.reason) == (
        "gpu",
        "s-00",
        "lend",
        "strategy",
    )
    assert await store.pending_intents() == (intent,)
    stored = await store.get(intent.id)
    assert stored == intent  # every field survives the round trip, times stay aware UTC
    assert stored.time.tzinfo is not None
    assert stored.inputs["demand"] == {"value": 5.0, "at": "2026-03-02T11:59:30Z"}
    assert stored.inputs["proposal"]["lend_target"] == 1
    assert stored.inputs["window"] == {"text": "always", "open": True}
    assert stored.inputs["overrides"]["lend"] == "auto"
    assert stored.before == audit.node_doc(nodes[0])
    assert (stored.controller, stored.term, stored.strategy) == ("rebalancer-0", 3, "forecast")
    assert stored.params == {"safety": 0.15}

    result = lend_result(nodes[0], intent.id)
    outcome = await log.outcome(intent, result, f.T0 + timedelta(seconds=2))
    assert outcome.kind is Kind.OUTCOME
    assert outcome.outcome == Outcome.APPLIED
    assert outcome.intent_id == intent.id
    assert outcome.error is None
    after = await store.get(outcome.id)
    assert after is not None
    assert after.after is not None
    lent = f.lend(nodes[0])
    assert after.after == audit.node_doc(lent)  # taints and labels as the lend left them
    assert after.detail["writes"][0]["kind"] == "begin_lend"
    assert await store.pending_intents() == ()

    page = await store.query(AuditQuery(node="s-00"))
    assert [r.kind for r in page.records] == [Kind.INTENT, Kind.OUTCOME]
    assert [json.loads(line)["id"] for line in lines.lines] == [r.id for r in (*written, outcome)]


async def test_failed_reclaim_records_the_error_and_the_pods(store: SqlAuditStore) -> None:
    node = f.lend(f.serving("n1"), pods=f.borrowed_pods("bert", "bert"))
    _, built = tick([node, *f.serving_nodes(2)], target=0, rps=5.0)
    log = AuditLog(store, sink=None)
    await log.tick(built.records)
    intent = built.intents[("gpu", "n1", "reclaim")]
    result = ActionResult(
        node="n1",
        action=model.Action.RECLAIM,
        outcome=Outcome.FAILED,
        message="API kept failing: 503",
        writes=(
            Write(WriteKind.BEGIN_RECLAIM, "node/n1", {"metadata": {}}, WriteOutcome.APPLIED),
            Write(WriteKind.EVICT, "pod/ns/bert-worker-0", {}, WriteOutcome.EVICTED),
            Write(WriteKind.EVICT, "pod/ns/bert-worker-1", {}, WriteOutcome.BLOCKED),
        ),
    )
    outcome = await log.outcome(intent, result, f.T0 + timedelta(seconds=5))
    stored = await store.get(outcome.id)
    assert stored is not None
    assert (stored.outcome, stored.error) == ("failed", "API kept failing: 503")
    assert stored.pods == ("ns/bert-worker-0",)  # the blocked one was not evicted
    assert [w["outcome"] for w in stored.detail["writes"]] == ["applied", "evicted", "blocked"]


# ---------------------------------------------------------------------------------------------
# A crash between the intent and the outcome

_CRASHING_CONTROLLER = """
import asyncio, os, sys
from datetime import UTC, datetime
from rebalancer.adapters.audit import AuditLog, SqlAuditStore
from rebalancer.core.audit import AuditRecord, Kind

async def main() -> None:
    store = await SqlAuditStore.open(sys.argv[1])
    intent = AuditRecord(
        id=sys.argv[2], time=datetime(2026, 3, 2, 12, tzinfo=UTC), kind=Kind.INTENT, pool="gpu",
        controller="rebalancer-0", reason="strategy", message="lend 1 node", node="s0",
        action="lend", term=4,
    )
    await AuditLog(store).tick([intent])
    os._exit(9)  # the controller dies before the actuator acts: no close, no dispose, no outcome

asyncio.run(main())
"""


async def test_an_intent_survives_a_crash_before_its_outcome(db_url: str) -> None:
    ident = UlidFactory()()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CRASHING_CONTROLLER,
        db_url,
        ident,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 9, err.decode()
    assert json.loads(out.decode().strip())["id"] == ident  # its stdout line went out too

    store = await SqlAuditStore.open(db_url)
    try:
        intent = await store.get(ident)
        assert intent is not None
        assert (intent.kind, intent.node, intent.term, intent.outcome) == (
            Kind.INTENT,
            "s0",
            4,
            None,
        )
        assert await store.pending_intents() == (intent,)
        log = AuditLog(store, sink=None)
        closing = audit.outcome_record(
            intent, log.new_id, f.T0 + timedelta(minutes=1), Outcome.SUPERSEDED, "restarted"
        )
        await log.tick([closing])
        assert await store.pending_intents() == ()
    finally:
        await store.close()


# ---------------------------------------------------------------------------------------------
# Migrations


@pytest.mark.parametrize("backend", ["sql", "memory"])
async def test_unfinished_intents_are_those_with_no_outcome_but_in_progress(
    store: SqlAuditStore, backend: str
) -> None:
    chosen: SqlAuditStore | MemoryAuditStore = store if backend == "sql" else MemoryAuditStore()
    untouched, draining, done = (
        audit_record(i, f.T0, node="n", kind=Kind.INTENT) for i in ("01A", "01B", "01C")
    )
    passes = [
        audit.outcome_record(draining, lambda: "02A", f.T0, Outcome.IN_PROGRESS, "draining"),
        audit.outcome_record(done, lambda: "02B", f.T0, Outcome.IN_PROGRESS, "draining"),
        audit.outcome_record(done, lambda: "02C", f.T0, Outcome.APPLIED, "serving again"),
    ]
    await chosen.append([untouched, draining, done, *passes])

    assert [r.id for r in await chosen.pending_intents()] == ["01A"]
    assert [r.id for r in await chosen.unfinished_intents()] == ["01A", "01B"]


@pytest.mark.parametrize("backend", ["sql", "memory"])
async def test_the_cost_minutes_of_a_pool_are_read_back_after_a_time(
    store: SqlAuditStore, backend: str
) -> None:
    chosen: SqlAuditStore | MemoryAuditStore = store if backend == "sql" else MemoryAuditStore()
    minute = timedelta(minutes=1)
    stored = [
        audit_record("01A", f.T0, kind=Kind.COST, action=None),
        audit_record("01B", f.T0 + minute, kind=Kind.COST, action=None),
        audit_record("01C", f.T0 + minute, kind=Kind.COST, action=None, pool="other"),
        audit_record("01D", f.T0 + 2 * minute, action=None),  # a refusal: no cost
        audit_record("01E", f.T0 + 3 * minute, kind=Kind.COST, action=None),
    ]
    await chosen.append(stored)
    trail = AuditLog(chosen, sink=None)
    assert await trail.cost_minutes("gpu", f.T0) == (
        f.T0 + minute,
        f.T0 + 3 * minute,
    )  # after since
    assert await trail.cost_minutes("gpu", f.T0 - minute) == (
        f.T0,
        f.T0 + minute,
        f.T0 + 3 * minute,
    )
    assert await trail.cost_minutes("other", f.T0) == (f.T0 + minute,)


async def test_migrations_are_idempotent(db_url: str) -> None:
    first = await SqlAuditStore.open(db_url)
    try:
        assert await first.schema_versions() == [1, 2]
        await first.append([audit_record("01A", f.T0)])
        if db_url.startswith("postgresql"):
            async with first.engine.connect() as conn:
                types = await conn.execute(
                    sa.text(
                        "SELECT column_name, data_type FROM information_schema.columns "
                        "WHERE table_name = 'audit_records' AND data_type IN "
                        "('jsonb', 'timestamp with time zone')"
                    )
                )
                found: dict[str, str] = {str(k): str(v) for k, v in types.all()}
            assert found == {
                **dict.fromkeys(["params", "inputs", "before", "after", "pods", "detail"], "jsonb"),
                "time": "timestamp with time zone",
            }
    finally:
        await first.close()
    for _ in range(2):
        again = await SqlAuditStore.open(db_url)
        try:
            assert await again.schema_versions() == [1, 2]
            page = await again.query(AuditQuery())
            assert [r.id for r in page.records] == ["01A"]
        finally:
            await again.close()


async def test_a_newer_schema_is_refused_in_one_line_and_left_as_it_is(
    store: SqlAuditStore, db_url: str
) -> None:
    # A downgrade: a newer release migrated the store to version 99 and wrote a row.
    await store.append([audit_record("01A", f.T0)])
    async with store.engine.begin() as conn:
        await conn.execute(
            schema_version.insert().values(version=99, description="future", applied_at=f.T0)
        )
    with pytest.raises(NewerSchema) as refused:
        await SqlAuditStore.open(db_url)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"audit.url={sa.make_url(db_url).render_as_string()!r}: ")
    assert "schema version 99, newer than version 2 that this release reads" in message
    assert (refused.value.found, refused.value.reads) == (99, SCHEMA_VERSION)
    # Nothing was touched: the versions and the row are as the newer release left them.
    assert await store.schema_versions() == [1, 2, 99]
    assert [r.id for r in (await store.query(AuditQuery())).records] == ["01A"]


async def test_a_sqlite_store_whose_shm_file_cannot_be_written_is_refused_naming_the_file(
    tmp_path: Path,
) -> None:
    # An immutable -shm file: SQLite maps it into every connection, and one it cannot write
    # can end the process with SIGBUS. The kernel refuses the write even to root.
    url = f"sqlite+aiosqlite:///{tmp_path / 'audit.sqlite3'}"
    store = await SqlAuditStore.open(url)
    await store.append([audit_record("01A", f.T0)])
    await store.close()
    shm = tmp_path / "audit.sqlite3-shm"
    shm.touch()
    subprocess.run(["chattr", "+i", str(shm)], check=True)
    try:
        with pytest.raises(UnopenedStore) as refused:
            await SqlAuditStore.open(url)
    finally:
        subprocess.run(["chattr", "-i", str(shm)], check=True)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"audit.url={url!r}: cannot write {shm} (immutable, ")
    again = await SqlAuditStore.open(url)  # writable again: the store and its row are there
    try:
        assert [r.id for r in (await again.query(AuditQuery())).records] == ["01A"]
    finally:
        await again.close()


async def test_replicas_starting_together_migrate_once(postgres_server: PostgresServer) -> None:
    # One controller per SQLite file; several replicas share a PostgreSQL: the advisory lock
    # makes them migrate one after the other.
    url = await postgres_server.create_database(f"audit_{uuid.uuid4().hex[:12]}")
    stores = await asyncio.gather(*(SqlAuditStore.open(url) for _ in range(4)))
    try:
        assert await stores[0].schema_versions() == [1, 2]
    finally:
        for s in stores:
            await s.close()


async def version_1_database(url: str, rows: Sequence[AuditRecord]) -> None:
    """A store as the program before schema version 2 left it, holding ``rows``."""
    made = sa.make_url(url)
    if made.get_backend_name() == "sqlite":
        Path(made.database or "").parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(made)
    try:
        async with engine.begin() as conn:
            assert await conn.run_sync(migrate, f.T0, MIGRATIONS[:1]) == [1]
            # the version 1 columns only: every field but the cluster
            old = [{k: v for k, v in audit.to_json(r).items() if k != "cluster"} for r in rows]
            await conn.execute(
                audit_records.insert(),
                [d | {"time": r.time} for d, r in zip(old, rows, strict=True)],
            )
    finally:
        await engine.dispose()


async def test_a_version_1_store_is_migrated_and_its_rows_are_the_default_cluster_s(
    db_url: str,
) -> None:
    minute = timedelta(minutes=1)
    old = [
        audit_record("01A", f.T0, node="n1", kind=Kind.INTENT),  # open: a restart must judge it
        audit_record("01B", f.T0 + minute, kind=Kind.COST, action=None),
        audit_record("01C", f.T0 + 2 * minute, node="n2"),
    ]
    await version_1_database(db_url, old)

    store = await SqlAuditStore.open(db_url)
    try:
        assert await store.schema_versions() == [1, 2]
        page = await store.query(AuditQuery())
        assert page.records == tuple(old)  # every field as written, the cluster the default
        assert {r.cluster for r in page.records} == {"default"}
        # Upgraded in place and still unnamed, the controller reads its own history back.
        unnamed = AuditLog(store, sink=None)
        assert await unnamed.pending_intents() == (old[0],)
        assert await unnamed.cost_minutes("gpu", f.T0) == (f.T0 + minute,)
        assert await unnamed.get("01A") == old[0]
        # Named, it starts a history of its own: the old rows are not its.
        named = AuditLog(store, sink=None, cluster="prod-eu")
        assert await named.pending_intents() == ()
        assert await named.cost_minutes("gpu", f.T0) == ()
        assert await named.get("01A") is None
        written = await named.tick([audit_record("01D", f.T0 + 3 * minute, node="n1")])
        assert [r.cluster for r in written] == ["prod-eu"]
        assert await store.get("01D") == written[0]

        async with store.engine.connect() as conn:
            indexes = await conn.run_sync(lambda c: sa.inspect(c).get_indexes("audit_records"))
        by_name = {i["name"]: i["column_names"] for i in indexes}
        assert by_name["audit_records_cluster"] == ["cluster", "time", "id"]
        assert {"audit_records_time", "audit_records_pool", "audit_records_node"} <= set(by_name)
    finally:
        await store.close()
    again = await SqlAuditStore.open(db_url)  # migrated once: opening again changes nothing
    try:
        assert await again.schema_versions() == [1, 2]
        assert len((await again.query(AuditQuery())).records) == 4
    finally:
        await again.close()


async def test_two_clusters_writing_to_one_store_are_told_apart(db_url: str) -> None:
    """Two controllers, each of its own cluster, with the same pool and node names."""
    eu_lines, us_lines = Lines(), Lines()
    first, second = await SqlAuditStore.open(db_url), await SqlAuditStore.open(db_url)
    try:
        eu = AuditLog(first, sink=eu_lines, cluster="prod-eu")
        us = AuditLog(second, sink=us_lines, cluster="prod-us")
        nodes = f.serving_nodes(3)
        _, eu_tick = tick(nodes, target=1, rps=5.0)
        _, us_tick = tick(nodes, target=1, rps=5.0)
        (eu_intent,) = [r for r in await eu.tick(eu_tick.records) if r.kind is Kind.INTENT]
        (us_intent,) = [r for r in await us.tick(us_tick.records) if r.kind is Kind.INTENT]
        assert (eu_intent.pool, eu_intent.node) == (us_intent.pool, us_intent.node)
        # an outcome built from the tick's own intent (as the runtime does) is its log's too
        built = eu_tick.intents[("gpu", "s-00", "lend")]
        assert built.cluster == "default"  # records are built without one
        done = await eu.outcome(
            built, lend_result(nodes[0], eu_intent.id), f.T0 + timedelta(seconds=2)
        )
        assert done.cluster == "prod-eu"

        assert await eu.pending_intents() == ()
        assert await us.pending_intents() == (us_intent,)
        assert await eu.get(us_intent.id) is None
        assert await us.get(us_intent.id) == us_intent
        both = await first.query(AuditQuery(node="s-00"))
        # one tick's time: the two intents' order is their random ids'
        assert sorted((r.cluster, r.kind) for r in both.records) == [
            ("prod-eu", Kind.INTENT),
            ("prod-eu", Kind.OUTCOME),
            ("prod-us", Kind.INTENT),
        ]
        only_us = await first.query(AuditQuery(cluster="prod-us"))
        assert [r.id for r in only_us.records] == [us_intent.id]
        assert {d["cluster"] for d in eu_lines.docs} == {"prod-eu"}
        assert {d["cluster"] for d in us_lines.docs} == {"prod-us"}
    finally:
        await first.close()
        await second.close()


# ---------------------------------------------------------------------------------------------
# Queries


def _corpus() -> list[AuditRecord]:
    """30 records: two clusters, two pools, three nodes, two actions, several sharing a time."""
    ids = UlidFactory(clock=lambda: f.T0)
    out = []
    for i in range(30):
        when = f.T0 + timedelta(minutes=i // 3)  # three records per minute: ties broken by id
        out.append(
            audit_record(
                ids(),
                when,
                pool="gpu" if i % 2 == 0 else "cpu",
                node=f"n{i % 3}",
                action="lend" if i % 5 else "reclaim",
                kind=Kind.INTENT if i % 4 == 0 else Kind.REFUSAL,
                cluster="prod-eu" if i % 7 < 4 else "prod-us",
            )
        )
    return out


async def _all_pages(s: AuditStore, query: AuditQuery) -> list[AuditRecord]:
    found: list[AuditRecord] = []
    cursor: Cursor | None = None
    while True:
        page = await s.query(replace(query, after=cursor))
        assert len(page.records) <= query.limit
        found.extend(page.records)
        if page.next is None:
            return found
        cursor = Cursor.parse(page.next.token)  # the text form a reader would pass back


@pytest.mark.parametrize(
    "query",
    [
        AuditQuery(limit=4),
        AuditQuery(limit=7, newest_first=True),
        AuditQuery(pool="cpu", limit=3),
        AuditQuery(node="n1", action="lend", limit=2),
        AuditQuery(action="reclaim", limit=100),
        AuditQuery(kinds=(Kind.INTENT,), pool="gpu", limit=1),
        AuditQuery(cluster="prod-us", limit=3),
        AuditQuery(cluster="prod-eu", node="n2", newest_first=True, limit=2),
        AuditQuery(since=f.T0 + timedelta(minutes=2), until=f.T0 + timedelta(minutes=5), limit=4),
    ],
    ids=[
        "all",
        "newest-first",
        "pool",
        "node-action",
        "action",
        "kind",
        "cluster",
        "cluster-node",
        "time-range",
    ],
)
async def test_filters_and_keyset_pages(store: SqlAuditStore, query: AuditQuery) -> None:
    corpus = _corpus()
    await store.append(corpus[:13])
    await store.append(corpus[13:])
    expected = sorted(
        (r for r in corpus if query.matches(r)),
        key=lambda r: (r.time, r.id),
        reverse=query.newest_first,
    )
    assert expected, "the query should match something"
    got = await _all_pages(store, query)
    assert [r.id for r in got] == [r.id for r in expected]
    assert got == expected  # whole records, not only ids
    fake = MemoryAuditStore()
    await fake.append(corpus)
    assert [r.id for r in await _all_pages(fake, query)] == [r.id for r in expected]


async def test_a_tail_shows_each_record_once_even_one_committed_behind_a_later_one(
    store: SqlAuditStore,
) -> None:
    def at(ident: str, seconds: float, **rest: Any) -> AuditRecord:
        return audit_record(ident, f.T0 + timedelta(seconds=seconds), pool="l20", **rest)

    await store.append([at("01A", 0), at("01B", 10), at("01C", 20), at("01D", 20), at("01Z", 1)])
    await store.append([at("01X", 30, node="n1")])
    await store.append([replace(at("01Y", 31), pool="a100")])  # another pool's: never shown
    tail = Tail(AuditQuery(pool="l20", limit=3))

    first = await tail.first(store)
    assert [r.id for r in first] == ["01C", "01D", "01X"]  # the newest three, oldest first
    assert await tail.more(store) == []  # nothing new: nothing shown twice

    # The same second as one shown, and one committed after a later one was shown (an intent
    # carries its tick's time; two writers commit in any order); 01Z (1 s) is older than
    # anything ``first`` showed and was left out by the limit, so it stays out.
    await store.append([at("01E", 30), at("01F", 45)])
    assert [r.id for r in await tail.more(store)] == ["01E", "01F"]
    await store.append([at("01G", 40)])  # behind 01F, shown already
    await store.append([at("01H", 45)])  # the same instant as 01F, a later id
    assert [r.id for r in await tail.more(store)] == ["01G", "01H"]
    assert await tail.more(store) == []

    # Later than LATE behind the newest shown is not looked for again (nor kept in memory).
    await store.append([at("01J", 45 + LATE.total_seconds() + 60)])
    assert [r.id for r in await tail.more(store)] == ["01J"]
    await store.append([at("01K", 44)])
    assert await tail.more(store) == []


async def test_a_tail_of_nothing_yet_shows_every_record_that_comes() -> None:
    fake = MemoryAuditStore()
    tail = Tail(AuditQuery(kinds=(Kind.INTENT,), limit=1))
    assert await tail.first(fake) == []
    await fake.append([audit_record("01B", f.T0, kind=Kind.INTENT)])
    await fake.append([audit_record("01A", f.T0 - timedelta(hours=1), kind=Kind.INTENT)])
    await fake.append([audit_record("01C", f.T0, kind=Kind.OUTCOME)])
    assert [r.id for r in await tail.more(fake)] == ["01A", "01B"]
    assert await tail.more(fake) == []


def test_a_sqlite_url_names_its_file_and_no_other_does() -> None:
    assert sqlite_file("sqlite+aiosqlite:////var/lib/a.db") == Path("/var/lib/a.db")
    assert sqlite_file("sqlite+aiosqlite:///a.db") == Path("a.db")
    assert sqlite_file("sqlite+aiosqlite://") is None  # in memory
    assert sqlite_file("sqlite+aiosqlite:///:memory:") is None
    assert sqlite_file("postgresql+asyncpg://u@h/db") is None
    assert sqlite_file("not a url") is None


def test_ids_sort_by_time_then_by_creation() -> None:
    now = [f.T0]
    ids = UlidFactory(clock=lambda: now[0])
    same_ms = [ids() for _ in range(50)]
    assert same_ms == sorted(same_ms)
    assert len(set(same_ms)) == 50
    now[0] = f.T0 + timedelta(milliseconds=1)
    later = ids()
    now[0] = f.T0 - timedelta(seconds=1)  # the clock steps back: still increasing
    stepped_back = ids()
    assert same_ms[-1] < later < stepped_back
    assert all(len(i) == 26 for i in (*same_ms, later))
    assert UlidFactory(clock=lambda: f.T0)() < UlidFactory(clock=lambda: f.T0 + timedelta(1))()


# ---------------------------------------------------------------------------------------------
# Dedupe of a steady state


async def test_a_steady_refusal_is_written_once_until_something_changes(
    store: SqlAuditStore,
) -> None:
    ids = UlidFactory()
    log = AuditLog(store, sink=None, deduper=Deduper(repeat_after=timedelta(hours=1)), new_id=ids)
    nodes = f.serving_nodes(4)
    stale = timedelta(minutes=3)  # past staleness, within the grace: no lending, no reclaim

    async def run(minute: int, target: int | None, age: timedelta = stale) -> list[str]:
        now = f.T0 + timedelta(minutes=minute)
        _, built = tick(nodes, target=target, rps=5.0, age=age + timedelta(seconds=minute), now=now)
        return [f"{r.kind}:{r.reason}:{r.count}" for r in await log.tick(built.records)]

    first = await run(0, target=2)
    assert first == ["refusal:metrics_stale:2", "summary:metrics_stale:0"]
    # Ten more ticks: the messages differ (the sample's age moves), the decision does not.
    for minute in range(1, 11):
        assert await run(minute, target=2) == []
    # Something changes: the strategy wants 3. The refusal is new, and so is the summary.
    assert await run(11, target=3) == ["refusal:metrics_stale:3", "summary:metrics_stale:0"]
    assert await run(12, target=3) == []
    # The refusal goes away for a tick (no proposal), then comes back: written again.
    assert await run(13, target=None) == ["summary:steady:0"]
    assert await run(14, target=3) == ["refusal:metrics_stale:3", "summary:metrics_stale:0"]
    # A steady state still leaves one record per key per hour.
    assert await run(14 + 59, target=3) == []
    assert await run(14 + 60, target=3) == ["refusal:metrics_stale:3", "summary:metrics_stale:0"]
    # A decision for the pool (fresh metrics: one lend) resets what was remembered.
    acted = await run(75, target=1, age=timedelta(seconds=0))
    assert [a.split(":")[0] for a in acted] == ["intent"]
    assert await run(76, target=3) == ["refusal:metrics_stale:3", "summary:metrics_stale:0"]

    page = await store.query(AuditQuery(kinds=(Kind.REFUSAL,), limit=100))
    assert len(page.records) == 5  # out of 17 ticks that refused


def test_two_refusals_under_one_key_do_not_flap() -> None:
    deduper = Deduper()
    a = replace(audit_record("A", f.T0), count=1, origin=model.Origin.STRATEGY)
    # the same kind, pool, node and reason
    b = replace(audit_record("B", f.T0), count=2, origin=model.Origin.OPERATOR)
    assert deduper.select([a, b]) == [a, b]
    deduper.commit([a, b], [a, b])
    # The strategy's sentence in the refused intent carries live numbers: it is no change.
    a = replace(a, detail={"intent": {"count": 1, "message": "forecast 12.5 rps"}})
    assert deduper.select([a]) == [a]
    deduper.commit([a, b], [a])
    a = replace(a, detail={"intent": {"count": 1, "message": "forecast 13.1 rps"}})
    for minute in range(1, 4):
        later = [
            replace(r, id=f"{r.id}{minute}", time=f.T0 + timedelta(minutes=minute)) for r in (a, b)
        ]
        assert deduper.select(later) == []
        deduper.commit(later, [])


# ---------------------------------------------------------------------------------------------
# One JSON line per record on stdout


async def test_one_json_line_per_stored_record_on_stdout(
    store: SqlAuditStore, capsys: pytest.CaptureFixture[str]
) -> None:
    _, built = tick(f.serving_nodes(3), target=1, rps=5.0)
    written = await AuditLog(store).tick(built.records)  # the default sink: stdout
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(written) == 1 + 0  # one intent, no refusal, no summary
    docs = [json.loads(line) for line in lines]
    assert docs == [audit.to_json(r) for r in written]
    assert set(docs[0]) == {
        "id", "time", "cluster", "kind", "controller", "term", "pool", "node", "action", "origin",
        "reason", "message", "count", "strategy", "params", "inputs", "before", "after",
        "pods", "dry_run", "error", "outcome", "intent_id", "detail",
    }  # fmt: skip
    assert docs[0]["time"] == "2026-03-02T12:00:00Z"
    stored = await store.get(written[0].id)
    assert stored is not None
    assert json_line(stored) == lines[0]


async def test_nothing_reaches_stdout_when_the_store_fails() -> None:
    fake = MemoryAuditStore()
    fake.fail_next = OSError("disk full")
    lines = Lines()
    log = AuditLog(fake, sink=lines)
    _, built = tick(f.serving_nodes(3), target=1, rps=5.0)
    with pytest.raises(StoreFailed, match="OSError: disk full") as failed:
        await log.tick(built.records)
    assert isinstance(failed.value.__cause__, OSError), "raised from the store's own error"
    assert log.failing == "OSError: disk full"
    assert lines.lines == []
    assert fake.records == []
    # The dedupe memory did not move either: the next attempt writes everything.
    assert len(await log.tick(built.records)) == len(built.records)
    assert len(lines.docs) == len(built.records)


async def test_a_bug_on_the_way_to_the_store_goes_up_as_it_is_and_says_nothing_of_the_store() -> (
    None
):
    fake = MemoryAuditStore()
    log = AuditLog(fake, sink=None)
    _, built = tick(f.serving_nodes(3), target=1, rps=5.0)
    fake.fail_next = TypeError("a record this store cannot encode")
    with pytest.raises(TypeError, match="cannot encode"):
        await log.tick(built.records)
    assert log.failing is None
    intent = built.records[0]
    result = ActionResult(str(intent.node), model.Action.LEND, Outcome.APPLIED, "lent")
    fake.fail_next = TypeError("an outcome this store cannot encode")
    with pytest.raises(TypeError, match="cannot encode"):
        await log.outcome(intent, result, f.T0)
    assert (log.failing, log.spool) == (None, []), "not kept as if the store had failed"


def test_times_are_aware_utc() -> None:
    when = datetime(2026, 3, 2, 13, 0, tzinfo=UTC)
    assert audit.to_json(audit_record("X", when))["time"] == "2026-03-02T13:00:00Z"


async def test_a_stored_value_outside_the_vocabulary_is_an_error_naming_record_and_column(
    store: SqlAuditStore,
) -> None:
    await store.append([audit_record("01J0000000000000000000TELE", f.T0)])
    async with store.engine.begin() as conn:  # a row written by a newer version, or by hand
        await conn.execute(sa.update(audit_records).values(action="teleport"))
    with pytest.raises(UnreadableRecord) as raised:
        await store.get("01J0000000000000000000TELE")
    assert str(raised.value) == (
        "audit record 01J0000000000000000000TELE: action='teleport' is not one of "
        "lend, reclaim, withdraw, progress, rollback"
    )
