"""End to end with the official SDK's OAuthClientProvider, from no token at all: 401 → metadata → registration →
authorize (S256) → consent → token → tools/list → refresh → rotation → the old tokens fail."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata
from pydantic import AnyUrl

from tests.live import LiveServer, running_server, tool_count
from tests.oauth_flow import LOOPBACK_REDIRECT, AdminSession, MemoryStorage, mcp_status, query_of, refresh
from tests.oauth_flow import Client as RegisteredClient

pytestmark = [pytest.mark.live]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server of this module's own: the test rotates every credential on it."""
    with running_server(tmp_path_factory.mktemp("oauth-e2e")) as live:
        yield live


def provider_for(
    server: LiveServer, admin: AdminSession, storage: MemoryStorage, seen: list[str]
) -> OAuthClientProvider:
    callback: dict[str, str] = {}

    async def redirect_handler(url: str) -> None:
        seen.append(url)
        # The "browser": the signed-in admin opens the consent page and approves it.
        callback["location"] = await anyio.to_thread.run_sync(admin.decide, url)

    async def callback_handler() -> AuthorizationCodeResult:
        answer = query_of(callback["location"])
        return AuthorizationCodeResult(code=answer["code"], state=answer.get("state"), iss=answer.get("iss"))

    metadata = OAuthClientMetadata(
        client_name="SDK end-to-end",
        redirect_uris=[AnyUrl(LOOPBACK_REDIRECT)],
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="client_secret_post",
    )
    return OAuthClientProvider(
        server_url=server.mcp_url,
        client_metadata=metadata,
        storage=storage,
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
    )


@pytest.mark.anyio
async def test_the_sdk_client_connects_from_nothing_refreshes_and_is_cut_off_by_rotation(
    server: LiveServer, tmp_path: Path
) -> None:
    admin = AdminSession(server)
    storage = MemoryStorage()
    seen: list[str] = []
    provider = provider_for(server, admin, storage, seen)
    requests: list[str] = []

    async def log_request(request: httpx2.Request) -> None:
        requests.append(f"{request.method} {request.url.path}")

    http = httpx2.AsyncClient(auth=provider, timeout=httpx2.Timeout(60), event_hooks={"request": [log_request]})
    async with http, Client(streamable_http_client(server.mcp_url, http_client=http), mode="legacy") as client:
        assert len((await client.list_tools()).tools) == tool_count()
        # The discovery path the SDK took, from the first 401 on.
        assert requests[:5] == [
            "POST /mcp",
            "GET /.well-known/oauth-protected-resource/mcp",
            "GET /.well-known/oauth-authorization-server",
            "POST /oauth/register/",
            "POST /oauth/token/",
        ]
        authorize = query_of(seen[0])
        assert authorize["code_challenge_method"] == "S256" and authorize["resource"] == server.mcp_url
        first = storage.history[-1]
        assert first.refresh_token and first.expires_in and first.expires_in <= 3600

        # Refresh: the SDK refreshes a token it believes expired, in the same MCP session.
        provider.context.token_expiry_time = time.time() - 1
        assert len((await client.list_tools()).tools) == tool_count()
        second = storage.history[-1]
        assert second.access_token != first.access_token and second.refresh_token != first.refresh_token
        assert mcp_status(server, first.access_token).status_code == 401  # the refreshed-away access token

    assert mcp_status(server, second.access_token).status_code == 200
    new_bearer = server.manage("rotate_tokens").stdout.strip().splitlines()[-1]

    assert mcp_status(server, second.access_token).status_code == 401
    assert mcp_status(server, server.token).status_code == 401  # the bootstrap bearer token
    assert storage.client_info is not None and second.refresh_token is not None
    registered = RegisteredClient(storage.client_info.client_id, storage.client_info.client_secret, LOOPBACK_REDIRECT)
    refused = refresh(server, registered, second.refresh_token)
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_grant"
    assert mcp_status(server, new_bearer).status_code == 200
    admin.close()
