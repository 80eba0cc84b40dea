"""apply_patch over MCP against the live server, end to end with the official SDK client in both protocol eras: a patch
of several files applied through the executor process, its result (text and the structured copy the SDK checks
against the outputSchema) and the audit log keeping the patch and the diff of what changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.database import Row
from tests.live import LiveServer, apoll, mcp_client, text_of

pytestmark = [pytest.mark.live, pytest.mark.anyio]


def records_of(server: LiveServer, marker: str) -> list[Row] | None:
    """The started and finished records of the one call whose arguments hold `marker`, once both are written."""
    sql = "SELECT call_id FROM audit_auditrecord WHERE kind='call.started' AND CAST(arguments AS TEXT) LIKE %s"
    started = server.database.query(sql, f"%{marker}%")
    if len(started) != 1:
        return None
    found = server.database.query("SELECT * FROM audit_auditrecord WHERE call_id=%s ORDER BY id", started[0]["call_id"])
    return found if len(found) == 2 else None


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_multi_file_patch_is_applied_answered_and_audited_with_its_diff(
    live_server: LiveServer, tool_token: str, workspace_dir: Path, mode: str
) -> None:
    base = workspace_dir.name
    (workspace_dir / "app.py").write_text("def greet():\n    print('Hi')\n    return 1\n")
    (workspace_dir / "old.txt").write_text("obsolete\n")
    text = "\n".join(
        [
            "*** Begin Patch",
            f"*** Add File: {base}/docs/{mode}.md",
            f"+# Notes for {base}",
            f"*** Update File: {base}/app.py",
            f"*** Move to: {base}/main.py",
            "@@ def greet():",
            "-    print('Hi')",
            "+    print('Hello')",
            f"*** Delete File: {base}/old.txt",
            "*** End Patch",
        ]
    )
    async with mcp_client(live_server.mcp_url, tool_token, mode=mode) as client:
        assert "apply_patch" in {tool.name for tool in (await client.list_tools()).tools}
        result = await client.call_tool("apply_patch", {"input": text})
    answer = text_of(result)
    assert not result.is_error, answer
    assert {path.name for path in workspace_dir.rglob("*")} == {"docs", "main.py", f"{mode}.md"}
    assert (workspace_dir / "main.py").read_text() == "def greet():\n    print('Hello')\n    return 1\n"
    diff = f"--- {workspace_dir}/app.py\n+++ {workspace_dir}/main.py\n@@ -1,3 +1,3 @@\n def greet():\n"
    assert answer.startswith("Applied the patch to 3 files (+2 -2):\n") and diff in answer
    assert f"--- {workspace_dir}/old.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-obsolete\n" in answer
    structured = result.structured_content
    assert structured is not None and structured["diff"] == answer and structured["diff_truncated"] is False
    assert [(entry["action"], entry["added_lines"], entry["removed_lines"]) for entry in structured["files"]] == [
        ("added", 1, 0),
        ("moved", 1, 1),
        ("deleted", 0, 1),
    ]
    started, finished = await apoll(lambda: records_of(live_server, f"{base}/docs/{mode}.md"), 30, "the records")
    arguments = started["arguments"]
    assert (json.loads(arguments) if isinstance(arguments, str) else arguments) == {"input": text}
    assert (finished["tool"], finished["outcome"]) == ("apply_patch", "ok")
    assert diff in finished["result_excerpt"] and "-obsolete\n" in finished["result_excerpt"]
