"""How a credential's page says how many MCP sessions it holds open, linking to them.

oauth sits below the MCP server and knows nothing of its sessions; the MCP server registers how to count them and
where they are listed at start-up (mcpserver.apps). Unregistered (a process without it), the pages say nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from oauth.credentials import app_key_prefix, bearer_key

# A principal key, or a key prefix ending in ":" (every user of an app) -> its open sessions, None if unknown here.
SessionCount = Callable[[str], int | None]
# The same -> the URL of the page that lists them.
SessionPage = Callable[[str], str]

_registered: tuple[SessionCount, SessionPage] | None = None


@dataclass(frozen=True)
class OpenSessions:
    count: int
    url: str


def register_session_links(count: SessionCount, page: SessionPage) -> None:
    global _registered
    _registered = (count, page)


def open_sessions(credential: str) -> OpenSessions | None:
    if _registered is None:
        return None
    count, page = _registered
    found = count(credential)
    return None if found is None else OpenSessions(found, page(credential))


def bearer_sessions(token_id: int) -> OpenSessions | None:
    return open_sessions(bearer_key(token_id))


def app_sessions(application_id: int) -> OpenSessions | None:
    return open_sessions(app_key_prefix(application_id))
