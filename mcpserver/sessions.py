"""How many MCP sessions (2025-11-25, `Mcp-Session-Id`) each credential and each user may hold open in this process
(mcpserver.shared_limits.SharedSessionLedger counts them over every worker of an installation, in Redis).

The SDK's session table is one for everybody (10,000 sessions, each closed after 30 idle minutes), so one
credential opening sessions in a loop filled it and every other client got 503. Here:

- **Per credential** (a bearer token, or an OAuth client for one user: the principal's key, the same key the rate
  limit and revocation use, and which a refreshing client keeps): at most `per_credential` open sessions. One more
  ends that credential's own least recently used idle session instead of being refused, so a client that reconnects
  often without closing its sessions (a restarted agent) keeps working, and a credential can only ever push out its
  own sessions. If every one of them is busy (a request in flight), the new one is refused with 429.
- **Per user** (over all of a user's credentials): at most `per_user`, so that many tokens of one user cannot fill
  the table either; at the cap a new session may again only replace an idle one of its own credential, else 429.
- A session that makes no request beyond the handshake (`initialize`, `notifications/initialized`) within
  `unused_timeout` seconds is closed, so a flood of opened-and-forgotten sessions does not wait 30 minutes.

The SDK makes a session's transport (our SandstormTransport) while it admits the opening request; the request's
reservation reaches it through a context variable, and the transport reports its requests and its end here. Each
session also keeps who opened it, from where, and when it was last asked anything: the console's page of open
sessions lists them (mcpserver.open_sessions) and may end one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from mcpserver.limits import CallSlot

if TYPE_CHECKING:
    from oauth.credentials import Principal  # models: not importable before Django is set up

logger = logging.getLogger(__name__)
HANDSHAKE_METHODS = frozenset({"initialize", "notifications/initialized"})


class SessionTransport(Protocol):
    mcp_session_id: str | None
    idle_scope: Any  # anyio.CancelScope | None: cancelling it ends the session (the SDK's idle timeout does so)

    async def terminate(self) -> None: ...  # from now on every request to the session is answered 404


@dataclass(eq=False)
class OpenSession:
    """One session of one credential: reserved by its opening request, bound to the transport the SDK makes."""

    ledger: SessionLedger
    key: str
    user_id: int
    transport: SessionTransport | None = None
    in_flight: int = 0
    used: bool = False
    closed: bool = False
    last_active: float = field(default_factory=time.monotonic)
    lease: CallSlot | None = None  # its place in the caps of every worker (mcpserver.shared_limits), if shared
    principal: Principal | None = None  # who opened it, from where (set by mcpserver.endpoint)
    opened_at: float = field(default_factory=time.time)  # wall-clock times, for the console
    last_request_at: float = field(default_factory=time.time)
    _expiry: asyncio.TimerHandle | None = None

    @property
    def idle(self) -> bool:
        return self.transport is not None and self.in_flight == 0 and not self.closed

    def bind(self, transport: SessionTransport) -> None:
        self.transport = transport
        loop = asyncio.get_running_loop()
        self._expiry = loop.call_later(self.ledger.unused_timeout, self._close_if_unused)

    def request_started(self) -> None:
        self.in_flight += 1
        self.last_request_at = time.time()

    def request_ended(self) -> None:
        self.in_flight -= 1
        self.last_active = time.monotonic()

    def note_body(self, body: bytes) -> None:
        """Mark the session used once a request goes beyond the handshake (parsed only until then)."""
        if not self.used and goes_beyond_handshake(body):
            self.used = True

    def release(self) -> None:
        """The session has ended (or was never made): its place is free. Idempotent."""
        if self._expiry is not None:
            self._expiry.cancel()
        self.ledger.forget(self)

    def end(self, why: str) -> None:
        """End the session as the SDK's idle timeout would: it then answers 404 and the client starts a new one."""
        self.release()
        transport = self.transport
        scope = transport.idle_scope if transport is not None else None
        if transport is not None and scope is not None:
            logger.info("closing MCP session %s of %s: %s", transport.mcp_session_id, self.key, why)
            scope.cancel()

    async def disconnect(self, why: str) -> None:
        """End the session at once (the console's Disconnect): as `end`, and its transport answers every later
        request 404 from now, as after a client's DELETE, not only once the session's task has wound down (which
        waits for its running calls to be cancelled)."""
        transport = self.transport
        self.end(why)
        if transport is not None:
            await transport.terminate()

    def _close_if_unused(self) -> None:
        if not self.used and not self.closed:
            self.end(f"no request beyond the handshake within {self.ledger.unused_timeout:g} s")


