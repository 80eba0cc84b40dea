"""Servers of their own: first-run bootstrap, clean shut-down on SIGTERM. (The rate and concurrency limits:
tests/test_mcp_endpoint_inprocess.py and tests/test_tools_inprocess.py.)"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import anyio
import httpx2
import psutil
import pytest
from mcp.shared.exceptions import MCPError

from mcpserver.stopping import CALL_STOPPED, STOPPING_CODE
from oauth.claude_code import claude_code_line
from tests.database import end_connections, requires_postgres
from tests.live import INITIALIZE, MCP_HEADERS, auth_headers, make_server, mcp_client, poll, running_server, text_of

pytestmark = [pytest.mark.live]


def test_bootstrap_prints_secrets_once_and_a_revoked_bootstrap_token_stays_revoked(tmp_path: Path) -> None:
    server = make_server(tmp_path, SANDSTORM_ADMIN_PASSWORD="")
    first = server.manage("bootstrap").stdout
    assert "Password:" in first and "shown once" in first
    assert claude_code_line(server.mcp_url, "<the value of SANDSTORM_MCP_TOKEN>") in first
    assert server.token not in first  # imported from SANDSTORM_MCP_TOKEN, never echoed
    second = server.manage("bootstrap").stdout
    assert "shown once" not in second
    server.manage("revoke_token", "bootstrap")
    server.manage("bootstrap")
    rows = server.database.query("SELECT revoked_at FROM oauth_bearertoken WHERE name = 'bootstrap'")
    assert len(rows) == 1 and rows[0]["revoked_at"] is not None


def test_bootstrap_without_a_token_variable_prints_a_first_token_that_works(tmp_path: Path) -> None:
    server = make_server(tmp_path, SANDSTORM_MCP_TOKEN="")
    output = server.manage("bootstrap").stdout
    token = next(line.split()[1] for line in output.splitlines() if line.strip().startswith("Token:"))
    assert token.startswith("sst_")
    assert f"  {claude_code_line(server.mcp_url, token)}\n" in output
    assert "(named 'first-run')" in output
    [name] = [row["name"] for row in server.database.query("SELECT name FROM oauth_bearertoken")]
    assert name == "first-run", "the README and the banner name the first token as bootstrap makes it"
    assert token not in server.manage("bootstrap").stdout
    server.token = token
    server.start()
    try:
        response = httpx2.post(
            server.mcp_url, json=INITIALIZE, headers={**MCP_HEADERS, **auth_headers(token)}, timeout=10
        )
        assert response.status_code == 200
    finally:
        server.stop()


@pytest.mark.anyio
async def test_sigterm_shuts_down_cleanly_with_sessions_and_a_call_open(tmp_path: Path) -> None:
    server = make_server(tmp_path)
    server.start()
    marker = server.workspace / "running"
    answers: list[tuple[int, str]] = []
    try:
        async with mcp_client(server.mcp_url, server.token) as client:

            async def long_call() -> None:
                try:
                    await client.call_tool("terminal_exec", {"command": f"touch {marker}; sleep 60"})
                except MCPError as error:  # the call still running is answered, not dropped
                    answers.append((error.error.code, error.error.message))

            async with anyio.create_task_group() as group:
                group.start_soon(long_call)
                with anyio.fail_after(10):
                    while not marker.exists():
                        await anyio.sleep(0.02)
                process = server.process
                assert process is not None
                process.send_signal(signal.SIGTERM)
                await anyio.to_thread.run_sync(lambda: poll(lambda: process.poll() is not None, 20, what="exit"))
                group.cancel_scope.cancel()
    except* httpx2.TransportError:
        pass  # the client's own end of its session meets a server that has gone
    finally:
        returncode = server.stop()
    log = server.log()
    assert answers == [(STOPPING_CODE, CALL_STOPPED)]
    assert returncode == 0, log
    assert "Traceback" not in log, log
    assert "MCP session manager stopped" in log
    assert marker.exists()
    # The call's process group was killed with the session, not orphaned.
    poll(
        lambda: not any(str(marker) in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])),
        10,
        what="orphans to go",
    )


@requires_postgres
@pytest.mark.anyio
async def test_tool_calls_work_again_after_postgresql_dropped_every_connection(tmp_path: Path) -> None:
    """As after a restart of PostgreSQL: the server's threads each held a connection that is now dead."""

    async def call(number: int) -> bool:
        with contextlib.suppress(Exception):  # a session that cannot even open counts as a failed call
            async with mcp_client(server.mcp_url, server.token) as client:
                result = await client.call_tool("terminal_exec", {"command": f"echo call-{number}"})
                return not result.is_error and f"call-{number}" in text_of(result)
        return False

    with running_server(tmp_path) as server:
        assert await call(0)
        assert await anyio.to_thread.run_sync(end_connections, server.env["DATABASE_URL"]) > 0
        outcomes = [await call(number) for number in range(1, 16)]
        assert any(outcomes), "no call worked again"
        first_good = outcomes.index(True)
        assert all(outcomes[first_good:]), outcomes
        assert first_good < 10, outcomes  # each dead connection fails once at most, then is replaced
