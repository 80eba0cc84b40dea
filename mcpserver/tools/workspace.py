"""workspace_info, workspace_install."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from mcpserver.call import ToolCall
from mcpserver.registry import tool
from mcpserver.results import ToolOutput, ToolResult
from mcpserver.tools.terminal import CommandResult, exec_structured, exec_text

Manager = Literal["npm", "bun", "pip", "pip3", "dnf", "apt", "auto"]
SECTIONS = ("OS", "Node", "Git", "Disk", "CWD", "Tools", "Memory")  # workspace_info's, in their order


class InfoResult(ToolOutput):
    os: str = Field(description="The distribution's name, then `uname -srm`.")
    node: str = Field(description="`node <version>` and `npm <version>` lines, or `not installed`.")
    git: str = Field(description="`git --version`.")
    disk: str = Field(description="`df -h` of the workspace.")
    cwd: str = Field(description="The workspace root, where relative paths start.")
    tools: str = Field(description="One line per common tool: `<name>: <path>`, or `<name>: not found`.")
    memory: str = Field(description="`free -h`.")


def sections_of(text: str) -> dict[str, str]:
    """workspace_info's sections by name, read from its text: `=== <name> ===`, the section, a blank line."""
    found: dict[str, str] = {}
    for title, following in zip(SECTIONS, (*SECTIONS[1:], None), strict=True):
        start = text.index(f"=== {title} ===\n") + len(f"=== {title} ===\n")
        end = text.index(f"\n=== {following} ===\n", start) if following else len(text)
        found[title.lower()] = text[start:end].removesuffix("\n")
        text = text[end:]
    return found


@tool(title="Describe the workspace host", read_only=True, idempotent=True, output=InfoResult)
async def workspace_info(call: ToolCall) -> ToolResult:
    """OS, Node, Git, disk, working directory, available tools and memory of the host."""
    text = await call.executor.workspace_info()
    return ToolResult(text, structured=sections_of(text))


@tool(title="Install packages", destructive=True, open_world=True, output=CommandResult)
async def workspace_install(
    call: ToolCall,
    packages: Annotated[str, Field(description="Space-separated package names.")],
    manager: Annotated[Manager | None, Field(description="Package manager; default auto-detect.")] = None,
) -> ToolResult:
    """Install packages with npm, bun, pip, apt or dnf (120 s limit)."""
    result = await call.executor.install(packages.split(), manager or "auto")
    return ToolResult(exec_text(result), result.exit_code != 0, exec_structured(result), exit_code=result.exit_code)
