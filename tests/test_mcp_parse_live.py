"""Bodies no JSON parser should accept, sent to /mcp: each gets HTTP 400 with a JSON-RPC error, never a 500 and never
a traceback in the server's log, whether it opens a session, is sent inside one, or is a 2026-07-28 request."""

from __future__ import annotations

import uuid

import httpx2
import pytest

from tests.live import INITIALIZE, MCP_HEADERS, LiveServer, auth_headers, tool_count

pytestmark = [pytest.mark.live]

PROTOCOL = "2025-11-25"
PARSE_ERROR = -32700
DEPTH = 200_000  # far beyond Python's recursion limit, well inside the 4 MiB body limit


def envelope(inner: bytes) -> bytes:
    """A tools/call whose `arguments` hold `inner`."""
    return (
        b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"file_read","arguments":{"path":'
        + inner
        + b"}}}"
    )


HOSTILE_BODIES = {
    "nested arrays": b"[" * DEPTH + b"]" * DEPTH,
    "nested objects": b'{"a":' * DEPTH + b"1" + b"}" * DEPTH,
    "nested arrays inside a tools/call": envelope(b"[" * DEPTH + b"]" * DEPTH),
    "unclosed nesting": b"[" * DEPTH,
    "invalid UTF-8": b'{"jsonrpc":"2.0","id":5,"method":"tools/list\xff\xfe"}',
    "a lone surrogate": b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"file_read","arguments":{"path":"\\ud800"}}}',
    "a 5000-digit number": envelope(b"1" + b"0" * 5000),
    "NaN": envelope(b"NaN"),
    "Infinity": envelope(b"-Infinity"),
    "truncated": b'{"jsonrpc":"2.0","id":5,"method":"tools/li',
    "not JSON at all": b"\x00\x01\x02 garbage",
}


@pytest.fixture(scope="module")
def token(live_server: LiveServer) -> str:
    return live_server.create_token(f"parse-{uuid.uuid4().hex[:12]}")


def session_headers(server: LiveServer, token: str) -> dict[str, str]:
    headers = {**MCP_HEADERS, **auth_headers(token)}
    opened = httpx2.post(server.mcp_url, json=INITIALIZE, headers=headers, timeout=10)
    assert opened.status_code == 200, opened.text
    return headers | {"Mcp-Session-Id": opened.headers["mcp-session-id"], "Mcp-Protocol-Version": PROTOCOL}


@pytest.mark.parametrize("era", ["opening a session", "inside a session", "2026-07-28"])
@pytest.mark.parametrize("name", sorted(HOSTILE_BODIES))
def test_an_unparsable_body_gets_400_and_a_json_rpc_error_without_a_traceback(
    live_server: LiveServer, token: str, name: str, era: str
) -> None:
    headers = {**MCP_HEADERS, **auth_headers(token)}
    if era == "inside a session":
        headers = session_headers(live_server, token)
    elif era == "2026-07-28":
        headers["Mcp-Protocol-Version"] = "2026-07-28"
    log_before = len(live_server.log())
    answer = httpx2.post(live_server.mcp_url, content=HOSTILE_BODIES[name], headers=headers, timeout=30)
    assert answer.status_code == 400, (answer.status_code, answer.text[:300])
    error = answer.json()["error"]
    assert error["code"] == PARSE_ERROR, error
    logged = live_server.log()[log_before:]
    assert "Traceback" not in logged and '"level": "ERROR"' not in logged, logged[-2000:]


def test_the_session_still_answers_after_a_hostile_body(live_server: LiveServer, token: str) -> None:
    headers = session_headers(live_server, token)
    for body in HOSTILE_BODIES.values():
        assert httpx2.post(live_server.mcp_url, content=body, headers=headers, timeout=30).status_code == 400
    listing = httpx2.post(
        live_server.mcp_url, json={"jsonrpc": "2.0", "id": 9, "method": "tools/list"}, headers=headers, timeout=30
    )
    assert listing.status_code == 200 and len(listing.json()["result"]["tools"]) == tool_count()


def test_a_deeply_nested_registration_body_gets_400_not_500(live_server: LiveServer) -> None:
    depth = 8000  # beyond Python's recursion limit, inside the registration body's 16 KiB cap
    answer = httpx2.post(
        f"{live_server.url}/oauth/register/",
        content=b"[" * depth + b"]" * depth,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert answer.status_code == 400 and answer.json()["error"] == "invalid_client_metadata"
