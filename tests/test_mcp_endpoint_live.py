"""The /mcp endpoint over real HTTP: authentication, scope, Host/Origin checks, sessions and both protocol eras."""

from __future__ import annotations

import json
from importlib.metadata import version

import httpx2
import pytest

from tests.database import requires_postgres, requires_sqlite
from tests.live import (
    INITIALIZE,
    MCP_HEADERS,
    READ_ONLY_TOOLS,
    LiveServer,
    auth_headers,
    mcp_client,
    text_of,
    tool_count,
)

pytestmark = [pytest.mark.live]


def post_initialize(server: LiveServer, headers: dict[str, str]) -> httpx2.Response:
    return httpx2.post(server.mcp_url, json=INITIALIZE, headers={**MCP_HEADERS, **headers}, timeout=10)


def test_no_token_gets_401_naming_the_scope_and_resource_metadata(live_server: LiveServer) -> None:
    response = post_initialize(live_server, {})
    assert response.status_code == 401
    expected = f'Bearer scope="mcp", resource_metadata="{live_server.url}/.well-known/oauth-protected-resource/mcp"'
    assert response.headers["www-authenticate"] == expected
    assert response.json()["error"] == "unauthorized"


def test_a_revoked_token_is_refused_from_its_next_request(live_server: LiveServer) -> None:
    token = live_server.create_token("to-revoke")
    assert post_initialize(live_server, auth_headers(token)).status_code == 200
    live_server.manage("revoke_token", "to-revoke")
    assert post_initialize(live_server, auth_headers(token)).status_code == 401


@pytest.mark.parametrize(
    "origin",
    [
        "http://localhost:1@evil.example",
        "http://127.0.0.1:1@evil.example",
        "http://localhost.evil.example",
        "http://127.0.0.1.evil.example",
        "http://[::1].evil.example",
        "null",
        "http://localhost:1/path",
    ],
)
def test_an_origin_that_only_starts_like_an_allowed_one_gets_403(live_server: LiveServer, origin: str) -> None:
    headers = {**auth_headers(live_server.token), "Origin": origin}
    response = post_initialize(live_server, headers)
    assert response.status_code == 403 and response.json()["error"] == "invalid_origin"


@pytest.mark.parametrize("host", ["127.0.0.1:1@evil.example", "localhost.evil.example:80"])
def test_a_host_that_only_starts_like_an_allowed_one_gets_421(live_server: LiveServer, host: str) -> None:
    headers = {**auth_headers(live_server.token), "Host": host}
    assert post_initialize(live_server, headers).status_code == 421


def test_a_loopback_origin_is_allowed(live_server: LiveServer) -> None:
    headers = {**auth_headers(live_server.token), "Origin": f"http://localhost:{live_server.port}"}
    assert post_initialize(live_server, headers).status_code == 200


def test_a_foreign_host_header_is_refused(live_server: LiveServer) -> None:
    headers = {**auth_headers(live_server.token), "Host": "rebind.example"}
    assert post_initialize(live_server, headers).status_code in {400, 421}


def test_a_session_opened_by_one_credential_cannot_be_used_with_another(live_server: LiveServer) -> None:
    first = post_initialize(live_server, auth_headers(live_server.token))
    session_id = first.headers["mcp-session-id"]
    other = live_server.create_token("session-thief")
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    stolen = httpx2.post(
        live_server.mcp_url,
        json=listing,
        headers={
            **MCP_HEADERS,
            **auth_headers(other),
            "Mcp-Session-Id": session_id,
            "Mcp-Protocol-Version": "2025-11-25",
        },
        timeout=10,
    )
    assert stolen.status_code == 404
    own = httpx2.post(
        live_server.mcp_url,
        json={"jsonrpc": "2.0", "method": "notifications/initialized"},
        headers={
            **MCP_HEADERS,
            **auth_headers(live_server.token),
            "Mcp-Session-Id": session_id,
            "Mcp-Protocol-Version": "2025-11-25",
        },
        timeout=10,
    )
    assert own.status_code == 202


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_both_protocol_eras_list_the_20_tools_and_call_one(live_server: LiveServer, mode: str) -> None:
    async with mcp_client(live_server.mcp_url, live_server.token, mode=mode) as client:
        tools = (await client.list_tools()).tools
        result = await client.call_tool("terminal_exec", {"command": "echo era-ok"})
    assert len(tools) == tool_count()
    assert text_of(result) == "stdout:\nera-ok\n\nexit_code: 0"
    assert result.structured_content is not None and result.structured_content["exit_code"] == 0


