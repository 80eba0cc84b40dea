"""One credential, or many of one user, cannot take every MCP session of a server; sessions never used are closed.

Against a live server with small caps (4 per credential, 10 per user) and a 2-second unused timeout. Sessions are
opened over raw HTTP, as a flood would be; a session is open while a request with its id is answered (else 404).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx2
import pytest

from tests.live import INITIALIZE, MCP_HEADERS, LiveServer, auth_headers, mcp_client, poll, running_server, text_of
from tests.oauth_flow import shell

pytestmark = [pytest.mark.live]
PER_CREDENTIAL, PER_USER, UNUSED_TIMEOUT = 4, 10, 2
FLOOD = 30
LISTING = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with running_server(
        tmp_path_factory.mktemp("sessions"),
        SANDSTORM_MAX_SESSIONS_PER_CREDENTIAL=str(PER_CREDENTIAL),
        SANDSTORM_MAX_SESSIONS_PER_USER=str(PER_USER),
        SANDSTORM_SESSION_UNUSED_TIMEOUT=str(UNUSED_TIMEOUT),
        SANDSTORM_RATE_LIMIT="0",
    ) as live:
        yield live


def open_session(http: httpx2.Client, server: LiveServer, token: str) -> httpx2.Response:
    return http.post(server.mcp_url, json=INITIALIZE, headers={**MCP_HEADERS, **auth_headers(token)})


def session_answers(http: httpx2.Client, server: LiveServer, token: str, session_id: str) -> int:
    headers = {**MCP_HEADERS, **auth_headers(token), "Mcp-Session-Id": session_id, "Mcp-Protocol-Version": "2025-11-25"}
    return http.post(server.mcp_url, json=LISTING, headers=headers).status_code


def still_open_unused(http: httpx2.Client, server: LiveServer, token: str, session_id: str) -> bool:
    """Probe a session with the handshake's notification, which does not count as use: 202 if open, 404 if not."""
    headers = {**MCP_HEADERS, **auth_headers(token), "Mcp-Session-Id": session_id, "Mcp-Protocol-Version": "2025-11-25"}
    notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    status = http.post(server.mcp_url, json=notification, headers=headers).status_code
    assert status in (202, 404), status
    return status == 202


def flood(http: httpx2.Client, server: LiveServer, token: str, count: int) -> list[httpx2.Response]:
    return [open_session(http, server, token) for _ in range(count)]


def test_a_flood_of_sessions_from_one_credential_keeps_only_its_newest_few_open(server: LiveServer) -> None:
    token = server.create_token(f"flood-{uuid.uuid4().hex[:8]}")
    with httpx2.Client(timeout=10) as http:
        answers = flood(http, server, token, FLOOD)
        assert all(answer.status_code == 200 for answer in answers), (
            "a client that keeps reconnecting is not locked out"
        )
        ids = [answer.headers["mcp-session-id"] for answer in answers]
        statuses = [session_answers(http, server, token, session_id) for session_id in ids]
        assert statuses[-PER_CREDENTIAL:] == [200] * PER_CREDENTIAL
        assert statuses[:-PER_CREDENTIAL] == [404] * (FLOOD - PER_CREDENTIAL), "its older sessions were closed"
        other = open_session(http, server, server.token)
        assert other.status_code == 200, "another credential still gets a session"
        assert session_answers(http, server, server.token, other.headers["mcp-session-id"]) == 200


def test_many_tokens_of_one_user_cannot_take_more_than_the_users_cap(server: LiveServer) -> None:
    username = f"flooder-{uuid.uuid4().hex[:6]}"
    shell(server, f"from django.contrib.auth import get_user_model; get_user_model().objects.create_user({username!r})")
    tokens = [
        server.manage("create_token", f"{username}-{n}", "--user", username).stdout.strip().splitlines()[-1]
        for n in range(4)
    ]
    with httpx2.Client(timeout=10) as http:
        opened = [flood(http, server, token, PER_CREDENTIAL) for token in tokens[:3]]  # 12 sessions for a cap of 10
        assert all(answer.status_code == 200 for answers in opened for answer in answers)
        refused = open_session(http, server, tokens[3])
        assert refused.status_code == 429, "a fourth token of the user gets no session"
        assert "Too many open sessions" in refused.json()["error"]["message"] and refused.headers["retry-after"]
        still_open = [
            [session_answers(http, server, token, answer.headers["mcp-session-id"]) for answer in answers]
            for token, answers in zip(tokens[:3], opened, strict=True)
        ]
        # At the user's cap the third token could only replace its own sessions, never another token's.
        assert still_open == [[200] * 4, [200] * 4, [404, 404, 200, 200]], still_open
        other = open_session(http, server, server.token)
        assert other.status_code == 200, "a credential of another user still gets a session"


def test_a_session_that_never_makes_a_request_is_closed_after_the_unused_timeout(server: LiveServer) -> None:
    token = server.create_token(f"idle-{uuid.uuid4().hex[:8]}")
    with httpx2.Client(timeout=10) as http:
        unused, used = (open_session(http, server, token).headers["mcp-session-id"] for _ in range(2))
        assert session_answers(http, server, token, used) == 200
        started = time.monotonic()
        assert still_open_unused(http, server, token, unused)
        poll(
            lambda: not still_open_unused(http, server, token, unused),
            UNUSED_TIMEOUT + 10,
            what="the unused session to close",
        )
        assert time.monotonic() - started < UNUSED_TIMEOUT + 10
        time.sleep(0.5)  # past the deadline of `used` too, had it been unused
        assert session_answers(http, server, token, used) == 200, "a session in use stays open"
    assert "no request beyond the handshake" in server.log()


@pytest.mark.anyio
async def test_the_sdk_client_keeps_working_with_the_caps(server: LiveServer) -> None:
    token = server.create_token(f"sdk-{uuid.uuid4().hex[:8]}")
    for _ in range(PER_CREDENTIAL + 2):  # more sessions than the cap, one after another, none closed by the client
        async with mcp_client(server.mcp_url, token) as client:
            result = await client.call_tool("terminal_exec", {"command": "echo hi"})
            assert "hi" in text_of(result)
