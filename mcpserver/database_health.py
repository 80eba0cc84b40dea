"""Whether the database answers what /mcp needs, for /health: no request at /mcp can be served without it (every
one looks its credential up, every tool call is recorded before it runs).

Probed at most every CHECK_EVERY seconds, on a worker thread, so /health stays as cheap as it was; and marked failed
at once when a request at /mcp meets a database error (mcpserver.guard), until a probe succeeds again.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connection

from audit.models import AuditRecord, ChainHead
from oauth.models import BearerToken

logger = logging.getLogger(__name__)
CHECK_EVERY = 2.0  # seconds between two probes


def probe_database() -> None:
    """The reads a request at /mcp makes first: a bearer token, the chain head, the newest audit record."""
    try:
        BearerToken.objects.order_by("-id").values_list("id", flat=True).first()
        ChainHead.objects.filter(pk=1).values_list("last_record_id", flat=True).first()
        AuditRecord.objects.order_by("-id").values_list("id", flat=True).first()
    finally:
        if connection.vendor == "sqlite":
            # Opened again by the next probe: SQLite reads the file's header then, so a database cut short or
            # replaced under the running server shows at once instead of hiding behind this connection's cache.
            connection.close()


def describe(error: BaseException) -> str:
    return (
        f"the database cannot be read ({error}): requests at /mcp fail until it is restored "
        "(docs/operations.md, Troubleshooting)"
    )


class DatabaseHealth:
    """The last probe's verdict: None while the database answers, else what is wrong."""

    def __init__(self, probe: Callable[[], None] = probe_database, every: float = CHECK_EVERY) -> None:
        self._probe = probe
        self._every = every
        self._error: str | None = None
        self._probed_at = -every

    def _refresh(self) -> str | None:
        try:
            self._probe()
        except (DatabaseError, sqlite3.Error) as error:
            if self._error is None:
                logger.error("health: %s", describe(error))
            self._error = describe(error)
        else:
            self._error = None
        return self._error

    async def error(self) -> str | None:
        now = time.monotonic()
        if now - self._probed_at < self._every:
            return self._error
        self._probed_at = now  # concurrent callers use the last verdict meanwhile
        return await sync_to_async(self._refresh, thread_sensitive=False)()

    def failed(self, error: BaseException) -> None:
        """A request at /mcp met `error` from the database: /health says so until a probe succeeds."""
        self._error = describe(error)
        self._probed_at = time.monotonic()
