"""The database the suite runs against: SQLite by default, or the PostgreSQL server that DATABASE_URL names.

pytest-django makes the in-process test database from DATABASE_URL itself. Under PostgreSQL every live server gets a
database of its own (`sandstorm_live_<random>`) on the same server, made before it starts and dropped when the
server is done with (or at the end of the session at the latest). Tests read and tamper with a server's database
through `ServerDatabase`, in SQL that both databases understand, with `%s` for parameters.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

POSTGRES_URL = os.environ.get("DATABASE_URL", "").strip()
ON_POSTGRES = bool(POSTGRES_URL)
requires_sqlite = pytest.mark.skipif(
    ON_POSTGRES, reason="SQLite only: the suite runs against PostgreSQL (DATABASE_URL)"
)
requires_postgres = pytest.mark.skipif(
    not ON_POSTGRES, reason="PostgreSQL only: the suite runs against SQLite (no DATABASE_URL)"
)
LIVE_PREFIX = "sandstorm_live_"

Row = dict[str, Any]
_made: set[str] = set()


def _connect_postgres(url: str) -> Any:
    import psycopg
    from psycopg.rows import dict_row
    from psycopg.types.string import TextLoader

    connection = psycopg.connect(url, autocommit=True, row_factory=dict_row)
    # JSON columns as their text, as SQLite gives them: tests read both the same way (json.loads, `in`).
    for json_type in ("json", "jsonb"):
        connection.adapters.register_loader(json_type, TextLoader)
    return connection


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def new_postgres_database(template: str | None = None, *, tracked: bool = True) -> str:
    """Create a database on the suite's PostgreSQL server, empty or a copy of the database of URL `template` (which
    nobody may be connected to); returns its URL. An untracked one is the caller's to drop (a template made once for
    the whole session must outlive the test that happened to make it)."""
    name = LIVE_PREFIX + secrets.token_hex(6)
    copied = f' TEMPLATE "{database_name(template)}"' if template else ""
    with closing(_connect_postgres(POSTGRES_URL)) as admin:
        admin.execute(f'CREATE DATABASE "{name}"{copied}')
    if tracked:
        _made.add(name)
    return _with_database(POSTGRES_URL, name)


def drop_postgres_database(url: str) -> None:
    """Drop a database made by `new_postgres_database`, ending any connection still open to it."""
    name = database_name(url)
    if not name.startswith(LIVE_PREFIX):
        raise ValueError(f"refusing to drop {name!r}: not a live-server database of the test suite")
    import psycopg

    with closing(_connect_postgres(POSTGRES_URL)) as admin:
        # Not WITH (FORCE): that refuses a non-superuser while autovacuum works in the database (PostgreSQL 15).
        # A plain DROP ends autovacuum itself; the clients (a server still closing) are ended here first.
        for attempt in range(5):
            _end_client_connections(admin, name)
            try:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
                break
            except psycopg.errors.ObjectInUse:
                if attempt == 4:
                    raise
    _made.discard(name)


def _end_client_connections(admin: Any, name: str) -> int:
    """End the connections of the suite's own role to database `name`; autovacuum's workers, which a non-superuser
    may not end, are left alone."""
    row = admin.execute(
        "SELECT count(pg_terminate_backend(pid)) AS ended FROM pg_stat_activity"
        " WHERE datname = %s AND pid <> pg_backend_pid() AND usename = current_user",
        (name,),
    ).fetchone()
    return int(row["ended"])


def end_connections(url: str) -> int:
    """End every client connection to the database of `url`, as a restart of PostgreSQL would; returns how many."""
    with closing(_connect_postgres(POSTGRES_URL)) as admin:
        return _end_client_connections(admin, database_name(url))


def made_databases() -> frozenset[str]:
    return frozenset(_made)


def drop_databases_made_since(before: frozenset[str]) -> None:
    for name in sorted(_made - before):
        drop_postgres_database(_with_database(POSTGRES_URL, name))


class ServerDatabase:
    """The database of one server, given the environment it runs with."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.url = env.get("DATABASE_URL", "")
        self.sqlite_path = Path(env["SANDSTORM_STATE_DIR"]) / "sandstorm.sqlite3"

    @property
    def vendor(self) -> str:
        return "postgresql" if self.url else "sqlite"

    @contextmanager
    def _cursor(self) -> Iterator[Any]:
        if self.url:
            with closing(_connect_postgres(self.url)) as connection, connection.transaction():
                yield connection.cursor()
            return
        with closing(sqlite3.connect(self.sqlite_path, timeout=30)) as connection:
            connection.row_factory = sqlite3.Row
            with connection:
                yield connection.cursor()

    def _sql(self, sql: str) -> str:
        return sql if self.url else sql.replace("%s", "?")

    def query(self, sql: str, *params: Any) -> list[Row]:
        with self._cursor() as cursor:
            cursor.execute(self._sql(sql), params)
            return [dict(row) for row in cursor.fetchall()]

    def one(self, sql: str, *params: Any) -> Row:
        """The row a query must return exactly one of, as Django's `get()` insists (an AssertionError for none or
        several); with LIMIT 1, the first row of one or more, as `first()` or `latest()` followed by an attribute."""
        rows = self.query(sql, *params)
        if len(rows) != 1:
            raise AssertionError(f"{len(rows)} rows, not one, for {sql!r} {params!r}")
        return rows[0]

    def execute(self, *statements: str | tuple[str, Sequence[Any]]) -> None:
        """Run statements in one transaction, on one connection: each an SQL text, or (SQL text, parameters)."""
        with self._cursor() as cursor:
            for statement in statements:
                sql, params = (statement, ()) if isinstance(statement, str) else statement
                cursor.execute(self._sql(sql), tuple(params))

    def columns(self, table: str) -> list[str]:
        if self.url:
            rows = self.query(
                "SELECT column_name AS name FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
                table,
            )
        else:
            rows = self.query(f"SELECT name FROM pragma_table_info('{table}')")
        return [row["name"] for row in rows]


def copy_server_database(env: Mapping[str, str], state_dir: Path) -> dict[str, str]:
    """A consistent copy of a (running) server's database; returns the environment variables that select it.

    SQLite: the online backup API into `state_dir`. PostgreSQL: pg_dump into a new database of the suite's own.
    """
    source = ServerDatabase(env)
    if not source.url:
        with (
            closing(sqlite3.connect(source.sqlite_path)) as reader,
            closing(sqlite3.connect(state_dir / "sandstorm.sqlite3")) as writer,
        ):
            reader.backup(writer)
        return {"SANDSTORM_STATE_DIR": str(state_dir)}
    target = new_postgres_database()
    dump = subprocess.run(
        ["pg_dump", "--no-owner", "--no-privileges", "--dbname", source.url],
        capture_output=True,
        check=True,
        timeout=120,
    )
    subprocess.run(
        ["psql", "--quiet", "--no-psqlrc", "-v", "ON_ERROR_STOP=1", "--dbname", target],
        input=dump.stdout,
        capture_output=True,
        check=True,
        timeout=120,
    )
    return {"SANDSTORM_STATE_DIR": str(state_dir), "DATABASE_URL": target}
