"""``rebalancer audit`` on a real SQLite store: newest first, times given as a time ago, every
filter, one line per bad flag, no store made where none is configured, and ``--follow`` run as a
process while records are written (then Ctrl-C)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rebalancer import cli
from rebalancer.adapters.audit import SCHEMA_VERSION, SqlAuditStore, schema_version
from rebalancer.core.audit import AuditRecord, Kind
from tests.support.factories import audit_record
from tests.support.processes import ROOT, child_env, run_cli


def ago(ident: str, minutes: float, now: datetime | None = None, **rest: Any) -> AuditRecord:
    """A record ``minutes`` before ``now`` (the wall clock when None)."""
    now = now or datetime.now(UTC).replace(microsecond=0)
    return audit_record(ident, now - timedelta(minutes=minutes), **rest)


def records(now: datetime) -> tuple[AuditRecord, ...]:
    """Oldest to newest, counted back from ``now``; two share an instant (one tick): they come
    in id order. Made when a test starts, not when the module is read: a time ago counts back
    from the wall clock, and a long suite must not move the records across a bound."""
    return (
        ago("01A", 600, now, pool="l20", node="n1", kind=Kind.INTENT),
        ago("01B", 180, now, pool="l20", node="n1", kind=Kind.OUTCOME),
        ago("01C", 90, now, pool="a100", node="t1", action="reclaim", kind=Kind.INTENT),
        ago("01D", 90, now, pool="l20", node=None, action=None, kind=Kind.SUMMARY),
        ago("01E", 30, now, pool="l20", node="n2", action="reclaim", kind=Kind.INTENT),
        ago("01F", 5, now, pool="l20", node="n2", action="reclaim", kind=Kind.OUTCOME),
    )


@dataclass(frozen=True)
class At:
    """An absolute time flag: ``minutes`` before the records' ``now``, in ``form``."""

    minutes: int
    form: str = "iso"  # or "Z": 2026-03-02T12:00:00Z

    def text(self, now: datetime) -> str:
        when = now - timedelta(minutes=self.minutes)
        return when.isoformat() if self.form == "iso" else when.strftime("%Y-%m-%dT%H:%M:%SZ")


def seed(url: str, records: Sequence[AuditRecord]) -> None:
    async def go() -> None:
        store = await SqlAuditStore.open(url)
        try:
            await store.append(records)
        finally:
            await store.close()

    asyncio.run(go())


@pytest.fixture
def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
def config(tmp_path: Path, now: datetime) -> Path:
    url = f"sqlite+aiosqlite:///{tmp_path / 'audit.sqlite3'}"
    seed(url, records(now))
    path = tmp_path / "config.yaml"
    path.write_text(f"audit:\n  url: {url}\n", encoding="utf-8")
    return path


