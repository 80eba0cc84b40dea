"""The MCPServer instance: every tool registered through the one dispatch point, filtered by scope."""

from __future__ import annotations

import inspect
import logging
import typing
from collections.abc import Mapping
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult, ToolAnnotations
from mcp_types.version import is_version_at_least

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
# "Resource not found" up to 2025-11-25; 2026-07-28 answers -32602 instead and retires this code (SEP-2164).
RESOURCE_NOT_FOUND_BEFORE_2026 = -32002


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
    """Record as denied a tools/call refused before it reached dispatch: a tool this server does not have, answered
    here with the protocol error the specification gives (-32602, "Unknown tool: …"; the SDK would answer a tool
    result with isError), and arguments the SDK's validation refused."""
    if ctx.method != "tools/call":
        return await call_next(ctx)
    unknown = unknown_tool(ctx.params)
    if unknown is not None:
        reason = f"Unknown tool: {unknown}"
        await record_refusal(ctx, reason)
        raise MCPError(INVALID_PARAMS, reason)
    holder, token = open_dispatch_marker()
    try:
        result = await call_next(ctx)
    finally:
        close_dispatch_marker(token)
    if holder["dispatched"] or not isinstance(result, dict) or not result.get("isError"):
        return result
    reason = "".join(block.get("text", "") for block in result.get("content", []) if isinstance(block, dict))
    await record_refusal(ctx, reason)
    return result


def unknown_tool(params: Mapping[str, Any] | None) -> str | None:
    """The name a tools/call asks for if no tool has it (None for a known tool, or no name: the SDK refuses that)."""
    name = params.get("name") if isinstance(params, Mapping) else None
    return name if isinstance(name, str) and name not in TOOLS else None


async def record_refusal(ctx: ServerRequestContext[Any, Any], reason: str) -> None:
    principal = principal_from_request(ctx.request)
    if principal is not None:
        tool, arguments = call_parts(ctx.params)
        await record_denied(audit_actor(principal, *request_session(ctx)), tool, arguments, reason)


class UnknownNames:
    """Answers a prompts/get or resources/read naming what this server does not have with the error the request's
    revision of the specification gives:

    - an unknown prompt: -32602 "Unknown prompt: …" (the SDK answers code 0 in a 2025-11-25 session and -32603 in a
      2026-07-28 request, each with an ERROR traceback in the log);
    - an unknown resource: "Unknown resource: …" with `data.uri`, as -32002 up to 2025-11-25 and -32602 from
      2026-07-28 (the SDK answers -32602 in both).
    """

    def __init__(self, server: MCPServer) -> None:
        self.server = server

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params if isinstance(ctx.params, Mapping) else {}
        name, uri = params.get("name"), params.get("uri")
        if ctx.method == "prompts/get" and isinstance(name, str) and not await self.has_prompt(name):
            raise MCPError(INVALID_PARAMS, f"Unknown prompt: {name}")
        if ctx.method == "resources/read" and isinstance(uri, str) and not await self.may_have_resource(uri):
            raise MCPError(resource_not_found_code(ctx.protocol_version), f"Unknown resource: {uri}", {"uri": uri})
        return await call_next(ctx)

    async def has_prompt(self, name: str) -> bool:
        return any(prompt.name == name for prompt in await self.server.list_prompts())

    async def may_have_resource(self, uri: str) -> bool:
        """Whether a listed resource has this URI, or a resource template might make one (the SDK then decides)."""
        if await self.server.list_resource_templates():
            return True
        return any(str(resource.uri) == uri for resource in await self.server.list_resources())


def resource_not_found_code(protocol_version: str) -> int:
    return INVALID_PARAMS if is_version_at_least(protocol_version, "2026-07-28") else RESOURCE_NOT_FOUND_BEFORE_2026


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
    server.middleware.append(UnknownNames(server))
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
