"""A throwaway PostgreSQL for tests: ``initdb`` and ``pg_ctl`` in a temporary directory.

``running_postgres`` (the session fixture ``postgres_server`` of tests/conftest.py) starts one
server on a free port, listening on 127.0.0.1 and on a unix socket in its own directory,
trusting local connections, with ``fsync=off`` (it is thrown away). It is stopped (``pg_ctl
stop -m immediate``) and its directory removed at the end of the session. Tests get a fresh
database each from ``PostgresServer.create_database``.

PostgreSQL refuses to run as root. When the tests run as root, the server runs as an
unprivileged system user (``postgres`` if it exists, else ``nobody``) through ``setpriv``; the
temporary directory is then made under /tmp and handed to that user.

If PostgreSQL cannot be started the fixture *fails* (never skips), saying what is missing.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.processes import free_port

SUPERUSER = "rebalancer"
_DEBIAN_HINT = "install it with: apt-get install -y postgresql (Debian: postgresql-15 or newer)"


@dataclass(frozen=True)
class PostgresServer:
    root: Path
    socket_dir: Path
    port: int
    user: str  # the database superuser

    def url(self, database: str = "postgres") -> str:
        """A SQLAlchemy asyncpg URL over the unix socket."""
        return (
            f"postgresql+asyncpg://{self.user}@/{database}?host={self.socket_dir}&port={self.port}"
        )

    async def create_database(self, name: str) -> str:
        """A new empty database; returns its URL."""
        from sqlalchemy import text
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            async with engine.connect() as conn:
                await conn.execute(text(f'CREATE DATABASE "{name}"'))
        finally:
            await engine.dispose()
        return self.url(name)


def _bin_dir() -> Path:
    """The directory holding initdb, pg_ctl and postgres (PATH, then Debian's layout)."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(os.path.realpath(found)).parent
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if versions:
        return Path(versions[-1]).parent
    pytest.fail(
        "PostgreSQL is needed for the audit store tests and was not found: no pg_ctl/initdb on "
        f"PATH nor in /usr/lib/postgresql/*/bin; {_DEBIAN_HINT}",
        pytrace=False,
    )


def _run_as() -> tuple[list[str], pwd.struct_passwd | None]:
    """The command prefix that runs PostgreSQL's programs as a user it accepts."""
    if os.geteuid() != 0:
        return [], None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            user = pwd.getpwnam(name)
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                pytest.fail(
                    "running as root, PostgreSQL must run as another user, and setpriv "
                    "(util-linux) is missing: apt-get install -y util-linux",
                    pytrace=False,
                )
            prefix = [
                setpriv,
                f"--reuid={user.pw_uid}",
                f"--regid={user.pw_gid}",
                "--clear-groups",
                "--",
            ]
            return prefix, user
    pytest.fail(
        "running as root, PostgreSQL must run as an unprivileged user, and neither 'postgres' "
        "nor 'nobody' exists: create one (useradd --system postgres) or run the tests as a "
        "normal user",
        pytrace=False,
    )


def _run(cmd: list[str], what: str, log: Path | None = None) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60, check=False)
    if done.returncode != 0:
        extra = ""
        if log is not None and log.exists():
            extra = "\nserver log:\n" + log.read_text(errors="replace")[-2000:]
        pytest.fail(
            f"could not {what}: {' '.join(cmd)} exited {done.returncode}\n"
            f"{done.stdout}{done.stderr}{extra}",
            pytrace=False,
        )


@contextlib.contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    bindir = _bin_dir()
    prefix, user = _run_as()
    root = Path(tempfile.mkdtemp(prefix="rebalancer-pg-"))
    data, sock, log = root / "data", root / "sock", root / "server.log"
    sock.mkdir()
    if user is not None:
        for path in (root, sock):
            os.chown(path, user.pw_uid, user.pw_gid)
    os.chmod(root, 0o700)
    port = free_port()
    started = False
    try:
        _run(
            [
                *prefix,
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--no-locale",
                "--no-sync",
            ],
            "initialise a PostgreSQL data directory",
        )
        options = (
            f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off"
        )
        _run(
            [
                *prefix,
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(log),
                "-w",
                "-t",
                "30",
                "-o",
                options,
                "start",
            ],
            "start PostgreSQL",
            log,
        )
        started = True
        yield PostgresServer(root, sock, port, SUPERUSER)
    finally:
        if started:
            subprocess.run(
                [*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                capture_output=True,
                timeout=60,
                check=False,
            )
        shutil.rmtree(root, ignore_errors=True)
