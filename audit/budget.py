"""The audit log's disk budget (SANDSTORM_AUDIT_MAX_BYTES): at the limit, tool calls are refused, not left unrecorded.

Every call writes its arguments and result excerpts, so an agent, even one with a read-only token, could fill the
disk at megabytes a minute. A security product must not stop recording and go on running, so when the log reaches
its budget every new tool call is refused with an error that says what to do, and /health and the audit overview
say so to the admin. The refused calls are counted and recorded once a minute as one event, not one record each.

The size is cheap to read but not free, so it is measured at most every CHECK_EVERY seconds, on a worker thread; a
call in between uses the last measure. SQLite: the pages in use plus the WAL file (a prune frees pages for reuse;
audit_prune truncates the WAL). PostgreSQL: pg_total_relation_size of the audit table (its indexes and TOAST too;
space a prune frees is reused, but the table only shrinks with VACUUM FULL).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connection

from audit.models import AuditRecord

logger = logging.getLogger(__name__)
CHECK_EVERY = 5.0  # seconds between two measures of the log's size
SETTING = "SANDSTORM_AUDIT_MAX_BYTES"


def audit_log_bytes() -> int:
    """Bytes the audit log takes: on SQLite the whole database in use (the log is nearly all of it) and its WAL."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA page_size")
            page_size = cursor.fetchone()[0]
            cursor.execute("PRAGMA page_count")
            pages = cursor.fetchone()[0]
            cursor.execute("PRAGMA freelist_count")
            free = cursor.fetchone()[0]
            try:
                wal = os.stat(f"{connection.settings_dict['NAME']}-wal").st_size
            except FileNotFoundError:
                wal = 0
            return int((pages - free) * page_size + wal)
        cursor.execute("SELECT pg_total_relation_size(%s)", [AuditRecord._meta.db_table])
        return int(cursor.fetchone()[0])


def human(size: int) -> str:
    if size < 1024:
        return f"{size} bytes"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB"):  # noqa: B007 - the unit the loop stopped at is printed after it
        value /= 1024
        if value < 1024:
            break
    return f"{value:.1f} {unit}"


@dataclass(frozen=True)
class BudgetState:
    used: int
    limit: int  # 0: no budget

    @property
    def full(self) -> bool:
        return self.limit > 0 and self.used >= self.limit

    def as_json(self) -> dict[str, object]:
        return {"bytes": self.used, "max_bytes": self.limit, "full": self.full}


def refusal_text(state: BudgetState) -> str:
    return (
        f"Error: the audit log is full ({human(state.used)} of its {human(state.limit)} budget, {SETTING}), so no "
        "tool call can run until an admin makes room; this call was not run. Tell the admin: export and prune old "
        "records (manage.py audit_export, then audit_prune --before YYYY-MM-DD --yes) or raise "
        f"{SETTING}."
    )


class AuditBudget:
    """The budget of one server process: the last measure of the log's size, refreshed at most every `every` s."""

    def __init__(self, limit: int, measure: Callable[[], int] = audit_log_bytes, every: float = CHECK_EVERY) -> None:
        self.limit = limit
        self._measure = measure
        self._every = every
        self._state: BudgetState | None = None
        self._measured_at = -every
        self._refused = 0
        self._lock = threading.Lock()  # the refusal count is drained on another thread

    def _refresh(self) -> BudgetState | None:
        try:
            state = BudgetState(self._measure(), self.limit)
        except (DatabaseError, OSError):
            logger.exception("audit: could not measure the audit log's size; keeping the last measure")
            return self._state
        if state.full and not (self._state and self._state.full):
            logger.error(
                "audit: the audit log is full (%d of %d bytes, %s): tool calls are refused",
                state.used,
                self.limit,
                SETTING,
            )
        self._state = state
        return state

    def state_now(self) -> BudgetState | None:
        """The state, measured now if the last measure is old (blocking: for sync callers, worker threads)."""
        if not self.limit:
            return None
        now = time.monotonic()
        if now - self._measured_at >= self._every:
            self._measured_at = now
            return self._refresh()
        return self._state

    async def state(self) -> BudgetState | None:
        """The state for async callers: no wait at all unless the last measure is older than `every` seconds."""
        if not self.limit:
            return None
        now = time.monotonic()
        if now - self._measured_at < self._every:
            return self._state
        self._measured_at = now  # concurrent callers use the last measure meanwhile
        return await sync_to_async(self._refresh, thread_sensitive=False)()

    async def refusal(self) -> str | None:
        """The error for a tool call if the log is full (the call is counted), else None."""
        state = await self.state()
        if state is None or not state.full:
            return None
        with self._lock:
            self._refused += 1
        return refusal_text(state)

    def drain_refused(self) -> tuple[int, BudgetState | None]:
        """Calls refused since the last drain, and the last measure (for the once-a-minute event)."""
        with self._lock:
            count, self._refused = self._refused, 0
        return count, self._state
