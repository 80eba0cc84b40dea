"""apply_patch through the in-process /mcp application: the command policy refuses the whole patch when it denies
any path the patch names, and a read-only credential neither sees nor runs it; each refusal audited."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from mcpserver.policy_source import replace_policy
from tests.inprocess import InProcessServer, new_token, records_of_call, text_of

pytestmark = [pytest.mark.inprocess, pytest.mark.anyio, pytest.mark.django_db(transaction=True)]


def patch(*lines: str) -> str:
    return "\n".join(["*** Begin Patch", *lines, "*** End Patch"])


async def set_policy(*rules: dict[str, Any]) -> None:
    await sync_to_async(replace_policy)({"rules": list(rules)}, "test")


async def test_a_path_the_policy_denies_refuses_the_whole_patch(mcp_app: InProcessServer) -> None:
    await set_policy({"id": "no-secrets", "decision": "deny", "paths": ["secrets/**"]})
    (mcp_app.workspace / "secrets").mkdir()
    (mcp_app.workspace / "secrets" / "key.txt").write_text("a\n")
    marker = uuid.uuid4().hex
    text = patch(f"*** Add File: {marker}.txt", "+fine", "*** Update File: secrets/key.txt", "-a", "+b")
    result = await mcp_app.call_tool(await new_token("patcher"), "apply_patch", {"input": text})
    key = mcp_app.workspace.resolve() / "secrets" / "key.txt"
    assert result["isError"] and text_of(result) == (
        f"Error: the command policy denies this call (rule no-secrets): rule 'no-secrets' matched path '{key}'"
    )
    assert not (mcp_app.workspace / f"{marker}.txt").exists() and key.read_text() == "a\n"
    started, finished = await records_of_call(marker)
    assert started.detail is not None and started.detail["policy"]["rule"] == "no-secrets"
    assert finished.outcome == "denied"


async def test_a_read_only_credential_neither_sees_nor_runs_apply_patch(mcp_app: InProcessServer) -> None:
    reader = await new_token("patch-reader", scope="mcp:read")
    async with mcp_app.client(reader) as client:
        assert "apply_patch" not in {tool.name for tool in (await client.list_tools()).tools}
    marker = uuid.uuid4().hex
    result = await mcp_app.call_tool(reader, "apply_patch", {"input": patch(f"*** Add File: {marker}.txt", "+x")})
    assert result["isError"]
    assert text_of(result) == "Error: this credential's scope (mcp:read) does not allow apply_patch"
    assert not (mcp_app.workspace / f"{marker}.txt").exists()
    _, finished = await records_of_call(marker)
    assert finished.outcome == "denied"
