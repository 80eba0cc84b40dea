"""How a 2025-11-25 session answers a request: one JSON body when nothing but the answer can come, else an SSE stream;
and how it answers the GET for its own stream: headers at once, and a fresh stream for a `Last-Event-ID`.

Over raw HTTP, so the content type and the wire format are what the test sees (the SDK client accepts both).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import pytest

from mcpserver.transport import only_an_answer_can_follow
from tests.live import INITIALIZE, MCP_HEADERS, LiveServer, apoll, auth_headers, live_group_members, live_pids_with

pytestmark = [pytest.mark.live, pytest.mark.anyio]

PROTOCOL = "2025-11-25"
SLOW_OUTPUT = "for i in 1 2 3 4; do echo line-$i; sleep 0.4; done"


def open_session(server: LiveServer, token: str) -> dict[str, str]:
    """Initialize a session over raw HTTP; the headers its later requests carry."""
    headers = {**MCP_HEADERS, **auth_headers(token)}
    opened = httpx2.post(server.mcp_url, json=INITIALIZE, headers=headers, timeout=10)
    assert opened.status_code == 200, opened.text
    headers |= {"Mcp-Session-Id": opened.headers["mcp-session-id"], "Mcp-Protocol-Version": PROTOCOL}
    notified = httpx2.post(
        server.mcp_url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers, timeout=10
    )
    assert notified.status_code == 202
    return headers


def tool_call(request_id: int, name: str, arguments: dict[str, Any], progress_token: object = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if progress_token is not None:
        params["_meta"] = {"progressToken": progress_token}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def sse_messages(body: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in body.splitlines() if line.startswith("data:") and line[5:].strip()]


@pytest.fixture(scope="module")
def token(live_server: LiveServer) -> str:
    return live_server.create_token(f"transport-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def session(live_server: LiveServer, token: str) -> dict[str, str]:
    return open_session(live_server, token)


def test_a_call_without_a_progress_token_is_answered_with_one_json_body(
    live_server: LiveServer, session: dict[str, str]
) -> None:
    response = httpx2.post(
        live_server.mcp_url, json=tool_call(7, "terminal_exec", {"command": "echo hi"}), headers=session, timeout=30
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.headers["mcp-session-id"] == session["Mcp-Session-Id"]
    answer = response.json()
    assert answer["id"] == 7
    assert answer["result"]["content"][0]["text"] == "stdout:\nhi\n\nexit_code: 0"


def test_a_call_with_a_progress_token_keeps_its_stream_and_its_progress(
    live_server: LiveServer, session: dict[str, str]
) -> None:
    call = tool_call(8, "terminal_exec", {"command": SLOW_OUTPUT}, progress_token="p-8")
    response = httpx2.post(live_server.mcp_url, json=call, headers=session, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    messages = sse_messages(response.text)
    progress = [m for m in messages if m.get("method") == "notifications/progress"]
    assert progress and all(m["params"]["progressToken"] == "p-8" for m in progress)
    assert messages[-1]["id"] == 8 and "line-4" in messages[-1]["result"]["content"][0]["text"]


def test_other_requests_of_the_session_are_answered_with_json_too(
    live_server: LiveServer, session: dict[str, str]
) -> None:
    response = httpx2.post(
        live_server.mcp_url, json={"jsonrpc": "2.0", "id": 9, "method": "tools/list"}, headers=session, timeout=30
    )
    assert response.headers["content-type"] == "application/json"
    assert "terminal_exec" in {tool["name"] for tool in response.json()["result"]["tools"]}


async def test_a_json_answer_beside_a_streamed_call_leaves_that_stream_its_progress(
    live_server: LiveServer, session: dict[str, str]
) -> None:
    """The two ways of answering share one session (its message router): choosing JSON for one request must not
    drop the notifications of another."""
    streamed: dict[str, Any] = {}
    async with httpx2.AsyncClient(timeout=30) as http:
        running = live_server.workspace / f"streaming-{uuid.uuid4().hex}"
        command = f"touch {running}; {SLOW_OUTPUT}"

        async def call_with_progress() -> None:
            response = await http.post(
                live_server.mcp_url, json=tool_call(20, "terminal_exec", {"command": command}, "p-20"), headers=session
            )
            streamed["type"], streamed["messages"] = response.headers["content-type"], sse_messages(response.text)

        async with anyio.create_task_group() as group:
            group.start_soon(call_with_progress)
            await apoll(running.exists, 30, what="the streamed call to run")
            for request_id in range(21, 26):
                plain = await http.post(
                    live_server.mcp_url,
                    json=tool_call(request_id, "terminal_exec", {"command": "true"}),
                    headers=session,
                )
                assert plain.headers["content-type"] == "application/json"
                assert plain.json()["id"] == request_id
    assert streamed["type"].startswith("text/event-stream")
    assert [m for m in streamed["messages"] if m.get("method") == "notifications/progress"], streamed["messages"]
    assert streamed["messages"][-1]["id"] == 20


def test_a_client_that_accepts_only_json_is_refused_as_before(live_server: LiveServer, session: dict[str, str]) -> None:
    headers = {**session, "Accept": "application/json"}
    response = httpx2.post(
        live_server.mcp_url, json=tool_call(30, "terminal_exec", {"command": "true"}), headers=headers, timeout=30
    )
    assert response.status_code == 406


async def test_hanging_up_on_a_json_answered_call_ends_its_command_and_records_it_cancelled(
    live_server: LiveServer, session: dict[str, str]
) -> None:
    marker = uuid.uuid4().hex
    body = json.dumps(tool_call(40, "terminal_exec", {"command": f"sleep 300; echo {marker}", "timeout": 120})).encode()
    assert only_an_answer_can_follow(body)
    lines = ["POST /mcp HTTP/1.1", f"Host: 127.0.0.1:{live_server.port}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in session.items()]
    with socket.create_connection(("127.0.0.1", live_server.port), timeout=10) as raw:
        raw.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        pids = await apoll(lambda: live_pids_with(marker), 10, "the command to start")
        pgid = os.getpgid(pids[0])
    # The connection is closed with no answer read: the server must end the command and record why.
    await apoll(lambda: not live_pids_with(marker), 15, "the abandoned command to end")
    sql = "SELECT call_id FROM audit_auditrecord WHERE kind='call.started' AND CAST(arguments AS TEXT) LIKE %s"
    started = live_server.database.query(sql, f"%{marker}%")
    assert len(started) == 1

    def outcome() -> object:
        rows = live_server.database.query(
            "SELECT outcome FROM audit_auditrecord WHERE kind='call.finished' AND call_id=%s", started[0]["call_id"]
        )
        return rows[0]["outcome"] if rows else None

    assert await apoll(outcome, 15, "the finished record") == "cancelled"
    assert await apoll(lambda: not live_group_members(pgid), 15, "the rest of its process group to end")


@contextlib.contextmanager
def get_stream(server: LiveServer, session: dict[str, str], **extra: str) -> Iterator[tuple[httpx2.Response, float]]:
    """The GET a client opens for what the server sends unasked: its response, open until the block ends, and how
    many seconds its headers took. A read timeout of 3 s: an answer that never comes fails the test, not the suite."""
    headers = {**session, "Accept": "text/event-stream", **extra}
    with httpx2.Client(timeout=httpx2.Timeout(10, read=3)) as client:
        began = time.monotonic()
        with client.stream("GET", server.mcp_url, headers=headers) as response:
            yield response, time.monotonic() - began


def test_the_get_stream_sends_its_headers_at_once(live_server: LiveServer, session: dict[str, str]) -> None:
    """Daphne writes headers with the first body bytes; the first ones used to be the keep-alive comment, 15 s on."""
    with get_stream(live_server, session) as (response, took):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["mcp-session-id"] == session["Mcp-Session-Id"]
        assert took < 1, took


def test_a_get_with_a_last_event_id_is_answered_at_once_with_a_stream_that_stays_open(
    live_server: LiveServer, session: dict[str, str]
) -> None:
    """No event is numbered, so nothing is replayed: the GET opens a fresh stream, as one without the header does.
    It used to get no answer at all. The stream stays open, so a client has no reason to reconnect in a loop."""
    with get_stream(live_server, session, **{"Last-Event-ID": "0"}) as (response, took):
        assert (response.status_code, took < 1) == (200, True), (response.status_code, took)
        assert response.headers["content-type"].startswith("text/event-stream")
        with pytest.raises(httpx2.ReadTimeout):  # nothing to read, and no end of the stream, for 3 s
            next(response.iter_bytes())


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (tool_call(1, "terminal_exec", {"command": "true"}), True),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, True),
        (tool_call(1, "terminal_exec", {"command": "true"}, progress_token="t"), False),
        (tool_call(1, "terminal_exec", {"command": "true"}, progress_token=0), False),
        (INITIALIZE, False),
        ({"jsonrpc": "2.0", "method": "notifications/initialized"}, False),
        ([tool_call(1, "terminal_exec", {"command": "true"})], False),
        ({"jsonrpc": "2.0", "id": 1, "result": {}}, False),
    ],
)
def test_only_a_lone_request_without_a_progress_token_is_chosen_for_json(message: object, expected: bool) -> None:
    assert only_an_answer_can_follow(json.dumps(message).encode()) is expected
    assert only_an_answer_can_follow(b"{not json") is False
