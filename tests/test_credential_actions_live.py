"""Suspend, resume, regenerate and Disconnect end to end: the official MCP SDK client against a live server, the
admin acting through the console's pages (confirmation, then its form posted with its CSRF token)."""

from __future__ import annotations

import asyncio
import re
import uuid

import pytest
from mcp.shared.exceptions import MCPError

from tests.live import LiveServer, mcp_client, text_of
from tests.oauth_flow import (
    AdminSession,
    application_id,
    bearer_token_id,
    hidden_inputs,
    mcp_status,
    obtain_tokens,
    register,
)

pytestmark = [pytest.mark.live, pytest.mark.anyio]
SUSPENDED = "suspended by an administrator"
SECRET = re.compile(r'<code id="token-secret" class="copyable">(sst_[^<]+)</code>')


@pytest.fixture(scope="module")
def server(oauth_server: LiveServer) -> LiveServer:
    return oauth_server


def submit(admin: AdminSession, url: str, form_id: str, **fields: str) -> str:
    """Open the confirmation page at `url` and post its form; where the server sends the browser next."""
    page = admin.http.get(url)
    assert page.status_code == 200, (url, page.status_code)
    form = hidden_inputs(page.text, form_id)
    assert "csrfmiddlewaretoken" in form, page.text[:500]
    answer = admin.http.post(url, data={**form, **fields}, headers={"Referer": f"{admin.server.url}{url}"})
    assert answer.status_code == 302, answer.text[:500]
    return str(answer.headers["location"])


def new_token(server: LiveServer) -> tuple[str, int]:
    name = f"actions-{uuid.uuid4().hex[:10]}"
    return server.create_token(name), bearer_token_id(server, name)


async def started(server: LiveServer, token_id: int, deadline: float = 15.0) -> None:
    """Until a call of the token has started (its started record is written before it runs)."""
    sql = "SELECT id FROM audit_auditrecord WHERE kind = 'call.started' AND credential_id = %s"
    async with asyncio.timeout(deadline):
        while not server.database.query(sql, str(token_id)):
            await asyncio.sleep(0.05)


async def echo(server: LiveServer, token: str, words: str = "hello") -> str:
    async with mcp_client(server.mcp_url, token) as client:
        return text_of(await client.call_tool("terminal_exec", {"command": f"echo {words}"}))


def leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups: the SDK client raises from its task group."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


async def refused_at_initialize(server: LiveServer, token: str) -> str:
    """What the SDK client's error says when a new session with `token` is refused."""
    try:
        async with mcp_client(server.mcp_url, token):
            pass
    except (MCPError, ExceptionGroup) as error:
        return " ".join(str(leaf) for leaf in leaves(error) if isinstance(leaf, MCPError))
    raise AssertionError("a session was opened")


async def test_a_suspended_bearer_token_is_refused_saying_so_and_works_again_once_resumed(
    server: LiveServer, admin: AdminSession
) -> None:
    token, token_id = new_token(server)
    async with mcp_client(server.mcp_url, token) as client:
        running = asyncio.ensure_future(client.call_tool("terminal_exec", {"command": "sleep 120; echo never"}))
        await started(server, token_id)
        submit(admin, f"/admin/oauth/bearertoken/{token_id}/suspend/", "suspend-form")
        async with asyncio.timeout(30):
            try:
                cancelled = text_of(await running)
            except MCPError as error:  # refused outright, had it not started yet: the client reads the error
                cancelled = str(error)
        assert "never" not in cancelled
        with pytest.raises(MCPError, match=SUSPENDED):
            await client.call_tool("terminal_exec", {"command": "echo refused"})
        assert SUSPENDED in await refused_at_initialize(server, token), "a new session too"
        submit(admin, f"/admin/oauth/bearertoken/{token_id}/resume/", "resume-form")
        result = await client.call_tool("terminal_exec", {"command": "echo resumed"})
        assert "resumed" in text_of(result), "the same session works again"


async def test_a_suspended_connected_app_is_refused_saying_so_and_works_again_once_resumed(
    server: LiveServer, admin: AdminSession
) -> None:
    client = register(server, client_name="Suspended app")
    access = str(obtain_tokens(server, admin, client)["access_token"])
    app_id = application_id(server, client.client_id)
    assert "before" in await echo(server, access, "before")
    submit(admin, f"/admin/oauth/connectedapp/{app_id}/suspend/", "suspend-form")
    refused = mcp_status(server, access)
    assert refused.status_code == 403 and SUSPENDED in refused.json()["error"]["message"]
    assert SUSPENDED in await refused_at_initialize(server, access)
    submit(admin, f"/admin/oauth/connectedapp/{app_id}/resume/", "resume-form")
    assert "after" in await echo(server, access, "after")


async def test_regenerating_gives_a_working_token_and_refuses_the_old_one(
    server: LiveServer, admin: AdminSession
) -> None:
    old, token_id = new_token(server)
    assert "before" in await echo(server, old, "before")
    shown = admin.http.get(submit(admin, f"/admin/oauth/bearertoken/{token_id}/regenerate/", "regenerate-form"))
    secret = SECRET.search(shown.text)
    assert secret is not None
    assert mcp_status(server, old).status_code == 401
    assert "after" in await echo(server, secret.group(1), "after")
    from_shell = server.manage("regenerate_token", secret.group(1)[:8]).stdout.strip().splitlines()[-1]
    assert mcp_status(server, secret.group(1)).status_code == 401
    assert "shell" in await echo(server, from_shell, "shell")


async def test_disconnect_closes_an_open_session(server: LiveServer, admin: AdminSession) -> None:
    token, token_id = new_token(server)
    async with mcp_client(server.mcp_url, token) as client:
        assert "one" in text_of(await client.call_tool("terminal_exec", {"command": "echo one"}))
        page = admin.http.get(f"/admin/sessions/?credential=bearer:{token_id}")
        [session_id] = re.findall(r'data-session="([^"]+)"', page.text)
        submit(admin, f"/admin/sessions/{session_id}/disconnect/", "disconnect-form")
        with pytest.raises(MCPError, match="Session not found|Session has been terminated"):  # the SDK's 404s
            await client.call_tool("terminal_exec", {"command": "echo two"})
    assert "again" in await echo(server, token, "again"), "the credential itself still works"
    page = admin.http.get(f"/admin/sessions/?credential=bearer:{token_id}")
    assert session_id not in page.text