def ids(config: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> list[str]:
    assert cli.main(["audit", "--json", "--config", str(config), *flags]) == 0
    return [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()]


def test_audit_shows_the_newest_first_unless_asked_for_the_oldest(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ids(config, capsys) == ["01F", "01E", "01D", "01C", "01B", "01A"]
    assert ids(config, capsys, "--limit", "2") == ["01F", "01E"]
    assert ids(config, capsys, "--oldest-first", "--limit", "2") == ["01A", "01B"]

    assert cli.main(["audit", "--config", str(config), "--limit", "3"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == [
        "time", "cluster", "kind", "pool", "node", "action", "origin", "result", "message"
    ]  # fmt: skip
    assert [row.split()[-1] for row in table[1:]] == ["01F", "01E", "01D"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--since", "2h"], ["01F", "01E", "01D", "01C"]),
        (["--since", "100m", "--until", "10m"], ["01E", "01D", "01C"]),
        (["--since", "1h31m"], ["01F", "01E", "01D", "01C"]),
        (["--until", "1d"], []),
        (["--since", "7d", "--until", "3h"], ["01B", "01A"]),
        (["--since", At(31)], ["01F", "01E"]),
        # records at or after since, strictly before until
        (["--since", At(90)], ["01F", "01E", "01D", "01C"]),
        (["--until", At(90, "Z")], ["01B", "01A"]),
    ],
)
def test_audit_since_and_until_take_a_time_or_a_time_ago(
    config: Path,
    now: datetime,
    capsys: pytest.CaptureFixture[str],
    flags: list[str | At],
    expected: list[str],
) -> None:
    given = [f.text(now) if isinstance(f, At) else f for f in flags]
    assert ids(config, capsys, *given) == expected


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--pool", "l20"], ["01F", "01E", "01D", "01B", "01A"]),
        (["--node", "n2"], ["01F", "01E"]),
        (["--action", "reclaim"], ["01F", "01E", "01C"]),
        (["--kind", "intent"], ["01E", "01C", "01A"]),
        (["--kind", "intent,summary"], ["01E", "01D", "01C", "01A"]),
        (["--kind", "outcome", "--kind", "summary"], ["01F", "01D", "01B"]),
        (["--pool", "l20", "--kind", "intent", "--since", "2h"], ["01E"]),
        (["--cluster", "elsewhere"], []),
    ],
)
def test_audit_filters_by_pool_node_action_and_kind(
    config: Path, capsys: pytest.CaptureFixture[str], flags: list[str], expected: list[str]
) -> None:
    assert ids(config, capsys, *flags) == expected


TIMES = "an RFC 3339 date-time with an offset (2026-03-02T12:00:00Z) or a time ago (30m, 2h, 7d)"


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--since", "yesterday"], f"--since='yesterday': must be {TIMES}"),
        (["--until", "2 hours"], f"--until='2 hours': must be {TIMES}"),
        (["--since", "2026-03-02T12:00:00"], f"--since='2026-03-02T12:00:00': must be {TIMES}"),
        (["--since", "36501d"], "--since='36501d': must be at most 100 years ago"),
        (["--since", "1h", "--until", "2h"], "--until='2h': must be after --since"),
        (
            ["--kind", "decision"],
            "--kind='decision': must be one of intent, outcome, refusal, finding, summary, cost",
        ),
        (
            ["--action", "borrow"],
            "--action='borrow': must be one of lend, reclaim, withdraw, progress, rollback",
        ),
        (["--pool", ""], "--pool='': must not be empty"),
        (["--limit", "0"], "--limit=0: must be at least 1"),
        (["--follow", "--until", "1h"], "--until='1h': --follow runs until Ctrl-C; leave one out"),
        (["--follow", "--interval", "0s"], "--interval='0s': must be longer than 0s"),
        (["--since", "x" * 5000], f"--since='{'x' * 79}… (5000 characters): must be {TIMES}"),
    ],
)
def test_a_bad_audit_flag_is_one_line_naming_it(
    config: Path, capsys: pytest.CaptureFixture[str], flags: list[str], line: str
) -> None:
    assert cli.main(["audit", "--config", str(config), *flags]) == 2
    assert capsys.readouterr().err == f"rebalancer: {line}\n"


def test_audit_without_a_store_names_the_setting_and_makes_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # where the default store would be made
    for name in ("REBALANCER_CONFIG", "REBALANCER_AUDIT__URL", "REBALANCER_AUDIT"):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["audit"]) == 2
    assert capsys.readouterr().err == (
        "rebalancer: no audit store to read: audit.url is not set and the default, "
        "rebalancer-audit.sqlite3, does not exist here; set audit.url in the --config file or "
        "REBALANCER_AUDIT__URL to the controller's\n"
    )

    missing = tmp_path / "var" / "audit.db"
    monkeypatch.setenv("REBALANCER_AUDIT__URL", f"sqlite+aiosqlite:///{missing}")
    assert cli.main(["audit", "--follow"]) == 2
    assert capsys.readouterr().err == (
        f"rebalancer: audit.url names {missing}, which does not exist: no audit store to read "
        "there; set audit.url (or REBALANCER_AUDIT__URL) to the controller's\n"
    )
    assert list(tmp_path.iterdir()) == []  # no empty store was made


