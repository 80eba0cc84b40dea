"""Tool results and the byte cap on what is sent back.

The official Python client drops any server-sent event over 1 MiB (the call is then lost, not truncated), so the
serialized result, structured copy and JSON escaping included, is capped at SANDSTORM_RESULT_CAP bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mcp_types import CallToolResult, TextContent

from mcpserver.executor.textsize import cut_suffix_to_json_size, cut_to_json_size, json_size

# Room for the JSON-RPC envelope, content block keys and the omission marker.
ENVELOPE_BYTES = 1024


@dataclass
class ToolResult:
    text: str
    is_error: bool = False
    structured: dict[str, Any] | None = None
    exit_code: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def error(cls, text: str) -> ToolResult:
        return cls(text=text, is_error=True)


def fit_text(text: str, budget: int, where: str = "") -> str:
    """`text` cut to `budget` JSON bytes keeping its head and tail, with a line saying what was left out."""
    if json_size(text) <= budget:
        return text
    omitted_hint = f"; {where}" if where else ""
    marker = f"\n[... {{}} characters omitted{omitted_hint} ...]\n"
    room = max(budget - json_size(marker.format(len(text))), 0)
    head = cut_to_json_size(text, room // 2)
    tail = cut_suffix_to_json_size(text[len(head) :], room - json_size(head))
    return head + marker.format(len(text) - len(head) - len(tail)) + tail


def _structured_size(structured: dict[str, Any] | None) -> int:
    if structured is None:
        return 0
    return len(json.dumps(structured, ensure_ascii=False).encode("utf-8"))


def render(result: ToolResult, cap: int) -> CallToolResult:
    """The MCP result for `result`, guaranteed to serialize within `cap` bytes."""
    structured = result.structured
    budget = cap - ENVELOPE_BYTES
    if _structured_size(structured) > budget // 2:
        structured = None  # the text says everything; never let the copy crowd it out
    text = fit_text(result.text, budget - _structured_size(structured))
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=structured, is_error=result.is_error
    )