@pytest.mark.anyio
async def test_tools_carry_annotations_and_typed_ones_a_structured_copy_beside_the_same_text(
    live_server: LiveServer,
) -> None:
    async with mcp_client(live_server.mcp_url, live_server.token) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        written = await client.call_tool("file_write", {"path": "annotations.txt", "content": "x"})
    read, delete, terminal = (tools[name].annotations for name in ("file_read", "file_delete", "terminal_exec"))
    assert read is not None and read.read_only_hint is True
    assert delete is not None and delete.destructive_hint is True
    assert terminal is not None and terminal.read_only_hint is False
    # Issue 33 typed the tools whose results have structure (file_read's is the file: text only); the text stays the
    # reference server's, and the SDK client has checked the copy against the outputSchema.
    assert tools["file_write"].output_schema is not None and tools["file_read"].output_schema is None
    real = live_server.workspace.resolve() / "annotations.txt"
    assert text_of(written) == f"Written 1 bytes to {real}"
    assert written.structured_content == {"path": str(real), "bytes": 1}


@pytest.mark.anyio
async def test_a_read_only_token_sees_and_may_call_only_read_only_tools(live_server: LiveServer) -> None:
    token = live_server.create_token("reader", scope="mcp:read")
    async with mcp_client(live_server.mcp_url, token) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        write = await client.call_tool("file_write", {"path": "ro.txt", "content": "no"})
        create_branch = await client.call_tool("git_branch", {"name": "feature"})
        listing = await client.call_tool("file_list", {"path": ""})
    assert names == READ_ONLY_TOOLS
    assert write.is_error and text_of(write) == "Error: this credential's scope (mcp:read) does not allow file_write"
    assert text_of(create_branch) == "Error: this credential's scope (mcp:read) does not allow git_branch with name"
    assert not listing.is_error
    assert not (live_server.workspace / "ro.txt").exists()


@pytest.mark.anyio
async def test_tool_processes_see_none_of_the_servers_environment(live_server: LiveServer) -> None:
    async with mcp_client(live_server.mcp_url, live_server.token) as client:
        result = await client.call_tool("terminal_exec", {"command": "env; cat /proc/$$/environ | tr '\\0' '\\n'"})
    output = text_of(result)
    assert "SANDSTORM_" not in output and "DJANGO_" not in output
    assert live_server.token not in output
    assert "HOME=" in output and "PATH=" in output


def test_health_reports_status_without_secrets(live_server: LiveServer) -> None:
    body = httpx2.get(f"{live_server.url}/health", timeout=10).json()
    assert body["ok"] is True and body["version"] == version("sandstorm-mcp")
    assert body["cores"] >= 1 and body["memory_available_bytes"] > 0 and body["workspace_disk_free_bytes"] > 0
    assert len(body["tools"]) == tool_count() and "terminal_exec" in body["tools"]
    assert live_server.token not in json.dumps(body)


@requires_sqlite
def test_the_database_runs_in_wal_mode(live_server: LiveServer) -> None:
    assert live_server.database.query("PRAGMA journal_mode")[0]["journal_mode"] == "wal"


@requires_postgres
def test_with_database_url_the_server_keeps_everything_in_postgresql(live_server: LiveServer) -> None:
    tables = {
        row["name"]
        for row in live_server.database.query("SELECT tablename AS name FROM pg_tables WHERE schemaname = 'public'")
    }
    assert {
        "oauth_bearertoken",
        "audit_auditrecord",
        "audit_chainhead",
        "mcpserver_backgroundprocess",
        "oauth_revocation",
    } <= tables
    assert live_server.database.query("SELECT name FROM oauth_bearertoken WHERE name = 'bootstrap'")
    assert not list(live_server.state_dir.glob("*.sqlite3*"))


def test_tokens_are_stored_hashed_and_never_logged(live_server: LiveServer) -> None:
    rows = live_server.database.query("SELECT token_hash, prefix FROM oauth_bearertoken")
    assert rows and all(live_server.token not in (row["token_hash"] + row["prefix"]) for row in rows)
    assert live_server.token not in live_server.log()
