"""What a tool function gets besides its arguments: who is calling, the executor, and a progress channel."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from mcp.server.mcpserver import Context

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
