"""file_edit and file_multi_edit over MCP against the live server, in both protocol eras: the diff and structured
result, the diagnostics, the refusals (binary, escapes) and a read-only credential's."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from tests.live import LiveServer, mcp_client, text_of

pytestmark = [pytest.mark.live, pytest.mark.anyio]

OUTSIDE = "is outside the allowed directory"


@pytest.fixture(params=["legacy", "2026-07-28"])
async def client(request: pytest.FixtureRequest, live_server: LiveServer, tool_token: str) -> AsyncIterator[Client]:
    async with mcp_client(live_server.mcp_url, tool_token, mode=request.param) as connected:
        yield connected


async def call(client: Client, tool: str, **arguments: Any) -> tuple[str, bool, dict[str, Any] | None]:
    result = await client.call_tool(tool, arguments)
    return text_of(result), bool(result.is_error), result.structured_content


async def test_file_edit_replaces_and_answers_with_the_unified_diff(client: Client, workspace_dir: Path) -> None:
    target = workspace_dir / "app.py"
    target.write_text("def main():\n    print('hi')\n    return 0\n")
    text, is_error, structured = await call(
        client, "file_edit", path=str(target), old_string="'hi'", new_string="'hello'"
    )
    assert not is_error
    assert text == (
        f"--- {target}\n+++ {target}\n@@ -1,3 +1,3 @@\n def main():\n-    print('hi')\n+    print('hello')\n     return 0\n"
    )
    assert structured == {"path": str(target), "replacements": 1, "diff_truncated": False}
    assert target.read_text() == "def main():\n    print('hello')\n    return 0\n"


async def test_file_edit_without_a_match_shows_the_closest_region_and_what_differs(
    client: Client, workspace_dir: Path
) -> None:
    target = workspace_dir / "tabs.py"
    target.write_text("if x:\n\treturn 1\n")
    text, is_error, _ = await call(
        client, "file_edit", path=str(target), old_string="if x:\n    return 1", new_string="y"
    )
    assert is_error and text.startswith(f"Error: {target}: old_string not found")
    assert "lines 1-2" in text and "indentation: tabs vs spaces" in text
    assert target.read_text() == "if x:\n\treturn 1\n"


async def test_file_edit_with_several_matches_lists_their_lines_and_replace_all_replaces_them(
    client: Client, workspace_dir: Path
) -> None:
    target = workspace_dir / "many.txt"
    target.write_text("a\nb\na\n")
    text, is_error, _ = await call(client, "file_edit", path=str(target), old_string="a", new_string="c")
    assert is_error and "occurs 2 times (at lines 1, 3)" in text
    text, is_error, structured = await call(
        client, "file_edit", path=str(target), old_string="a", new_string="c", replace_all=True
    )
    assert not is_error and structured is not None and structured["replacements"] == 2
    assert target.read_text() == "c\nb\nc\n"


async def test_file_multi_edit_is_all_or_nothing_and_answers_with_one_diff(client: Client, workspace_dir: Path) -> None:
    target = workspace_dir / "multi.txt"
    target.write_text("one\ntwo\nthree\n")
    bad = [{"old_string": "one", "new_string": "1"}, {"old_string": "four", "new_string": "4"}]
    text, is_error, _ = await call(client, "file_multi_edit", path=str(target), edits=bad)
    assert is_error and text.startswith("Error: edit 2 of 2: ") and target.read_text() == "one\ntwo\nthree\n"
    good = [{"old_string": "one", "new_string": "1"}, {"old_string": "three", "new_string": "3", "replace_all": True}]
    text, is_error, structured = await call(client, "file_multi_edit", path=str(target), edits=good)
    assert not is_error and text.count("@@") == 2 and "-one\n+1\n" in text and "-three\n+3\n" in text
    assert structured == {"path": str(target), "edits": 2, "replacements": 2, "diff_truncated": False}
    assert target.read_text() == "1\ntwo\n3\n"


async def test_a_binary_file_is_not_edited(client: Client, workspace_dir: Path) -> None:
    blob = workspace_dir / "blob.bin"
    blob.write_bytes(b"head\x00tail")
    assert await call(client, "file_edit", path=str(blob), old_string="head", new_string="x") == (
        f"Error: {blob}: binary file, not edited",
        True,
        None,
    )
    assert blob.read_bytes() == b"head\x00tail"


async def test_escapes_by_symlink_and_dotdot_are_refused(
    client: Client, live_server: LiveServer, workspace_dir: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("token=1\n")
    (workspace_dir / "link.txt").symlink_to(secret)
    for path in (str(workspace_dir / "link.txt"), f"../{tmp_path.name}/secret.txt", str(secret)):
        text, is_error, _ = await call(client, "file_edit", path=path, old_string="1", new_string="2")
        assert is_error and OUTSIDE in text, path
        edits = [{"old_string": "1", "new_string": "2"}]
        text, is_error, _ = await call(client, "file_multi_edit", path=path, edits=edits)
        assert is_error and OUTSIDE in text, path
    assert secret.read_text() == "token=1\n"


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_read_only_credential_may_use_neither_tool(
    live_server: LiveServer, workspace_dir: Path, mode: str
) -> None:
    target = workspace_dir / "ro.txt"
    target.write_text("keep\n")
    reader = live_server.create_token(f"edits-reader-{uuid.uuid4().hex[:8]}", scope="mcp:read")
    async with mcp_client(live_server.mcp_url, reader, mode=mode) as client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        assert "file_read" in listed and not listed & {"file_edit", "file_multi_edit"}
        text, is_error, _ = await call(client, "file_edit", path=str(target), old_string="keep", new_string="x")
        assert is_error and text == "Error: this credential's scope (mcp:read) does not allow file_edit"
        edits = [{"old_string": "keep", "new_string": "x"}]
        text, is_error, _ = await call(client, "file_multi_edit", path=str(target), edits=edits)
        assert is_error and text == "Error: this credential's scope (mcp:read) does not allow file_multi_edit"
    assert target.read_text() == "keep\n"


async def test_both_tools_are_annotated_as_modifying_not_read_only(client: Client) -> None:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    for name in ("file_edit", "file_multi_edit"):
        annotations = tools[name].annotations
        assert annotations is not None and annotations.read_only_hint is False and annotations.idempotent_hint is False
        schema = tools[name].output_schema
        assert schema is not None and "replacements" in schema["required"]
