"""workspace_info, workspace_install."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from mcpserver.call import ToolCall
from mcpserver.registry import tool
from mcpserver.results import ToolResult
from mcpserver.tools.terminal import exec_text

Manager = Literal["npm", "bun", "pip", "pip3", "dnf", "apt", "auto"]


@tool(title="Describe the workspace host", read_only=True, idempotent=True)
async def workspace_info(call: ToolCall) -> ToolResult:
    """OS, Node, Git, disk, working directory, available tools and memory of the host."""
    return ToolResult(await call.executor.workspace_info())


@tool(title="Install packages", destructive=True, open_world=True)
async def workspace_install(
    call: ToolCall,
    packages: Annotated[str, Field(description="Space-separated package names.")],
    manager: Annotated[Manager | None, Field(description="Package manager; default auto-detect.")] = None,
) -> ToolResult:
    """Install packages with npm, bun, pip, apt or dnf (120 s limit)."""
    result = await call.executor.install(packages.split(), manager or "auto")
    return ToolResult(exec_text(result), result.exit_code != 0, exit_code=result.exit_code)
