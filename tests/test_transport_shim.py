"""The SDK's session manager, driven in process, opens its sessions on mcpserver.transport's SandstormTransport.

mcpserver.transport.install replaces the class the SDK's session manager builds a session's transport from (the SDK
takes no argument to choose it). These tests fail as soon as an SDK no longer builds it through that name, before
the session caps silently stop applying.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from mcp.server import streamable_http_manager
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import Message

from mcpserver.sessions import OPENING, OpenSession, SessionLedger
from mcpserver.transport import SandstormTransport, install
from tests.live import INITIALIZE, MCP_HEADERS

pytestmark = [pytest.mark.anyio]


@pytest.fixture
async def manager() -> AsyncIterator[StreamableHTTPSessionManager]:
    install()
    settings = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    sdk_manager = StreamableHTTPSessionManager(Server("shim-test"), security_settings=settings)
    async with sdk_manager.run():
        yield sdk_manager


async def request(
    manager: StreamableHTTPSessionManager, method: str, headers: dict[str, str], body: object = None
) -> tuple[int, dict[str, str], bytes]:
    """One request through the manager's ASGI entry point: its status, headers and body."""
    payload = b"" if body is None else json.dumps(body).encode()
    scope: dict[str, Any] = {
        "type": "http",
        "method": method,
        "path": "/mcp",
        "query_string": b"",
        "headers": [(name.lower().encode(), value.encode()) for name, value in headers.items()],
    }
    incoming: list[Message] = [{"type": "http.request", "body": payload, "more_body": False}]
    sent: list[Message] = []
    answered = anyio.Event()

    async def receive() -> Message:
        if incoming:
            return incoming.pop(0)
        await answered.wait()  # the client stays until its answer is complete
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            answered.set()

    await manager.handle_request(scope, receive, send)
    start = sent[0]
    answer_headers = {name.decode(): value.decode() for name, value in start["headers"]}
    return start["status"], answer_headers, b"".join(m.get("body", b"") for m in sent[1:])


async def open_session(manager: StreamableHTTPSessionManager, entry: OpenSession) -> dict[str, str]:
    opening = OPENING.set(entry)
    try:
        status, headers, _ = await request(manager, "POST", MCP_HEADERS, INITIALIZE)
    finally:
        OPENING.reset(opening)
    assert status == 200
    return {**MCP_HEADERS, "Mcp-Session-Id": headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-11-25"}


def ping(progress_token: object = None) -> dict[str, Any]:
    params = {"_meta": {"progressToken": progress_token}} if progress_token is not None else {}
    return {"jsonrpc": "2.0", "id": 5, "method": "ping", "params": params}


async def test_the_sdk_opens_a_session_on_sandstorms_transport_bound_to_its_place_in_the_ledger(
    manager: StreamableHTTPSessionManager,
) -> None:
    ledger = SessionLedger(per_credential=4, per_user=4, unused_timeout=60)
    entry = ledger.admit("bearer:1", 1)
    assert entry is not None
    session = await open_session(manager, entry)
    assert isinstance(entry.transport, SandstormTransport), (
        "the SDK no longer builds its session transport through streamable_http_manager.StreamableHTTPServerTransport: "
        "the session caps do not apply (see mcpserver.transport.install)"
    )
    assert entry.transport.mcp_session_id == session["Mcp-Session-Id"]
    assert not entry.used and entry.in_flight == 0

    status, _, _ = await request(manager, "POST", session, ping())
    assert status == 200 and entry.used and entry.in_flight == 0

    status, _, _ = await request(manager, "DELETE", session)
    assert status == 200 and entry.closed and ledger.open_count("bearer:1") == 0


async def test_a_request_without_a_progress_token_gets_one_json_body_and_one_with_a_token_its_stream(
    manager: StreamableHTTPSessionManager,
) -> None:
    ledger = SessionLedger(per_credential=4, per_user=4, unused_timeout=60)
    entry = ledger.admit("bearer:1", 1)
    assert entry is not None
    session = await open_session(manager, entry)

    status, headers, body = await request(manager, "POST", session, ping())
    assert (status, headers["content-type"]) == (200, "application/json")
    assert json.loads(body) == {"jsonrpc": "2.0", "id": 5, "result": {}}

    status, headers, body = await request(manager, "POST", session, ping(progress_token="p"))
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert b'"id":5' in body


async def test_install_refuses_an_sdk_that_no_longer_has_the_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(streamable_http_manager, "StreamableHTTPServerTransport")
    with pytest.raises(RuntimeError, match="no longer builds its transport"):
        install()
