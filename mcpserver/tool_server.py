"""The MCPServer instance: every tool registered through the one dispatch point, filtered by scope."""

from __future__ import annotations

import inspect
import logging
import typing
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ToolAnnotations

from mcpserver.call import (
    audit_actor,
    close_dispatch_marker,
    open_dispatch_marker,
    principal_from_request,
    request_session,
)
from mcpserver.dispatch import call_parts, dispatch, record_denied
from mcpserver.registry import TOOLS, ToolSpec
from mcpserver.services import Services
from mcpserver.tools import ALL_TOOL_MODULES  # noqa: F401  (importing registers the tools)

logger = logging.getLogger(__name__)
SERVER_NAME = "sandstorm"
INSTRUCTIONS = (
    "Sandstorm gives you a shell, files and git in one workspace directory on its host. Paths are relative to the "
    "workspace root. Every call is recorded in an audit log that the host's admins review."
)


def _dispatching_wrapper(spec: ToolSpec, services: Services) -> Any:
    """A function with the tool's MCP signature (its own parameters minus the ToolCall, plus the SDK's Context)."""
    hints = typing.get_type_hints(spec.fn, include_extras=True)
    params = list(inspect.signature(spec.fn).parameters.values())[1:]

    async def call_tool(ctx: Context[Any, Any], **arguments: Any) -> CallToolResult:
        return await dispatch(spec, ctx, arguments, services)

    parameters = [p.replace(annotation=hints[p.name]) for p in params]
    parameters.append(inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context))
    # A tool with an output model declares it as its return type: the SDK publishes its schema and checks each
    # result's structured content against it (the function still returns the CallToolResult dispatch made).
    returns = spec.output or CallToolResult
    call_tool.__signature__ = inspect.Signature(parameters, return_annotation=returns)  # type: ignore[attr-defined]  # read by inspect.signature; not declared on functions
    call_tool.__annotations__ = {**{p.name: p.annotation for p in parameters}, "return": returns}
    call_tool.__name__ = spec.name
    call_tool.__doc__ = spec.fn.__doc__
    return call_tool


def _annotations(spec: ToolSpec) -> ToolAnnotations:
    return ToolAnnotations(
        title=spec.title,
        read_only_hint=spec.read_only,
        destructive_hint=spec.destructive,
        idempotent_hint=spec.idempotent,
        open_world_hint=spec.open_world,
    )


async def audit_refused_calls(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """Record as denied a tools/call the SDK refused before it reached dispatch (unknown tool, bad arguments)."""
    if ctx.method != "tools/call":
        return await call_next(ctx)
    holder, token = open_dispatch_marker()
    try:
        result = await call_next(ctx)
    finally:
        close_dispatch_marker(token)
    if holder["dispatched"] or not isinstance(result, dict) or not result.get("isError"):
        return result
    principal = principal_from_request(ctx.request)
    if principal is not None:
        reason = "".join(block.get("text", "") for block in result.get("content", []) if isinstance(block, dict))
        tool, arguments = call_parts(ctx.params)
        await record_denied(audit_actor(principal, *request_session(ctx)), tool, arguments, reason)
    return result


async def hide_tools_outside_scope(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """A read-only credential sees only the tools it may call in tools/list."""
    result = await call_next(ctx)
    if ctx.method != "tools/list" or not isinstance(result, dict):  # the chain returns the serialized wire form
        return result
    principal = principal_from_request(ctx.request)
    if principal is None or not principal.read_only:
        return result
    visible = [t for t in result.get("tools", []) if TOOLS[t["name"]].visible_to_read_only]
    return {**result, "tools": visible}


def build_server(version: str, services: Services) -> MCPServer:
    server: MCPServer = MCPServer(
        SERVER_NAME,
        title="Sandstorm",
        instructions=INSTRUCTIONS,
        version=version,
        middleware=[audit_refused_calls, hide_tools_outside_scope],
    )
    for spec in TOOLS.values():
        server.add_tool(
            _dispatching_wrapper(spec, services),
            name=spec.name,
            title=spec.title,
            description=inspect.cleandoc(spec.fn.__doc__ or ""),
            annotations=_annotations(spec),
            structured_output=spec.output is not None,
        )
    return server
