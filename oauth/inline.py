"""Bearer tokens in steady use, checked on the event loop's own thread (SQLite only).

Every request to /mcp looks its credential up. The authoritative lookup (oauth.credentials) runs on a thread of its
own, since a database query must not hold up the event loop and a token's first use is written; for a query that
takes a fraction of a millisecond, the trip to that thread and back costs more than the query. On SQLite a read
never waits for a writer (WAL), so a bearer token that needs no write (unrevoked, unexpired, its user active, last
used less than LAST_USED_PRECISION ago) is checked here instead, through a read-only connection of its own, with
those conditions in the SQL: the comparisons BearerToken.objects.active() makes, on the values as Django stores
them. Everything else goes to the authoritative lookup, which decides (and records) as always: an unknown, revoked
or expired token, a first use or an outdated last use, an OAuth token, a lock that is busy, any database error. So
this path only ever accepts a token that the database says is active at the moment of the request.
"""

from __future__ import annotations

import hmac
import os
import sqlite3
import threading

from django.contrib.auth import get_user_model
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from oauth.models import LAST_USED_PRECISION, BearerToken, hash_token
from audit.sqlite import connection_beside

# (token id, name, scope, user id, username) of a token in steady use, or None.
SteadyToken = tuple[int, str, str, int, str]


def steady_token_sql(database: BaseDatabaseWrapper) -> str:
    """The token with this hash if it is active, its user is active and it was used within the precision window."""
    user_model = get_user_model()
    quote = database.ops.quote_name
    token = {field.name: quote(field.column) for field in BearerToken._meta.concrete_fields}
    username = quote(user_model._meta.get_field(user_model.USERNAME_FIELD).column)
    has_active = any(field.name == "is_active" for field in user_model._meta.concrete_fields)
    return (
        f"SELECT t.{token['id']}, t.{token['name']}, t.{token['scope']}, t.{token['user']}, u.{username}, "
        f"t.{token['token_hash']} "
        f"FROM {quote(BearerToken._meta.db_table)} t INNER JOIN {quote(user_model._meta.db_table)} u "
        f"ON u.{quote(user_model._meta.pk.column)} = t.{token['user']} "
        f"WHERE t.{token['token_hash']} = ? AND t.{token['revoked_at']} IS NULL "
        f"AND (t.{token['expires_at']} IS NULL OR t.{token['expires_at']} > ?) "
        f"AND t.{token['last_used_at']} IS NOT NULL AND t.{token['last_used_at']} > ?"
        + (f" AND u.{quote('is_active')}" if has_active else "")
    )


class SteadyTokens:
    """Looks up bearer tokens in steady use on the calling thread; see the module's docstring."""

    def __init__(self, alias: str = "default") -> None:
        self._alias = alias
        self._lock = threading.Lock()  # one connection: callers on other threads (event loops) use the other path
        self._connection: sqlite3.Connection | None = None
        self._database: BaseDatabaseWrapper | None = None
        self._sql = ""
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
        assert self._database is not None
        now = timezone.now()
        adapt = self._database.ops.adapt_datetimefield_value
        # fetchall, not fetchone: the statement must finish, ending its read transaction (a snapshot held until
        # the next request would show that request an outdated token).
        rows = connection.execute(self._sql, [digest, adapt(now), adapt(now - LAST_USED_PRECISION)]).fetchall()
        if len(rows) != 1 or not hmac.compare_digest(rows[0][5], digest):
            return None
        token_id, name, scope, user_id, username, _ = rows[0]
        return token_id, name, scope, user_id, username

    def _connect(self) -> sqlite3.Connection:
        if self._connection is None:
            self._database, self._connection = connection_beside(self._alias)
            self._sql = steady_token_sql(self._database)
            self._connection.execute("PRAGMA query_only = 1")
        return self._connection

    def _drop(self) -> None:
        if self._connection is not None:
            self._connection.close()
        self._connection = None

    def _forget(self) -> None:
        self._connection = None
        self._lock = threading.Lock()
