"""A request naming a prompt, resource or tool the server does not have gets the JSON-RPC error the specification
gives, in both protocol eras, with the official SDK client against a live server, and logs no ERROR traceback."""

from __future__ import annotations

import uuid

import pytest
from mcp import MCPError

from tests.database import Row
from tests.live import LiveServer, mcp_client

pytestmark = [pytest.mark.live, pytest.mark.anyio]

ERAS = ["legacy", "2026-07-28"]
INVALID_PARAMS = -32602


@pytest.fixture(scope="module")
def token(live_server: LiveServer) -> str:
    return live_server.create_token(f"unknown-names-{uuid.uuid4().hex[:12]}")


def logged_since(server: LiveServer, start: int) -> str:
    return server.log()[start:]


def records_of_call(server: LiveServer, marker: str) -> list[Row]:
    sql = "SELECT call_id FROM audit_auditrecord WHERE kind='call.started' AND CAST(arguments AS TEXT) LIKE %s"
    started = server.database.query(sql, f"%{marker}%")
    assert len(started) == 1, started
    return server.database.query("SELECT * FROM audit_auditrecord WHERE call_id=%s ORDER BY id", started[0]["call_id"])


@pytest.mark.parametrize("mode", ERAS)
async def test_an_unknown_prompt_is_invalid_params_naming_it(live_server: LiveServer, token: str, mode: str) -> None:
    start = len(live_server.log())
    name = f"no-such-prompt-{uuid.uuid4().hex[:8]}"
    async with mcp_client(live_server.mcp_url, token, mode=mode) as client:
        with pytest.raises(MCPError) as refused:
            await client.get_prompt(name)
    assert refused.value.code == INVALID_PARAMS
    assert refused.value.message == f"Unknown prompt: {name}"
    logged = logged_since(live_server, start)
    assert "Traceback" not in logged and " ERROR " not in logged, logged


@pytest.mark.parametrize(("mode", "code"), [("legacy", -32002), ("2026-07-28", INVALID_PARAMS)])
async def test_an_unknown_resource_is_not_found_with_the_code_of_its_revision(
    live_server: LiveServer, token: str, mode: str, code: int
) -> None:
    """-32002 up to 2025-11-25 (its resources page; the SDK answered -32602); 2026-07-28 replaced it by -32602 and
    forbids -32002 (answered so before, kept)."""
    start = len(live_server.log())
    uri = f"file:///no-such-resource-{uuid.uuid4().hex[:8]}.txt"
    async with mcp_client(live_server.mcp_url, token, mode=mode) as client:
        with pytest.raises(MCPError) as refused:
            await client.read_resource(uri)
    assert (refused.value.code, refused.value.message, refused.value.data) == (
        code,
        f"Unknown resource: {uri}",
        {"uri": uri},
    )
    logged = logged_since(live_server, start)
    assert "Traceback" not in logged and " ERROR " not in logged, logged


@pytest.mark.parametrize("mode", ERAS)
async def test_an_unknown_tool_is_invalid_params_and_recorded_as_denied(
    live_server: LiveServer, token: str, mode: str
) -> None:
    marker = uuid.uuid4().hex
    async with mcp_client(live_server.mcp_url, token, mode=mode) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("no_such_tool", {"x": marker})
        known = await client.call_tool("terminal_exec", {"command": "true"})
    assert (refused.value.code, refused.value.message) == (INVALID_PARAMS, "Unknown tool: no_such_tool")
    assert not known.is_error
    records = records_of_call(live_server, f'"x": "{marker}"')
    assert (records[-1]["tool"], records[-1]["outcome"], records[-1]["reason"]) == (
        "no_such_tool",
        "denied",
        "Unknown tool: no_such_tool",
    )
