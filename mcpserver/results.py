"""Tool results and the byte cap on what is sent back.

The official Python client drops any server-sent event over 1 MiB (the call is then lost, not truncated), so the
serialized result, structured copy and JSON escaping included, is capped at SANDSTORM_RESULT_CAP bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mcp_types import CallToolResult, ContentBlock, ImageContent, TextContent

from mcpserver.executor.textsize import cut_suffix_to_json_size, cut_to_json_size, json_size

# Room for the JSON-RPC envelope, content block keys and the omission marker.
ENVELOPE_BYTES = 1024


@dataclass(frozen=True)
class Image:
    """An image content block: base64 data (already within the result cap) and its MIME type."""

    data: str
    mime_type: str


@dataclass
class ToolResult:
    text: str
    is_error: bool = False
    structured: dict[str, Any] | None = None
    exit_code: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    images: list[Image] = field(default_factory=list)

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


def render(result: ToolResult, cap: int, keep_structured: bool = False) -> CallToolResult:
    """The MCP result for `result`, guaranteed to serialize within `cap` bytes.

    `keep_structured`: the tool publishes an outputSchema, so its structured content is never dropped (such tools
    keep it small); otherwise a copy that would crowd out the text is left out, the text says everything.
    """
    structured = result.structured
    images = [image for image in result.images if len(image.data) + ENVELOPE_BYTES <= cap - ENVELOPE_BYTES]
    budget = cap - ENVELOPE_BYTES - sum(len(image.data) + ENVELOPE_BYTES for image in images)
    if not keep_structured and _structured_size(structured) > budget // 2:
        structured = None
    text = fit_text(result.text, max(budget - _structured_size(structured), 0))
    content: list[ContentBlock] = [TextContent(type="text", text=text)]
    content += [ImageContent(type="image", data=image.data, mime_type=image.mime_type) for image in images]
    return CallToolResult(content=content, structured_content=structured, is_error=result.is_error)
