"""What the console's page of open MCP sessions asks the server: every worker's sessions, and ending one.

Run on the event loop of the server process (the page's view hands them over with asgiref's async_to_sync, which
runs them on Daphne's loop, where the session ledger lives). A process that serves no /mcp (`manage.py runserver`)
has no ledger: the page says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings

from mcpserver.open_sessions import Row, end_here, matches, rows_here, worker_of
from mcpserver.services import registered
from mcpserver.workers import ask_worker_to_end_session, ask_workers_for_sessions


@dataclass(frozen=True)
class Listing:
    rows: list[Row] = field(default_factory=list)
    serving: bool = False  # whether this process serves /mcp (else there is nothing to list here)
    silent_workers: list[int] = field(default_factory=list)  # workers that did not answer in time


async def list_sessions(credential: str = "") -> Listing:
    """Every worker's open sessions (of `credential`, a principal key or a key prefix ending in ":", if given),
    oldest first."""
    services = registered()
    if services is None:
        return Listing()
    rows = rows_here(services.sessions)
    others, silent = await ask_workers_for_sessions()
    rows = sorted(rows + others, key=lambda row: float(row.get("opened_at", 0)))
    if credential:
        rows = [row for row in rows if matches(row, credential)]
    return Listing(rows=rows, serving=True, silent_workers=silent)


async def count_sessions(credential: str) -> int | None:
    """How many sessions `credential` holds open over every worker; None where this process serves no /mcp."""
    listing = await list_sessions(credential)
    return len(listing.rows) if listing.serving else None


async def end_session(session_id: str, by: str) -> Row | None:
    """End session `session_id` in whichever worker holds it, for staff user `by`; its row, or None if it was not
    open (anymore)."""
    services = registered()
    if services is None:
        return None
    number = worker_of(session_id)
    if number is None or number == settings.WORKER:
        return await end_here(services.sessions, session_id, by)
    return await ask_worker_to_end_session(number, session_id, by)
