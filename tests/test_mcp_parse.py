"""Bodies no JSON parser should accept, sent to /mcp in-process: each gets HTTP 400 with a JSON-RPC error, never a 500
and never an error or a traceback in the log, whether it opens a session, is sent inside one, or is a 2026-07-28
request.

The refusal is mcpserver.bodies.JsonBodyGate's, which needs no process boundary. Each body reaches the application as
Daphne hands it on, in messages of Daphne's request buffer size, so that the gate assembles it from many. The log is
this process's (pytest's `caplog`): an exception that escapes the application's handlers is logged at ERROR with its
traceback by mcpserver.guard.JsonErrors, and one that escapes the application fails the request here (httpx's ASGI
transport raises it) where Daphne would have logged it. One body still goes through a real Daphne, in
tests/test_mcp_parse_live.py."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import pytest

import mcpserver.bodies
from tests.inprocess import InProcessServer, new_token
from tests.live import INITIALIZE, tool_count

pytestmark = [pytest.mark.inprocess, pytest.mark.anyio, pytest.mark.django_db(transaction=True)]

PROTOCOL = "2025-11-25"
PARSE_ERROR = -32700
DEPTH = 200_000  # far beyond Python's recursion limit, well inside the 4 MiB body limit
DAPHNE_CHUNK = 8192  # daphne.server.Server's request_buffer_size: the body arrives in messages of this size


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


async def daphne_chunks(body: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(body), DAPHNE_CHUNK):
        yield body[start : start + DAPHNE_CHUNK]


async def session_headers(server: InProcessServer, token: str) -> dict[str, str]:
    """The headers of a request inside a 2025-11-25 session this opens (names with underscores, for `http`)."""
    opened = await server.post(token, INITIALIZE)
    assert opened.status_code == 200, opened.text
    return {"mcp_session_id": opened.headers["mcp-session-id"], "mcp_protocol_version": PROTOCOL}


async def post_body(server: InProcessServer, token: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    """POST `body` as Daphne would hand it on (Content-Length, then the bytes in chunks): its status and text."""
    async with server.http(token, **headers) as client:
        answer = await client.post("/mcp", content=daphne_chunks(body), headers={"Content-Length": str(len(body))})
    return answer.status_code, answer.text


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The records of this test's call logged at ERROR or above or with a traceback, and any traceback in the text."""
    errors = [
        f"{record.name} {record.levelname}: {record.getMessage()}"
        for record in caplog.records
        if record.levelno >= logging.ERROR or record.exc_info or record.exc_text
    ]
    return errors + (["a traceback:\n" + caplog.text[-2000:]] if "Traceback" in caplog.text else [])


@pytest.mark.parametrize("era", ["opening a session", "inside a session", "2026-07-28"])
@pytest.mark.parametrize("name", sorted(HOSTILE_BODIES))
async def test_an_unparsable_body_gets_400_and_a_json_rpc_error_without_a_traceback(
    mcp_app: InProcessServer, caplog: pytest.LogCaptureFixture, name: str, era: str
) -> None:
    token = await new_token("parse")
    headers: dict[str, str] = {}
    if era == "inside a session":
        headers = await session_headers(mcp_app, token)
    elif era == "2026-07-28":
        headers["mcp_protocol_version"] = "2026-07-28"
    caplog.set_level(logging.INFO)  # the live server's root level: ours, Django's and Daphne's errors all reach it
    caplog.clear()
    status, text = await post_body(mcp_app, token, HOSTILE_BODIES[name], headers)
    assert status == 400, (status, text[:300])
    error = json.loads(text)["error"]
    assert error["code"] == PARSE_ERROR, error
    assert not errors_logged(caplog), errors_logged(caplog)


async def test_the_log_check_sees_an_exception_the_application_logs(
    mcp_app: InProcessServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above can fail: with the gate parsing as it once did (Python's json, whose RecursionError on deep
    nesting escaped as a 500), mcpserver.guard's log of the unhandled exception is what `caplog` records."""

    def python_json_parse_error(body: bytes) -> str | None:
        json.loads(body)
        return None

    monkeypatch.setattr(mcpserver.bodies, "parse_error", python_json_parse_error)
    token = await new_token("parse")
    caplog.set_level(logging.INFO)
    caplog.clear()
    status, _ = await post_body(mcp_app, token, HOSTILE_BODIES["nested arrays"], {})
    assert status == 500
    logged = errors_logged(caplog)
    assert any(entry.startswith("mcpserver.guard ERROR: a request at /mcp failed") for entry in logged), logged
    assert "RecursionError" in caplog.text and "Traceback" in caplog.text


async def test_the_session_still_answers_after_a_hostile_body(mcp_app: InProcessServer) -> None:
    token = await new_token("parse")
    headers = await session_headers(mcp_app, token)
    for body in HOSTILE_BODIES.values():
        assert (await post_body(mcp_app, token, body, headers))[0] == 400
    listing = await mcp_app.post(token, {"jsonrpc": "2.0", "id": 9, "method": "tools/list"}, **headers)
    assert listing.status_code == 200 and len(listing.json()["result"]["tools"]) == tool_count()
