"""What a tool function gets besides its arguments: who is calling, the executor, and a progress channel."""

from __future__ import annotations

import logging
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from mcp.server.mcpserver import Context

from audit.log import Actor
from mcpserver.executor.interface import Executor
from oauth.credentials import Principal

logger = logging.getLogger(__name__)


@dataclass
class ToolCall:
    name: str
    principal: Principal
    executor: Executor
    result_cap: int
    context: Context[Any, Any] | None = None
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


def principal_from_request(request: Any) -> Principal | None:
    """The principal our auth middleware put in the ASGI scope of the HTTP request carrying this message."""
    scope = getattr(request, "scope", None)
    if not isinstance(scope, dict):
        return None
    principal = scope.get("sandstorm.principal")
    return principal if isinstance(principal, Principal) else None


def actor_for(principal: Principal, context: Context[Any, Any]) -> Actor:
    """The principal as the audit log records it, with the MCP session and protocol version of this request."""
    return actor_for_request(principal, context.request_context)


def actor_for_request(principal: Principal, request_context: Any) -> Actor:
    headers = getattr(request_context.request, "headers", None)
    session_id = headers.get("mcp-session-id", "") if headers is not None else ""
    return principal_actor(principal, session_id, request_context.protocol_version or "")


def principal_actor(principal: Principal, session_id: str = "", protocol_version: str = "") -> Actor:
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


def open_dispatch_marker() -> tuple[dict[str, bool], object]:
    holder = {"dispatched": False}
    return holder, _dispatch_marker.set(holder)


def close_dispatch_marker(token: object) -> None:
    _dispatch_marker.reset(token)  # type: ignore[arg-type]


def mark_dispatched() -> None:
    holder = _dispatch_marker.get()
    if holder is not None:
        holder["dispatched"] = True