class SessionLedger:
    """The open sessions of this process by credential and by user. Used on the event loop's thread only."""

    def __init__(self, *, per_credential: int, per_user: int, unused_timeout: float) -> None:
        self.per_credential = per_credential
        self.per_user = per_user
        self.unused_timeout = unused_timeout
        self._by_key: dict[str, list[OpenSession]] = {}
        self._per_user: dict[int, int] = {}
        self._releasing: set[asyncio.Task[None]] = set()

    def open_count(self, key: str) -> int:
        return len(self._by_key.get(key, ()))

    def admit(self, key: str, user_id: int) -> OpenSession | None:
        """Reserve a place for a new session of `key`, ending its least recently used idle session if it is at a
        cap; None if it is at a cap with every session busy."""
        mine = self._by_key.get(key, [])
        if len(mine) >= self.per_credential or self._per_user.get(user_id, 0) >= self.per_user:
            if self.end_idle(key) is None:
                return None
        return self.add(key, user_id)

    async def open(self, key: str, user_id: int) -> OpenSession | str:
        """`admit`, or why not (for the 429)."""
        entry = self.admit(key, user_id)
        return entry if entry is not None else self.refusal(self.open_count(key) >= self.per_credential)

    def refusal(self, credential_full: bool) -> str:
        if credential_full:
            return f"this credential has {self.per_credential} MCP sessions open, all of them busy"
        return f"this credential's user has {self.per_user} MCP sessions open"

    def add(self, key: str, user_id: int) -> OpenSession:
        entry = OpenSession(self, key, user_id)
        self._by_key.setdefault(key, []).append(entry)
        self._per_user[user_id] = self._per_user.get(user_id, 0) + 1
        return entry

    def end_idle(self, key: str) -> OpenSession | None:
        """End the least recently used idle session of `key` held here, to make room for a new one; which, if any."""
        idle = [entry for entry in self._by_key.get(key, ()) if entry.idle]
        if not idle:
            return None
        oldest = min(idle, key=lambda entry: entry.last_active)
        oldest.end("its credential opened a new session at its cap")
        return oldest

    def made(self) -> list[OpenSession]:
        """The open sessions of this process that the SDK made (a reservation still being admitted has none)."""
        return [entry for mine in self._by_key.values() for entry in mine if entry.transport is not None]

    def find(self, session_id: str) -> OpenSession | None:
        """The open session with this `Mcp-Session-Id` held by this process, if any."""
        return next(
            (entry for entry in self.made() if entry.transport and entry.transport.mcp_session_id == session_id), None
        )

    def forget(self, entry: OpenSession) -> None:
        if entry.closed:
            return
        entry.closed = True
        mine = self._by_key.get(entry.key, [])
        mine.remove(entry)
        if not mine:
            self._by_key.pop(entry.key, None)
        left = self._per_user[entry.user_id] - 1
        if left:
            self._per_user[entry.user_id] = left
        else:
            del self._per_user[entry.user_id]
        if entry.lease is not None:
            task = asyncio.get_running_loop().create_task(entry.lease.release())
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)


def goes_beyond_handshake(body: bytes) -> bool:
    """Whether a POSTed JSON-RPC body (one message or a batch) holds anything but the handshake's messages."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return False
    messages = parsed if isinstance(parsed, list) else [parsed]
    return any(not isinstance(message, dict) or message.get("method") not in HANDSHAKE_METHODS for message in messages)


# The reservation of the request being admitted, for the transport the SDK makes for it (mcpserver.transport).
OPENING: ContextVar[OpenSession | None] = ContextVar("sandstorm_opening_session", default=None)
