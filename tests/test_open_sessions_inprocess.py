"""Suspended credentials and open MCP sessions at /mcp, in-process: a suspended bearer token is refused with 403 and
a JSON-RPC error saying so (until resumed), and an open session is listed with who opened it from where, and
ended from the console's side (mcpserver.session_console) as Disconnect ends it: its next request gets 404, and a
tool call it was running is cancelled."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings

from audit.log import Actor
from audit.models import AuditRecord
from mcpserver.inflight import IN_FLIGHT
from mcpserver.session_console import end_session, list_sessions
from oauth.models import BearerToken
from oauth.suspension import resume_token, suspend_token
from tests.inprocess import InProcessServer, new_token, stateless_headers, stateless_meta
from tests.live import INITIALIZE

pytestmark = [pytest.mark.inprocess, pytest.mark.anyio, pytest.mark.django_db(transaction=True)]
TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": stateless_meta()}}
SESSION_VERSION = "2025-11-25"


@sync_to_async
def set_suspended(name: str, suspended: bool) -> None:
    token = BearerToken.objects.select_related("user").get(name=name)
    (suspend_token if suspended else resume_token)(token, None)


async def open_session(server: InProcessServer, token: str) -> str:
    """A 2025-11-25 session opened by the handshake; its id."""
    async with server.http(token, user_agent="inprocess-agent/1") as http:
        opened = await http.post("/mcp", json=INITIALIZE)
        assert opened.status_code == 200, opened.text
        session_id = opened.headers["mcp-session-id"]
        headers = {"mcp-session-id": session_id, "mcp-protocol-version": SESSION_VERSION}
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert (await http.post("/mcp", json=initialized, headers=headers)).status_code == 202
    return str(session_id)


async def in_session(server: InProcessServer, token: str, session_id: str, message: dict[str, Any]) -> httpx2.Response:
    return await server.post(token, message, mcp_session_id=session_id, mcp_protocol_version=SESSION_VERSION)


def tools_list(request_id: int = 2) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/list"}


async def test_a_suspended_token_is_refused_with_403_saying_so_until_resumed(mcp_app: InProcessServer) -> None:
    token = await new_token("laptop")
    assert (await mcp_app.post(token, TOOLS_LIST, **stateless_headers("tools/list"))).status_code == 200
    await set_suspended("laptop", True)
    refused = await mcp_app.post(token, TOOLS_LIST, **stateless_headers("tools/list"))
    assert refused.status_code == 403
    assert refused.headers["content-type"] == "application/json"
    assert 'error="invalid_token"' in refused.headers["www-authenticate"]
    assert "suspended by an administrator" in refused.headers["www-authenticate"]
    body = refused.json()
    assert body["jsonrpc"] == "2.0" and body["error"]["code"] == -32001
    assert "suspended by an administrator" in body["error"]["message"]
    await set_suspended("laptop", False)
    assert (await mcp_app.post(token, TOOLS_LIST, **stateless_headers("tools/list"))).status_code == 200


async def test_suspending_cancels_a_running_call_and_its_record_says_so(mcp_app: InProcessServer) -> None:
    token = await new_token("laptop")
    running = asyncio.ensure_future(mcp_app.call_tool(token, "terminal_exec", {"command": "sleep 60 # suspend-me"}))
    await wait_for(lambda: len(IN_FLIGHT) > 0, "the call to start")
    await sync_to_async(lambda: suspend_token(BearerToken.objects.get(name="laptop"), Actor(username="boss")))()
    async with asyncio.timeout(20):
        await running  # answered (whatever the answer) well before the command's minute
    [record] = await sync_to_async(lambda: list(AuditRecord.objects.filter(kind="call.finished")))()
    assert (record.outcome, record.reason) == ("cancelled", "cancelled: its credential was suspended by boss")


async def test_an_open_session_is_listed_with_who_opened_it_from_where(mcp_app: InProcessServer) -> None:
    token = await new_token("laptop", username="agent")
    other = await new_token("desk", username="agent")
    session_id = await open_session(mcp_app, token)
    await open_session(mcp_app, other)
    listing = await list_sessions()
    assert listing.serving and listing.silent_workers == []
    mine = [row for row in listing.rows if row["session_id"] == session_id]
    assert len(mine) == 1 and len(listing.rows) == 2
    [row] = mine
    token_id = await sync_to_async(lambda: BearerToken.objects.get(name="laptop").pk)()
    assert row["key"] == f"bearer:{token_id}" and row["credential_name"] == "laptop" and row["username"] == "agent"
    assert row["user_agent"] == "inprocess-agent/1" and row["worker"] == settings.WORKER
    assert row["opened_at"] <= row["last_request_at"] and row["busy"] is False
    assert [r["session_id"] for r in (await list_sessions(f"bearer:{token_id}")).rows] == [session_id]


async def test_ending_a_session_makes_its_next_request_fail_and_revokes_nothing(mcp_app: InProcessServer) -> None:
    token = await new_token("laptop")
    session_id = await open_session(mcp_app, token)
    assert (await in_session(mcp_app, token, session_id, tools_list())).status_code == 200
    ended = await end_session(session_id, "boss")
    assert ended is not None and ended["session_id"] == session_id
    assert await end_session(session_id, "boss") is None, "ended once"
    assert (await in_session(mcp_app, token, session_id, tools_list(3))).status_code == 404, "at once"
    assert session_id not in [row["session_id"] for row in (await list_sessions()).rows]
    assert await open_session(mcp_app, token) != session_id, "the credential opens a new session at once"


async def test_ending_a_session_cancels_the_tool_call_it_is_running(mcp_app: InProcessServer) -> None:
    token = await new_token("laptop")
    session_id = await open_session(mcp_app, token)
    call = {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
            "params": {"name": "terminal_exec", "arguments": {"command": "sleep 60 # disconnect-me"}}}  # fmt: skip
    running = asyncio.ensure_future(in_session(mcp_app, token, session_id, call))
    await wait_for(lambda: len(IN_FLIGHT) > 0, "the call to start")
    assert (await list_sessions()).rows[0]["busy"] is True
    await end_session(session_id, "boss")
    async with asyncio.timeout(20):
        await running  # answered (whatever the answer) well before the command's minute
    finished = sync_to_async(lambda: list(AuditRecord.objects.filter(kind="call.finished")))
    async with asyncio.timeout(10):  # the cancelled call's record may be committed after the answer has gone
        while not (records := await finished()):
            await asyncio.sleep(0.05)
    assert [(record.outcome, record.reason) for record in records] == [
        ("cancelled", "cancelled: its MCP session was disconnected by boss from the console")
    ]
    assert (records[0].detail or {})["stopped"] == {"channel": "session_ended", "by": "boss"}


async def wait_for(check: Any, what: str, deadline: float = 10.0) -> None:
    async with asyncio.timeout(deadline):
        while not check():
            await asyncio.sleep(0.02)
