"""The tool calls running in this process, each in a cancel scope of its own, so that a call can be cancelled from
outside its request: when its client hangs up (by MCP session and JSON-RPC request id), or when its credential is
revoked (by principal key, for calls started before the revocation)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import anyio
from django.utils import timezone

from mcpserver.stop_reasons import DISCONNECT, SHUTDOWN, StopNote, Stopped


@dataclass(eq=False)
class InFlightCall:
    key: str  # the principal's key (credential)
    session_id: str
    request_id: str
    scope: anyio.CancelScope
    note: StopNote = field(default_factory=StopNote)  # why it was stopped, for its finished record
    started_at: datetime = field(default_factory=timezone.now)


class InFlightCalls:
    """Registry of running calls. Used on the event loop's thread only (hand calls over with call_soon_threadsafe)."""

    def __init__(self) -> None:
        self._calls: set[InFlightCall] = set()

    def register(
        self, key: str, session_id: str, request_id: str, scope: anyio.CancelScope, note: StopNote | None = None
    ) -> InFlightCall:
        call = InFlightCall(key, session_id, request_id, scope, note or StopNote())
        self._calls.add(call)
        return call

    def unregister(self, call: InFlightCall) -> None:
        self._calls.discard(call)

    def __len__(self) -> int:
        return len(self._calls)

    def cancel_request(self, session_id: str, request_ids: set[str]) -> int:
        """Cancel the calls of these JSON-RPC requests of one MCP session. Returns how many."""
        chosen = lambda call: call.session_id == session_id and call.request_id in request_ids  # noqa: E731
        return self._cancel(chosen, Stopped(DISCONNECT))

    def cancel_session(self, session_id: str, reason: Stopped) -> int:
        """Cancel every call of one MCP session (the console disconnected it). Returns how many."""
        return self._cancel(lambda call: call.session_id == session_id, reason)

    def cancel_credentials(self, covers: Callable[[str], bool], started_before: datetime, reason: Stopped) -> int:
        """Cancel the calls of revoked credentials (`covers(key)`) that started before the revocation."""
        return self._cancel(lambda call: call.started_at < started_before and covers(call.key), reason)

    def cancel_all(self) -> int:
        """Cancel every running call (the server is stopping). Returns how many."""
        return self._cancel(lambda call: True, Stopped(SHUTDOWN))

    def _cancel(self, chosen: Callable[[InFlightCall], bool], reason: Stopped) -> int:
        calls = [call for call in self._calls if chosen(call)]
        for call in calls:
            call.note.stop(call.scope, reason)
        return len(calls)


IN_FLIGHT = InFlightCalls()
