"""OAuth access tokens at /mcp: only unexpired, unrevoked tokens of a user, for exactly our resource, with an MCP
scope; the principal reaches the tools and the audit log as a bearer token's does. (Tokens of shapes our server never
issues, made in the database: tests/test_mcp_endpoint_inprocess.py.)"""

from __future__ import annotations

import httpx2
import pytest
from mcp.shared.exceptions import MCPError

from tests.live import LiveServer, mcp_client, text_of
from tests.oauth_flow import AdminSession, mcp_status, newest_access_token_id, obtain_tokens, register, shell

pytestmark = [pytest.mark.live]


@pytest.fixture(scope="module")
def server(oauth_server: LiveServer) -> LiveServer:
    return oauth_server


def test_an_oauth_token_for_our_resource_is_accepted(server: LiveServer, admin: AdminSession) -> None:
    tokens = obtain_tokens(server, admin, register(server))
    assert mcp_status(server, str(tokens["access_token"])).status_code == 200


def test_a_registration_access_token_is_refused(server: LiveServer) -> None:
    client = register(server)
    response = mcp_status(server, str(client.registration["registration_access_token"]))
    assert response.status_code == 401
    assert 'error="invalid_token"' in response.headers["www-authenticate"]


def test_an_expired_token_is_refused(server: LiveServer, admin: AdminSession) -> None:
    tokens = obtain_tokens(server, admin, register(server))
    shell(
        server,
        "from datetime import timedelta; from django.utils import timezone; from oauth2_provider.models import AccessToken; "
        "AccessToken.objects.filter(user__isnull=False).update(expires=timezone.now() - timedelta(seconds=1))",
    )
    assert mcp_status(server, str(tokens["access_token"])).status_code == 401


@pytest.mark.anyio
async def test_a_read_only_oauth_token_calling_a_write_tool_gets_the_scope_error_from_its_403(
    server: LiveServer, admin: AdminSession
) -> None:
    """A client that does not step up (here: a fixed token, no OAuth provider) hands its caller the JSON-RPC error of
    the 403 insufficient_scope (mcpserver.step_up); one that does: tests/test_oauth_step_up_live.py."""
    tokens = obtain_tokens(server, admin, register(server), scope="mcp:read")
    assert tokens["scope"] == "mcp:read"
    async with mcp_client(server.mcp_url, str(tokens["access_token"])) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert "terminal_exec" not in names and "file_read" in names
        with pytest.raises(MCPError) as refused:
            await client.call_tool("file_write", {"path": "oauth-ro.txt", "content": "no"})
        assert str(refused.value).startswith("Error: this credential's scope (mcp:read) does not allow file_write.")
        assert "Its app can ask for full access (scope mcp) by authorizing again" in str(refused.value)
    assert not (server.workspace / "oauth-ro.txt").exists()


@pytest.mark.anyio
async def test_the_oauth_principal_reaches_the_audit_log_with_user_client_and_scope(
    server: LiveServer, admin: AdminSession
) -> None:
    client = register(server, client_name="Audit trail client")
    tokens = obtain_tokens(server, admin, client)
    async with mcp_client(server.mcp_url, str(tokens["access_token"])) as mcp:
        result = await mcp.call_tool("terminal_exec", {"command": "echo via-oauth"})
        assert "via-oauth" in text_of(result)
    record = server.database.one(
        "SELECT username, credential_kind, credential_id, credential_name, scope FROM audit_auditrecord"
        " WHERE kind = 'call.started' AND tool = 'terminal_exec' ORDER BY id DESC LIMIT 1"
    )
    assert record["username"] == "admin" and record["credential_kind"] == "oauth" and record["scope"] == "mcp"
    assert record["credential_name"] == f"Audit trail client (client {client.client_id})"
    assert record["credential_id"] == str(newest_access_token_id(server))


@pytest.mark.anyio
async def test_tokens_belong_to_the_user_who_approved(server: LiveServer) -> None:
    shell(
        server,
        "from django.contrib.auth import get_user_model; "
        "get_user_model().objects.create_user('alice', password='alice-password-123', is_staff=True)",
    )
    alice = AdminSession(server, "alice", "alice-password-123")
    tokens = obtain_tokens(server, alice, register(server))
    alice.close()
    async with mcp_client(server.mcp_url, str(tokens["access_token"])) as mcp:
        result = await mcp.call_tool("terminal_exec", {"command": "echo approved-by-alice"})
        assert not result.is_error
    sql = "SELECT username FROM audit_auditrecord WHERE kind = 'call.started' ORDER BY id DESC LIMIT 1"
    assert server.database.one(sql)["username"] == "alice"


def test_the_revocation_endpoint_revokes_an_access_token_and_its_refresh_token(
    server: LiveServer, admin: AdminSession
) -> None:
    client = register(server)
    tokens = obtain_tokens(server, admin, client)
    response = httpx2.post(
        f"{server.url}/oauth/revoke/", data={"token": tokens["access_token"], **client.credentials()}, timeout=30
    )
    assert response.status_code == 200
    assert mcp_status(server, str(tokens["access_token"])).status_code == 401
    again = httpx2.post(
        f"{server.url}/oauth/token/",
        data={"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"], **client.credentials()},
        timeout=30,
    )
    assert again.status_code == 400


def test_another_client_cannot_revoke_a_token(server: LiveServer, admin: AdminSession) -> None:
    owner, other = register(server), register(server)
    tokens = obtain_tokens(server, admin, owner)
    httpx2.post(
        f"{server.url}/oauth/revoke/", data={"token": tokens["access_token"], **other.credentials()}, timeout=30
    )
    assert mcp_status(server, str(tokens["access_token"])).status_code == 200