def interactive() -> None:
    """In the child before it runs: Ctrl-C as a terminal delivers it. A suite started in the
    background by a non-interactive shell (``make test &``) ignores SIGINT, every process it
    starts inherits that, and Python leaves an ignored SIGINT ignored: the child never saw the
    signal and followed on (its stacks, dumped by faulthandler, showed the loop waiting)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def ended(proc: asyncio.subprocess.Process) -> tuple[bytes, bytes]:
    """What ``proc`` wrote after Ctrl-C, once it ends; if it still runs 20 s after it,
    SIGABRT makes faulthandler write where each of its threads waits into the failure."""
    try:
        async with asyncio.timeout(20):
            return await proc.communicate()
    except TimeoutError:
        proc.send_signal(signal.SIGABRT)
        await proc.wait()
        assert proc.stderr is not None
        err = await proc.stderr.read()
        raise AssertionError(f"still running 20 s after Ctrl-C:\n{err.decode()}") from None


async def test_audit_follow_prints_each_new_record_once_in_order_until_ctrl_c(
    tmp_path: Path,
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'audit.sqlite3'}"
    store = await SqlAuditStore.open(url)
    config = tmp_path / "config.yaml"
    config.write_text(f"audit:\n  url: {url}\n", encoding="utf-8")
    try:
        await store.append(records(datetime.now(UTC).replace(microsecond=0)))
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rebalancer",
            "audit",
            "--follow",
            "--json",
            "--pool",
            "l20",
            "--limit",
            "2",
            "--interval",
            "0.1s",
            "--config",
            str(config),
            cwd=ROOT,
            env={**child_env(), "PYTHONFAULTHANDLER": "1"},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=interactive,
        )
        assert proc.stdout is not None
        stdout = proc.stdout

        async def lines(count: int) -> list[str]:
            out: list[str] = []
            async with asyncio.timeout(20):
                while len(out) < count:
                    line = await stdout.readline()
                    assert line, "audit --follow ended early"
                    out.append(json.loads(line)["id"])
            return out

        try:
            assert await lines(2) == ["01E", "01F"]  # the newest two, oldest first
            # One tick's records, one in the same second as another; one of another pool.
            await store.append([ago("01G", 0, pool="l20"), ago("01H", 0, pool="l20")])
            await store.append([ago("01J", 0, pool="a100")])
            assert await lines(2) == ["01G", "01H"]
            # Committed after 01H was shown, with an earlier time: still shown, and once.
            await store.append([ago("01K", 1, pool="l20")])
            await store.append([ago("01M", -1, pool="l20")])
            assert await lines(2) == ["01K", "01M"]
            proc.send_signal(signal.SIGINT)
            rest, err = await ended(proc)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    finally:
        await store.close()

    assert proc.returncode == 0, err.decode()
    assert rest == b""  # nothing shown twice
    assert err == b""  # no traceback


async def test_a_store_a_newer_release_migrated_is_refused_in_one_line_exit_2(
    tmp_path: Path,
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'audit.sqlite3'}"
    store = await SqlAuditStore.open(url)
    try:
        await store.append(records(datetime.now(UTC).replace(microsecond=0)))
        async with store.engine.begin() as conn:  # as a newer release's migration leaves it
            await conn.execute(
                schema_version.insert().values(
                    version=SCHEMA_VERSION + 1, description="newer", applied_at=datetime.now(UTC)
                )
            )
    finally:
        await store.close()
    path = tmp_path / "config.yaml"
    path.write_text(f"audit:\n  url: {url}\n", encoding="utf-8")
    before = (tmp_path / "audit.sqlite3").read_bytes()

    code, out, err = await run_cli("audit", "--config", str(path))

    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"rebalancer: audit.url={url!r}: the audit store is at schema version "
        f"{SCHEMA_VERSION + 1}, newer than version {SCHEMA_VERSION} that this release reads: "
        "run the release that migrated it (or a newer one); nothing in the store was changed"
    ]
    assert (tmp_path / "audit.sqlite3").read_bytes() == before
