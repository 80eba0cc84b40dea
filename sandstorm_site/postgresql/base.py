"""Django's PostgreSQL backend, with connections that recover after the server dropped them.

Django checks a persistent connection (CONN_MAX_AGE) only when a request starts or ends. Most of Sandstorm's
database work is not in a Django request: the /mcp path and the server's background tasks run it in worker threads,
each keeping its own connection for good. When PostgreSQL restarts (an upgrade, a failover) every one of those
connections is dead, and without this each thread would fail every query until the server restarted. Here, a
connection on which an error occurred is checked before its next use and, if it no longer works, replaced: the
query that met the dead connection fails (a tool call is then refused, as when the audit log cannot be written),
the next one works. The check costs nothing while no error occurs, and never runs inside a transaction.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base


class DatabaseWrapper(base.DatabaseWrapper):
    def _cursor(self, name: str | None = None) -> Any:
        if self.errors_occurred and self.connection is not None and not self.in_atomic_block:
            if self.is_usable():
                self.errors_occurred = False
            else:
                self.close()
        return super()._cursor(name)  # type: ignore[misc]  # django-stubs omit _cursor, which Django's wrapper defines
