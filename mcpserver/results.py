"""Tool results and the byte cap on what is sent back.

The official Python client drops any server-sent event over 1 MiB (the call is then lost, not truncated), so the
serialized result, structured copy and JSON escaping included, is capped at SANDSTORM_RESULT_CAP bytes.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from mcp_types import CallToolResult, ContentBlock, ImageContent, TextContent
from pydantic import BaseModel, ConfigDict

from mcpserver.executor.textsize import cut_suffix_to_json_size, cut_to_json_size, json_size

# Room for the JSON-RPC envelope, content block keys and the omission marker.
ENVELOPE_BYTES = 1024


class ToolOutput(BaseModel):
    """The model of a tool's structured result, published as its outputSchema. Every key is declared and typed as
    JSON Schema reads it (no extra keys, no coercion), so the SDK's check of each result before it leaves fails on
    what a client's validator would refuse."""

    model_config = ConfigDict(extra="forbid", strict=True)


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


def _string_leaves(value: Any) -> list[tuple[Any, Any]]:
    """(container, key) of every string inside `value`'s dicts and lists."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    leaves: list[tuple[Any, Any]] = []
    for key, item in items:
        leaves += [(value, key)] if isinstance(item, str) else _string_leaves(item)
    return leaves


def fit_structured(structured: dict[str, Any], room: int) -> dict[str, Any]:
    """`structured`, or a copy whose longest strings are cut to one length (head and tail kept, saying how much was
    left out) so that it serializes within `room` bytes, or as far as cutting strings can take it. Its keys and
    types stay, so it still matches its schema."""
    over = _structured_size(structured) - room
    fitted, more = structured, 0
    for _ in range(3 if over > 0 else 0):  # the omission markers take room too: a second try makes up for them
        fitted = copy.deepcopy(structured)
        leaves = _string_leaves(fitted)
        sizes = [json_size(container[key]) for container, key in leaves]
        level = _waterline(sizes, over + more)
        for (container, key), size in zip(leaves, sizes, strict=True):
            if size > level:
                container[key] = fit_text(container[key], level)
        left = _structured_size(fitted) - room
        if left <= 0:
            break
        more += left
    return fitted


def _waterline(sizes: list[int], excess: int) -> int:
    """The largest length that, every size above it cut to it, removes at least `excess` (0 if none does)."""
    low, high = 0, max(sizes, default=0)
    while low < high:
        middle = (low + high + 1) // 2
        if sum(size - middle for size in sizes if size > middle) >= excess:
            low = middle
        else:
            high = middle - 1
    return low


def render(result: ToolResult, cap: int, keep_structured: bool = False) -> CallToolResult:
    """The MCP result for `result`, guaranteed to serialize within `cap` bytes.

    `keep_structured`: the tool publishes an outputSchema, so its structured content is never dropped. A copy over
    half the room (a command's output, carried twice) gives way to the text: the text gets all the room but what the
    copy's facts need, and the copy's longest strings are cut to what the text leaves. Otherwise a copy that would
    crowd out the text is left out: the text says everything.
    """
    structured = result.structured
    images = [image for image in result.images if len(image.data) + ENVELOPE_BYTES <= cap - ENVELOPE_BYTES]
    budget = cap - ENVELOPE_BYTES - sum(len(image.data) + ENVELOPE_BYTES for image in images)
    size = _structured_size(structured)
    if not keep_structured and size > budget // 2:
        structured, size = None, 0
    reserve = size
    if structured is not None and size > budget // 2:
        reserve = _structured_size(fit_structured(structured, 0))  # the copy's facts, its strings cut to markers
    text = fit_text(result.text, max(budget - reserve, 0))
    if structured is not None and size > budget - json_size(text):
        structured = fit_structured(structured, budget - json_size(text))
    content: list[ContentBlock] = [TextContent(type="text", text=text)]
    content += [ImageContent(type="image", data=image.data, mime_type=image.mime_type) for image in images]
    return CallToolResult(content=content, structured_content=structured, is_error=result.is_error)
