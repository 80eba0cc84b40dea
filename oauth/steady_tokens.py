"""Bearer tokens in steady use, checked on the event loop's own thread (SQLite only).

Every request to /mcp looks its credential up. The authoritative lookup (oauth.credentials) runs on a thread of its
own, since a database query must not hold up the event loop and a token's first use is written; for a query by an
index that SQLite answers from its page cache, the trip to that thread and back costs more than the query. On
SQLite a read never waits for a writer (WAL), so a bearer token that needs no write (valid, and last used less
than LAST_USED_PRECISION ago) is checked here instead, through a read-only connection of its own, by the query
oauth.bearer_lookup compiles from BearerToken.objects.valid(), the same definition the authoritative lookup runs.
Everything else goes to the authoritative lookup, which decides (and records) as always: an unknown, revoked or
expired token, a first use or an outdated last use, an OAuth token, a lock that is busy, any database error. So
this path only ever accepts a token that the authoritative lookup would accept at the moment of the request.
"""

from __future__ import annotations

import hmac
import os
import sqlite3
import threading

from django.db import connections
from django.utils import timezone

from audit.sqlite import connection_beside
from oauth.bearer_lookup import compile_steady_bearer
from oauth.models import LAST_USED_PRECISION, hash_token

# (token id, name, scope, user id, username, confinement) of a token in steady use, or None.
SteadyToken = tuple[int, str, str, int, str, str]


def sqlite_placeholders(sql: str) -> str:
    """Django's `%s` placeholders as sqlite3's `?` (the compiled query holds no other `%`)."""
    converted = sql.replace("%s", "?")
    if "%" in converted:
        raise RuntimeError("the steady bearer token query holds a '%' that is not a placeholder")
    return converted


class SteadyTokens:
    """Looks up bearer tokens in steady use on the calling thread; see the module's docstring."""

    def __init__(self, alias: str = "default") -> None:
        self._alias = alias
        self._lock = threading.Lock()  # one connection: callers on other threads (event loops) use the other path
        self._connection: sqlite3.Connection | None = None
        self._lookup = compile_steady_bearer(connections[alias])
        self._sql = sqlite_placeholders(self._lookup.sql)
        os.register_at_fork(after_in_child=self._forget)  # a child must not use the parent's SQLite connection

    def find(self, raw: str) -> SteadyToken | None:
        """The token for `raw` if it is in steady use, else None (the authoritative lookup decides)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._find(hash_token(raw))
        except sqlite3.Error:
            self._drop()
            return None
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _find(self, digest: str) -> SteadyToken | None:
        connection = self._connect()
        now = timezone.now()
        params = self._lookup.params(digest, now, now - LAST_USED_PRECISION)
        # fetchall, not fetchone: the statement must finish, ending its read transaction (a snapshot held until
        # the next request would show that request an outdated token).
        rows = connection.execute(self._sql, params).fetchall()
        if len(rows) != 1 or not hmac.compare_digest(rows[0][-1], digest):
            return None
        token_id, name, scope, user_id, username, confinement, _ = rows[0]
        return token_id, name, scope, user_id, username, confinement

    def _connect(self) -> sqlite3.Connection:
        if self._connection is None:
            _, self._connection = connection_beside(self._alias)
            self._connection.execute("PRAGMA query_only = 1")
        return self._connection

    def _drop(self) -> None:
        if self._connection is not None:
            self._connection.close()
        self._connection = None

    def _forget(self) -> None:
        self._connection = None
        self._lock = threading.Lock()
