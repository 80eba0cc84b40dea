"""A SQLite connection of a module's own, beside Django's, for the few reads and writes done on the event loop's
thread (audit.log.caller_thread, oauth.steady_tokens). Django refuses its own connections there, and they would
wait for a lock.

The connection never waits: its busy timeout is 0, so a lock held by another connection is an immediate
`sqlite3.OperationalError`, and the caller falls back to a thread that may wait. It is in autocommit mode (the
caller writes BEGIN and COMMIT itself) and may be used from any thread, one at a time, under the caller's lock.
"""

from __future__ import annotations

import sqlite3

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper


def connection_beside(alias: str) -> tuple[BaseDatabaseWrapper, sqlite3.Connection]:
    """Django's wrapper for `alias` (never opened: for its SQL dialect and value conversions only) and a sqlite3
    connection to the same file that never waits for a lock."""
    database = connections.create_connection(alias)
    connection = sqlite3.connect(
        database.settings_dict["NAME"], timeout=0, isolation_level=None, check_same_thread=False
    )
    return database, connection
