"""The /mcp endpoint in-process: 401 and 403 answers with their challenges, OAuth tokens only for our resource and an
MCP scope, the per-credential rate limit (429 with Retry-After), and what a read-only credential sees. (The step-up
403 of a read-only OAuth credential's write call: tests/test_step_up_inprocess.py.)"""

from __future__ import annotations

import secrets
from datetime import timedelta
from pathlib import Path

import httpx2
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from mcpserver.registry import TOOLS
from tests.inprocess import InProcessServer, new_token, serve_in_process, stateless_headers, stateless_meta
from tests.live import READ_ONLY_TOOLS

pytestmark = [pytest.mark.inprocess, pytest.mark.anyio, pytest.mark.django_db(transaction=True)]

RESOURCE_METADATA = f'resource_metadata="{settings.PUBLIC_URL}/.well-known/oauth-protected-resource/mcp"'
TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": stateless_meta()}}


async def list_tools(server: InProcessServer, token: str | None) -> httpx2.Response:
    return await server.post(token, TOOLS_LIST, **stateless_headers("tools/list"))


@sync_to_async
def oauth_token(*, scope: str, resource: list[str], with_user: bool = True, expired: bool = False) -> str:
    """An access token row made directly in the database, for shapes our own server never issues."""
    from oauth2_provider.models import AccessToken, Application, set_token_value

    application = Application.objects.create(
        name="inserted",
        client_type="public",
        authorization_grant_type="authorization-code",
        redirect_uris="https://example.com/cb",
    )
    user = get_user_model().objects.get_or_create(username="approver")[0] if with_user else None
    expires = timezone.now() + (timedelta(seconds=-1) if expired else timedelta(hours=1))
    raw = secrets.token_urlsafe(32)
    token = AccessToken(application=application, user=user, scope=scope, resource=resource, expires=expires)
    set_token_value(token, raw)
    token.save()
    return raw


async def test_no_token_gets_401_naming_the_scope_to_ask_for_and_resource_metadata(mcp_app: InProcessServer) -> None:
    response = await list_tools(mcp_app, None)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == f'Bearer scope="mcp", {RESOURCE_METADATA}'
    assert response.json()["error"] == "unauthorized"


async def test_an_unknown_token_gets_401_invalid_token_with_resource_metadata(mcp_app: InProcessServer) -> None:
    response = await mcp_app.post("sst_not-a-real-token-at-all", TOOLS_LIST, **stateless_headers("tools/list"))
    challenge = response.headers["www-authenticate"]
    assert response.status_code == 401
    assert challenge.startswith('Bearer error="invalid_token", scope="mcp", ') and challenge.endswith(RESOURCE_METADATA)
    assert response.json()["error"] == "invalid_token"


async def test_a_token_in_the_query_string_is_never_accepted(mcp_app: InProcessServer) -> None:
    token = await new_token("in-the-url")
    async with mcp_app.http(None, **stateless_headers("tools/list")) as client:
        for name in ("access_token", "token"):
            response = await client.post(f"/mcp?{name}={token}", json=TOOLS_LIST)
            assert response.status_code == 401
    assert (await mcp_app.post(token, TOOLS_LIST, **stateless_headers("tools/list"))).status_code == 200


async def test_an_oauth_token_for_our_resource_with_mcp_scope_is_accepted(mcp_app: InProcessServer) -> None:
    raw = await oauth_token(scope="mcp", resource=[settings.MCP_RESOURCE_URL])
    response = await mcp_app.post(raw, TOOLS_LIST, **stateless_headers("tools/list"))
    assert response.status_code == 200 and len(response.json()["result"]["tools"]) == len(TOOLS)


@pytest.mark.parametrize(
    "shape",
    ["another resource", "a resource below ours", "no resource", "no user", "expired"],
)
async def test_an_oauth_token_not_for_exactly_our_resource_or_without_a_user_or_expired_gets_401(
    mcp_app: InProcessServer, shape: str
) -> None:
    resource = {
        "another resource": ["https://other.example/mcp"],
        "a resource below ours": [f"{settings.MCP_RESOURCE_URL}/deeper"],
        "no resource": [],
    }.get(shape, [settings.MCP_RESOURCE_URL])
    raw = await oauth_token(scope="mcp", resource=resource, with_user=shape != "no user", expired=shape == "expired")
    response = await mcp_app.post(raw, TOOLS_LIST, **stateless_headers("tools/list"))
    assert response.status_code == 401
    assert 'error="invalid_token"' in response.headers["www-authenticate"]


async def test_an_oauth_token_with_neither_mcp_scope_gets_403_insufficient_scope(mcp_app: InProcessServer) -> None:
    raw = await oauth_token(scope="profile", resource=[settings.MCP_RESOURCE_URL])
    response = await mcp_app.post(raw, TOOLS_LIST, **stateless_headers("tools/list"))
    assert response.status_code == 403
    assert (
        response.headers["www-authenticate"] == f'Bearer error="insufficient_scope", scope="mcp", {RESOURCE_METADATA}'
    )
    assert response.json()["error"] == "insufficient_scope"


async def test_over_the_rate_limit_a_credential_gets_429_with_retry_after(tmp_path: Path) -> None:
    token, other = await new_token("limited"), await new_token("other")
    async with serve_in_process(tmp_path / "workspace", RATE_LIMIT_PER_MINUTE=3) as server:
        statuses = [await list_tools(server, token) for _ in range(4)]
        assert [response.status_code for response in statuses] == [200, 200, 200, 429]
        refused = statuses[-1]
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        assert refused.json()["error"] == "rate_limited"
        # The limit is per credential: another token is unaffected.
        assert (await list_tools(server, other)).status_code == 200


async def test_a_read_only_token_lists_only_the_read_only_tools(mcp_app: InProcessServer) -> None:
    reader, writer = await new_token("reader", scope="mcp:read"), await new_token("writer")
    read_only = (await list_tools(mcp_app, reader)).json()["result"]["tools"]
    everything = (await list_tools(mcp_app, writer)).json()["result"]["tools"]
    assert {tool["name"] for tool in read_only} == READ_ONLY_TOOLS
    assert len(everything) == len(TOOLS)  # the 20 upstream tools and the toolkit's
