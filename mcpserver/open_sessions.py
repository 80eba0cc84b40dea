"""The MCP sessions open in this worker as the console lists them, and ending one from the console.

A 2025-11-25 session is live state in the worker that opened it (docs/scaling.md): the console's page
(mcpserver.session_views) lists this worker's from its session ledger (mcpserver.sessions) and asks the other
workers for theirs over the channel layer (mcpserver.workers), which answer with `rows_here`. Rows are plain dicts
of plain values, as the channel layer carries them.

Ending a session is what a client's DELETE and the SDK's idle timeout do (OpenSession.disconnect): its next request
is answered 404 and the client must initialize a new one; its running tool calls, which run inside the session, are
cancelled with it. Nothing is revoked: the client may open a new session with the same credential at once.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings

from mcpserver.inflight import IN_FLIGHT
from mcpserver.sessions import OpenSession, SessionLedger
from mcpserver.stop_reasons import SESSION_ENDED, Stopped

WORKER_TAG = re.compile(r"w(\d{1,4})-")  # mcpserver.transport.worker_session_id
Row = dict[str, Any]


def row_of(entry: OpenSession) -> Row | None:
    """What the console shows of one session; None for one not (or no longer) made by the SDK."""
    transport, principal = entry.transport, entry.principal
    if transport is None or transport.mcp_session_id is None or entry.closed:
        return None
    return {
        "session_id": transport.mcp_session_id,
        "worker": settings.WORKER,
        "key": entry.key,
        "credential_kind": principal.credential_kind if principal else "",
        "credential_id": principal.credential_id if principal else None,
        "application_id": principal.application_id if principal else None,
        "credential_name": principal.credential_name if principal else "",
        "username": principal.username if principal else "",
        "client_address": principal.client_address if principal else "",
        "user_agent": principal.user_agent if principal else "",
        "opened_at": entry.opened_at,
        "last_request_at": entry.last_request_at,
        "busy": entry.in_flight > 0,
    }


def rows_here(ledger: SessionLedger) -> list[Row]:
    """The sessions this worker holds, oldest first. On the event loop's thread (the ledger's)."""
    rows = [row for row in map(row_of, ledger.made()) if row is not None]
    return sorted(rows, key=lambda row: row["opened_at"])


async def end_here(ledger: SessionLedger, session_id: str, by: str) -> Row | None:
    """End this worker's session `session_id` for staff user `by`; its row as it was, or None if it holds none."""
    entry = ledger.find(session_id)
    row = row_of(entry) if entry is not None else None
    if entry is None or row is None:
        return None
    # Noted first, so their finished records say who ended them and how (ending the session cancels them too).
    IN_FLIGHT.cancel_session(session_id, Stopped(SESSION_ENDED, by))
    await entry.disconnect(f"disconnected from the console by {by or 'an admin'}")
    return row


def worker_of(session_id: str) -> int | None:
    """The number of the worker that opened a session, from its id (`w2-…`)."""
    tag = WORKER_TAG.match(session_id)
    return int(tag.group(1)) if tag else None


def matches(row: Row, credential: str) -> bool:
    """Whether a session is of `credential`: a principal key, or a key prefix ending in ":" (an app's users)."""
    key = str(row.get("key", ""))
    return key.startswith(credential) if credential.endswith(":") else key == credential
