"""What a tool function gets besides its arguments: who is calling, the executor, and a progress channel."""

from __future__ import annotations

import logging
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

from mcp.server.mcpserver import Context

from audit.log import Actor
from audit.recordings import RECORDING_OFF, Recording, live_text
from mcpserver.executor.interface import Executor, OutputEvent
from mcpserver.live import LIVE
from mcpserver.stop_reasons import StopNote
from oauth.credentials import Principal

logger = logging.getLogger(__name__)
PRINCIPAL_KEY = "sandstorm.principal"  # where the auth middleware puts the principal in the ASGI scope
PROGRESS_CHARS = 1024  # of the newest output, in one progress notification


@dataclass
class ToolCall:
    name: str
    principal: Principal
    executor: Executor
    result_cap: int
    context: Context[Any, Any] | None = None
    call_id: str = ""  # the audit log's, once its started record is written
    recording: Recording | None = None  # of what its commands print, once its started record is written (if on)
    printed: bool = False  # whether its commands printed anything (recorded or not)
    stop_note: StopNote = field(default_factory=StopNote)  # why it was stopped, if someone stops it
    _progress: int = 0

    @property
    def wants_progress(self) -> bool:
        if self.context is None:
            return False
        meta = self.context.request_context.meta
        return meta is not None and meta.get("progress_token", meta.get("progressToken")) is not None

    async def progress(self, message: str) -> None:
        """Send a progress notification if the client asked for them (it sent a progress token)."""
        if self.context is None or not self.wants_progress:
            return
        self._progress += 1
        await self.context.report_progress(self._progress, None, message)

    async def output(self, events: list[OutputEvent], progress: bool = True) -> None:
        """A command's new output, whole: to the call's recording, the console's live view, and the newest of it as
        progress if the client asked for it."""
        if self.recording is not None:
            self.recording.write(events)
        self.printed = self.printed or any(text for _at, _code, text in events)
        text = live_text(events)
        LIVE.output(self.call_id, text)
        if progress:
            await self.progress(text[-PROGRESS_CHARS:])

    def end_recording(self) -> dict[str, Any] | None:
        """What the finished record keeps of the call's recording (None: the call printed nothing). With recording
        off, a call that printed something says so, as one left unrecorded at a full budget does."""
        if self.recording is not None:
            return self.recording.close()
        return {"unrecorded": RECORDING_OFF} if self.printed else None


def principal_from_request(request: Any) -> Principal | None:
    """The principal our auth middleware put in the ASGI scope of the HTTP request carrying this message."""
    scope = getattr(request, "scope", None)
    if not isinstance(scope, dict):
        return None
    principal = scope.get(PRINCIPAL_KEY)
    return principal if isinstance(principal, Principal) else None


def request_session(request_context: Any) -> tuple[str, str]:
    """The MCP session id and protocol version of the request carrying this message ("" where there is none)."""
    headers = getattr(request_context.request, "headers", None)
    session_id = headers.get("mcp-session-id", "") if headers is not None else ""
    return session_id, request_context.protocol_version or ""


def audit_actor(principal: Principal, session_id: str = "", protocol_version: str = "") -> Actor:
    """The principal as the audit log records it, with the MCP session and protocol version of its request."""
    return Actor(
        user_id=principal.user_id,
        username=principal.username,
        credential_kind=principal.credential_kind,
        credential_id=str(principal.credential_id),
        credential_name=principal.credential_name,
        scope=principal.scope_text,
        client_address=principal.client_address,
        user_agent=principal.user_agent,
        session_id=session_id[:128],
        protocol_version=protocol_version[:32],
    )


# Set by the tools/call middleware, flipped by dispatch: a call that never reached dispatch was refused by the SDK
# (unknown tool, arguments failing the schema) and is recorded as denied by the middleware.
_dispatch_marker: ContextVar[dict[str, bool] | None] = ContextVar("sandstorm_dispatch_marker", default=None)


def open_dispatch_marker() -> tuple[dict[str, bool], Token[dict[str, bool] | None]]:
    holder = {"dispatched": False}
    return holder, _dispatch_marker.set(holder)


def close_dispatch_marker(token: Token[dict[str, bool] | None]) -> None:
    _dispatch_marker.reset(token)


def mark_dispatched() -> None:
    holder = _dispatch_marker.get()
    if holder is not None:
        holder["dispatched"] = True
