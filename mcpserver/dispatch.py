"""The one dispatch point every tool call passes through: scope, concurrency, errors and the result cap.

Whatever must happen around every call (the audit log, for one) belongs here and nowhere else.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult

from mcpserver.call import ToolCall, principal_from_request
from mcpserver.executor.interface import ToolFailure
from mcpserver.registry import ToolSpec
from mcpserver.results import ToolResult, render
from mcpserver.runtime import get_runtime
from oauth.credentials import Principal
from oauth.models import SCOPE_READ

logger = logging.getLogger(__name__)


def scope_refusal(spec: ToolSpec, principal: Principal, arguments: Mapping[str, Any]) -> str | None:
    """The error text if this credential's scope does not allow this call, else None."""
    if not principal.read_only:
        return None
    refused = spec.read_only_refusal(arguments)
    if refused is None:
        return None
    return f"Error: this credential's scope ({SCOPE_READ}) does not allow {refused}"


async def dispatch(spec: ToolSpec, context: Context[Any, Any], arguments: dict[str, Any]) -> CallToolResult:
    runtime = get_runtime()
    principal = principal_from_request(context.request_context.request)
    if principal is None:  # only reachable if the endpoint were mounted without our auth middleware
        return render(ToolResult.error("Error: this request carries no credential"), runtime.result_cap)
    refusal = scope_refusal(spec, principal, arguments)
    if refusal is not None:
        return render(ToolResult.error(refusal), runtime.result_cap)
    if not runtime.concurrency.try_acquire(principal.key):
        limit = runtime.concurrency.limit
        text = f"Error: this credential already has {limit} tool calls running (the limit); wait for one to finish"
        return render(ToolResult.error(text), runtime.result_cap)
    try:
        result = await _run(spec, ToolCall(spec.name, principal, runtime.executor, runtime.result_cap, context), arguments)
    finally:
        runtime.concurrency.release(principal.key)
    return render(result, runtime.result_cap)


async def _run(spec: ToolSpec, call: ToolCall, arguments: dict[str, Any]) -> ToolResult:
    try:
        return await spec.fn(call, **arguments)
    except ToolFailure as failure:
        return ToolResult.error(str(failure))
    except Exception:
        # The tool boundary: an unexpected failure becomes an error result; details go to the server log only.
        logger.exception("tool %s failed unexpectedly", spec.name)
        return ToolResult.error(f"Error: {spec.name} failed unexpectedly; the server log has the details")

