"""The tool table: every tool's function, annotations and what a read-only credential may do with it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mcpserver.results import ToolOutput, ToolResult

# Given a call's arguments, the scope error suffix for a read-only credential (None: the call is read-only).
ReadOnlyCheck = Callable[[Mapping[str, Any]], str | None]
ToolFunction = Callable[..., Awaitable[ToolResult]]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    fn: ToolFunction
    title: str
    read_only: bool
    destructive: bool
    idempotent: bool
    open_world: bool
    # A tool that is read-only for some arguments only (git_branch lists without `name`, creates with it).
    read_only_when: ReadOnlyCheck | None = None
    # The model of the tool's structured result (its outputSchema); None for a tool whose result is a document (a
    # file, a listing, git's own output) that a structured copy could only repeat (docs/tools.md says which).
    output: type[ToolOutput] | None = None

    @property
    def visible_to_read_only(self) -> bool:
        return self.read_only or self.read_only_when is not None

    def read_only_refusal(self, arguments: Mapping[str, Any]) -> str | None:
        """What a read-only credential may not do with these arguments, or None if it may."""
        if self.read_only:
            return None
        if self.read_only_when is not None:
            return self.read_only_when(arguments)
        return self.name


TOOLS: dict[str, ToolSpec] = {}


def tool(
    *,
    title: str,
    read_only: bool = False,
    destructive: bool = False,
    idempotent: bool = False,
    open_world: bool = False,
    read_only_when: ReadOnlyCheck | None = None,
    output: type[ToolOutput] | None = None,
) -> Callable[[ToolFunction], ToolFunction]:
    """Register a tool. Its first parameter is the ToolCall; the others are the MCP arguments.

    A tool with an `output` model publishes it as its outputSchema, and every result it returns without an error
    carries `structured` in that shape (the SDK checks it before the result leaves). Claude Code, Codex and other
    clients show the model the structured copy instead of the text when there is one, so what the copy leaves out
    of the text, their models do not see: a copy holds the text's facts and any output it carries (render() cuts a
    copy that would not fit beside the text, never the text for it).
    """

    def register(fn: ToolFunction) -> ToolFunction:
        name = fn.__name__
        if name in TOOLS:
            raise ValueError(f"tool {name} registered twice")
        TOOLS[name] = ToolSpec(name, fn, title, read_only, destructive, idempotent, open_world, read_only_when, output)
        return fn

    return register
