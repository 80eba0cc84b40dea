"""file_read, file_write, file_delete, file_list, file_move, file_mkdir."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from mcpserver.call import ToolCall
from mcpserver.registry import tool
from mcpserver.results import ENVELOPE_BYTES, ToolResult

PathArg = Annotated[str, Field(description="Absolute, or relative to the workspace root; must stay inside it.")]


@tool(title="Read a file", read_only=True, idempotent=True)
async def file_read(
    call: ToolCall,
    path: PathArg,
    offset: Annotated[int | None, Field(description="First line to return (1-based).")] = None,
    limit: Annotated[int | None, Field(description="Number of lines to return.")] = None,
) -> ToolResult:
    """Read a text file from the workspace. Large files are returned in pages: use offset and limit to read on."""
    budget = call.result_cap - 2 * ENVELOPE_BYTES
    return ToolResult(await call.executor.read_file(path, offset, limit, budget))


@tool(title="Write a file", destructive=True, idempotent=True)
async def file_write(call: ToolCall, path: PathArg, content: str) -> ToolResult:
    """Write text to a file in the workspace, replacing it if it exists; parent folders are created."""
    return ToolResult(await call.executor.write_file(path, content))


@tool(title="Delete a file", destructive=True, idempotent=True)
async def file_delete(call: ToolCall, path: PathArg) -> ToolResult:
    """Delete a file (not a directory) in the workspace. A missing file is not an error."""
    return ToolResult(await call.executor.delete_file(path))


@tool(title="List a directory", read_only=True, idempotent=True)
async def file_list(
    call: ToolCall,
    path: Annotated[str, Field(description="Directory to list; empty means the workspace root.")] = "",
    recursive: Annotated[bool, Field(description="List the tree (5 levels, 500 lines at most).")] = False,
) -> ToolResult:
    """List a directory like `ls -la`, or its tree (one path a line) when recursive."""
    return ToolResult(await call.executor.list_dir(path, recursive))


@tool(title="Move or rename", destructive=True)
async def file_move(call: ToolCall, source: PathArg, dest: PathArg) -> ToolResult:
    """Move or rename a file or directory inside the workspace; the destination's parent is created."""
    return ToolResult(await call.executor.move(source, dest))


@tool(title="Create a directory", idempotent=True)
async def file_mkdir(call: ToolCall, path: PathArg) -> ToolResult:
    """Create a directory and its parents; no error if it exists."""
    return ToolResult(await call.executor.mkdir(path))
