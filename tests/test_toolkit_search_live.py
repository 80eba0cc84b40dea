"""file_grep and file_glob over MCP against the live server, in both protocol eras: results and their structured
copy, paging, errors, escapes through `path`, `glob` and `pattern`, and a read-only credential's use of them."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from tests.live import LiveServer, mcp_client, text_of

pytestmark = [pytest.mark.live, pytest.mark.anyio]


@pytest.fixture(params=["legacy", "2026-07-28"])
async def client(request: pytest.FixtureRequest, live_server: LiveServer, tool_token: str) -> AsyncIterator[Client]:
    async with mcp_client(live_server.mcp_url, tool_token, mode=request.param) as connected:
        yield connected


@pytest.fixture
def project(workspace_dir: Path, tmp_path: Path) -> Path:
    root = workspace_dir / f"search-{uuid.uuid4().hex[:8]}"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "notes.md").write_text("".join(f"todo {n}\n" for n in range(30)))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("return a - b  # secret\n")
    (root / "escape").symlink_to(outside)
    return root


async def call(client: Client, tool: str, **arguments: Any) -> tuple[str, bool, dict[str, Any] | None]:
    result = await client.call_tool(tool, arguments)
    return text_of(result), bool(result.is_error), result.structured_content


async def test_grep_finds_content_with_line_numbers_and_never_follows_the_link(client: Client, project: Path) -> None:
    text, is_error, structured = await call(
        client, "file_grep", pattern=r"return a\s*-\s*b", path=str(project), output_mode="content"
    )
    assert not is_error and text == "lib/calc.py:2:    return a - b"
    assert structured == {"mode": "content", "total": 1, "shown": 1, "offset": 0, "next_offset": None,
                          "matches": None, "output_cut": False}  # fmt: skip
    files, _, _ = await call(client, "file_grep", pattern="return", path=str(project))
    assert files == "lib/calc.py"


async def test_grep_pages_and_counts(client: Client, project: Path) -> None:
    text, _, structured = await call(
        client, "file_grep", pattern="todo", path=str(project), output_mode="content", head_limit=10, offset=10
    )
    assert text.splitlines()[0] == "notes.md:11:todo 10"
    assert "call file_grep with offset=20 for more" in text
    assert structured is not None and (structured["next_offset"], structured["total"]) == (20, 30)
    counted, _, counts = await call(client, "file_grep", pattern="todo", path=str(project), output_mode="count")
    assert counted.startswith("notes.md:30") and counts is not None and counts["matches"] == 30
    none, is_error, _ = await call(client, "file_grep", pattern="nothing like this", path=str(project))
    assert not is_error and none == "No matches found"


async def test_glob_lists_newest_first_and_skips_the_link(client: Client, project: Path) -> None:
    text, is_error, structured = await call(client, "file_glob", pattern="**/*.py", path=str(project))
    assert not is_error and text == "lib/calc.py" and structured == {"count": 1, "shown": 1, "more": 0}


@pytest.mark.parametrize(
    ("tool", "arguments", "error"),
    [
        ("file_grep", {"pattern": "return", "path": "{project}/escape"}, "is outside the allowed directory"),
        ("file_grep", {"pattern": "return", "path": "{project}/../../.."}, "is outside the allowed directory"),
        ("file_grep", {"pattern": "return", "path": "{project}", "glob": "../*"}, "may not contain '..'"),
        ("file_grep", {"pattern": "return", "path": "{project}", "glob": "/etc/*"}, "must be relative"),
        ("file_grep", {"pattern": "(", "path": "{project}"}, "regex parse error"),
        ("file_grep", {"pattern": "x", "path": "{project}", "type": "--pre=sh"}, "unknown file type"),
        ("file_glob", {"pattern": "../**", "path": "{project}"}, "may not contain '..'"),
        ("file_glob", {"pattern": "*", "path": "{project}/escape"}, "is outside the allowed directory"),
    ],
)
async def test_escapes_and_bad_input_are_refused(
    client: Client, project: Path, tool: str, arguments: dict[str, str], error: str
) -> None:
    filled = {key: value.replace("{project}", str(project)) for key, value in arguments.items()}
    text, is_error, _ = await call(client, tool, **filled)
    assert is_error and text.startswith("Error: ") and error in text, text


async def test_a_pattern_that_looks_like_an_option_is_searched_for(client: Client, project: Path) -> None:
    (project / "flags.txt").write_text("use --files here\n")
    text, is_error, _ = await call(client, "file_grep", pattern="--files", path=str(project), output_mode="content")
    assert not is_error and text == "flags.txt:1:use --files here"


async def test_a_read_only_token_may_search(live_server: LiveServer, project: Path) -> None:
    token = live_server.create_token(f"reader-{uuid.uuid4().hex[:6]}", scope="mcp:read")
    async with mcp_client(live_server.mcp_url, token) as reader:
        text, is_error, _ = await call(reader, "file_grep", pattern="return", path=str(project))
        assert not is_error and text == "lib/calc.py"
        globbed, is_error, _ = await call(reader, "file_glob", pattern="*.md", path=str(project))
        assert not is_error and globbed == "notes.md"
