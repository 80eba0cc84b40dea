"""A record committed on the caller's own thread (the event loop's), SQLite only, when that needs no waiting.

The writer (audit.log.writer) uses this before it hands a record to its batch thread: the record is written here,
through a connection of its own, if the write can start at once: this process's write turn is free and SQLite
grants its write lock without waiting (busy timeout 0; in WAL mode readers never hold it). Anything else (another
writer at work, any database error) leaves the record to the batch thread, which waits its turn and reports a
failure as it always has. So the event loop never waits for a lock, and a record is committed before its caller
goes on.

A commit here does not checkpoint the WAL (copying it into the database and syncing the file would stall the event
loop); every CHECKPOINT_EVERY commits a short-lived thread of its own runs a passive checkpoint instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Sequence

from django.db.backends.base.base import BaseDatabaseWrapper

from audit.log.append import Statements, append_in, make_storable, saved, statements_for
from audit.models import AuditRecord
from audit.sqlite import connection_beside

logger = logging.getLogger(__name__)
CHECKPOINT_EVERY = 64  # commits: chosen so the WAL stays near SQLite's own 1000-page autocheckpoint threshold
CHECKPOINT_BUSY_TIMEOUT = 5.0  # seconds the checkpoint thread may wait for another checkpointer


class CallerThreadAppender:
    """Appends one caller's records at a time on the calling thread when that needs no waiting; see the module's
    docstring."""

    def __init__(self, turn: threading.Lock, alias: str = "default", checkpoint_every: int = CHECKPOINT_EVERY) -> None:
        self._turn = turn  # shared with the writer and the synchronous writers of this process
        self._alias = alias
        self._checkpoint_every = checkpoint_every
        self._connection: sqlite3.Connection | None = None
        self._database: BaseDatabaseWrapper | None = None  # Django's, for its value conversions only; never opened
        self._statements: Statements | None = None
        self._commits = 0
        self._checkpointing = False
        # A forked child must not use the parent's SQLite connection: it opens one of its own.
        os.register_at_fork(after_in_child=self._forget)

    def try_append(self, records: Sequence[AuditRecord]) -> bool:
        """Commit `records` at the head of the chain now, in one transaction, or return False having written
        nothing."""
        if not self._turn.acquire(blocking=False):
            return False
        try:
            return self._append(records)
        finally:
            self._turn.release()

    def close(self) -> None:
        with self._turn:
            if self._connection is not None:
                self._connection.close()
            self._connection = None

    def _append(self, records: Sequence[AuditRecord]) -> bool:
        try:
            connection = self._connect()
            connection.execute("BEGIN IMMEDIATE")
        except sqlite3.Error:
            return False  # the write lock is another connection's (SQLITE_BUSY), or the database cannot be opened
        assert self._database is not None and self._statements is not None
        for record in records:
            make_storable(record)
        written = False
        try:
            append_in(connection.cursor(), records, self._statements, self._database)
            connection.execute("COMMIT")
            written = True
        except sqlite3.Error as error:
            logger.warning("audit: could not write a record on the caller's thread (%s); the writer will", error)
        finally:
            if connection.in_transaction:
                self._roll_back(connection)
        if written:
            saved(records, self._alias)
            self._committed()
        return written

    def _connect(self) -> sqlite3.Connection:
        if self._connection is None:
            self._database, self._connection = connection_beside(self._alias)
            self._statements = statements_for(self._database).with_placeholder("?")
            self._connection.execute("PRAGMA synchronous=NORMAL")
            self._connection.execute("PRAGMA wal_autocheckpoint=0")
        return self._connection

    def _roll_back(self, connection: sqlite3.Connection) -> None:
        try:
            connection.execute("ROLLBACK")
        except sqlite3.Error:
            connection.close()  # unusable: the next record opens a new connection
            self._connection = None

    def _committed(self) -> None:
        self._commits += 1
        if self._commits % self._checkpoint_every == 0 and not self._checkpointing:
            self._checkpointing = True
            assert self._database is not None
            path = self._database.settings_dict["NAME"]
            threading.Thread(target=self._checkpoint, args=(path,), name="audit-checkpoint", daemon=True).start()

    def _checkpoint(self, path: str) -> None:
        try:
            with contextlib.closing(sqlite3.connect(path, timeout=CHECKPOINT_BUSY_TIMEOUT)) as connection:
                connection.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as error:
            logger.warning("audit: could not checkpoint the WAL: %s", error)
        finally:
            self._checkpointing = False

    def _forget(self) -> None:
        self._connection = None
        self._checkpointing = False
