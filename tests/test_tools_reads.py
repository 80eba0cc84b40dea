"""file_read's image results: the largest image it returns inline fits the rendered result, its text line beside it."""

from __future__ import annotations

import base64

import pytest
from mcp_types import ImageContent, TextContent

from mcpserver.results import render
from mcpserver.tools.files import IMAGE_MAX_BYTES, image_cap, image_result


@pytest.mark.parametrize("result_cap", [65_536, 262_144, 262_145, 262_146, 262_147, 1_048_576])
def test_an_image_at_the_cap_is_sent_whole_with_its_description(result_cap: int) -> None:
    cap = image_cap(result_cap)
    raw = b"\x89PNG\r\n\x1a\n" + b"\xab" * (cap - 8)
    path = "/srv/workspace/" + "deep/" * 100 + "shot.png"
    image = {"path": path, "mime": "image/png", "size": len(raw), "data": base64.b64encode(raw).decode()}
    rendered = render(image_result(image, cap), result_cap)
    text, sent = rendered.content
    assert isinstance(text, TextContent) and text.text == f"Image {path} (image/png, {len(raw)} bytes)"
    assert isinstance(sent, ImageContent) and base64.b64decode(sent.data) == raw and sent.mime_type == "image/png"
    assert len(rendered.model_dump_json(by_alias=True, exclude_none=True)) <= result_cap


def test_the_cap_is_most_of_the_result_cap_and_at_most_5_mib() -> None:
    assert image_cap(262_144) > (262_144 - 4096) * 3 // 4
    assert image_cap(64 * 1024 * 1024) == IMAGE_MAX_BYTES == 5 * 1024 * 1024


def test_an_image_over_the_cap_is_a_text_result_with_its_size_the_cap_and_ways_to_shrink_it() -> None:
    image = {"path": "/w/big.jpg", "mime": "image/jpeg", "size": 9_000_000, "data": None}
    result = image_result(image, 195_000)
    assert not result.is_error and not result.images
    assert result.text.startswith(
        "Image /w/big.jpg (image/jpeg, 9000000 bytes) is too large to return inline: the cap is 195000 bytes."
    )
    assert "convert" in result.text and "terminal_exec" in result.text
