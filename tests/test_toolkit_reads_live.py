"""file_read's line numbers and images over MCP against the live server, through the SDK client in both eras."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

import pytest
from mcp_types import ImageContent, TextContent

from mcpserver.tools.files import image_cap
from tests.live import LiveServer, mcp_client, text_of
from tests.pictures import tiny_png

pytestmark = [pytest.mark.live, pytest.mark.anyio]

RESULT_CAP = 262144  # the live server's (SANDSTORM_RESULT_CAP's default)
ERAS = ["legacy", "2026-07-28"]


@pytest.mark.parametrize("mode", ERAS)
async def test_line_numbers_prefix_the_files_own_numbers_from_the_offset(
    live_server: LiveServer, tool_token: str, workspace_dir: Path, mode: str
) -> None:
    (workspace_dir / "n.txt").write_text("".join(f"line {i}\n" for i in range(1, 13)))
    async with mcp_client(live_server.mcp_url, tool_token, mode=mode) as client:
        numbered = await client.call_tool(
            "file_read", {"path": str(workspace_dir / "n.txt"), "offset": 9, "limit": 2, "line_numbers": True}
        )
        plain = await client.call_tool("file_read", {"path": str(workspace_dir / "n.txt"), "offset": 11})
    assert not numbered.is_error
    assert text_of(numbered) == (
        "     9\tline 9\n    10\tline 10\n[lines 9-10 of 12; call file_read with offset=11 to read on]"
    )
    assert text_of(plain) == "line 11\nline 12\n"


@pytest.mark.parametrize("mode", ERAS)
async def test_a_png_comes_back_as_image_content_whatever_its_name(
    live_server: LiveServer, tool_token: str, workspace_dir: Path, mode: str
) -> None:
    png = tiny_png()
    (workspace_dir / "shot.txt").write_bytes(png)  # the name lies; the first bytes say PNG
    (workspace_dir / "fake.png").write_text("not a picture\n")
    async with mcp_client(live_server.mcp_url, tool_token, mode=mode) as client:
        result = await client.call_tool("file_read", {"path": str(workspace_dir / "shot.txt"), "line_numbers": True})
        fake = await client.call_tool("file_read", {"path": str(workspace_dir / "fake.png")})
    assert not result.is_error
    text, image = result.content
    assert (
        isinstance(text, TextContent)
        and text.text == f"Image {workspace_dir / 'shot.txt'} (image/png, {len(png)} bytes)"
    )
    assert isinstance(image, ImageContent) and image.mime_type == "image/png"
    assert base64.b64decode(image.data) == png
    assert text_of(fake) == "not a picture\n" and len(fake.content) == 1


async def test_an_image_over_the_cap_is_a_text_result_saying_so(
    live_server: LiveServer, tool_token: str, workspace_dir: Path
) -> None:
    cap = image_cap(RESULT_CAP)
    big = workspace_dir / "big.png"
    big.write_bytes(tiny_png() + b"\x00" * cap)
    async with mcp_client(live_server.mcp_url, tool_token, mode="2026-07-28") as client:
        result = await client.call_tool("file_read", {"path": str(big)})
    assert not result.is_error and len(result.content) == 1
    assert text_of(result).startswith(
        f"Image {big} (image/png, {big.stat().st_size} bytes) is too large to return inline: the cap is {cap} bytes."
    )


async def test_an_image_through_a_symlink_out_of_the_workspace_is_refused(
    live_server: LiveServer, tool_token: str, workspace_dir: Path, tmp_path: Path
) -> None:
    secret = tmp_path / f"secret-{uuid.uuid4().hex[:8]}.png"
    secret.write_bytes(tiny_png())
    (workspace_dir / "peek.png").symlink_to(secret)
    async with mcp_client(live_server.mcp_url, tool_token) as client:
        linked = await client.call_tool("file_read", {"path": str(workspace_dir / "peek.png")})
        direct = await client.call_tool("file_read", {"path": str(secret)})
    for result in (linked, direct):
        assert result.is_error and "is outside the allowed directory" in text_of(result)
        assert not any(isinstance(block, ImageContent) for block in result.content)


@pytest.mark.parametrize("mode", ERAS)
async def test_a_read_only_token_may_read_an_image(live_server: LiveServer, workspace_dir: Path, mode: str) -> None:
    token = live_server.create_token(f"reads-{uuid.uuid4().hex[:8]}", scope="mcp:read")
    (workspace_dir / "pic.png").write_bytes(tiny_png())
    async with mcp_client(live_server.mcp_url, token, mode=mode) as client:
        result = await client.call_tool("file_read", {"path": str(workspace_dir / "pic.png")})
    assert not result.is_error
    text, image = result.content
    assert isinstance(text, TextContent) and isinstance(image, ImageContent)
    assert base64.b64decode(image.data) == tiny_png()
