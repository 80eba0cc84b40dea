"""The server's log as journald gets it: JSON lines, one per request and one per tool call, never a secret."""

from __future__ import annotations

import json
import logging
import uuid

import httpx2
import pytest

from mcpserver.executor.jsonlog import JsonFormatter
from tests.live import LiveServer, mcp_client, poll

pytestmark = [pytest.mark.live]


def json_lines(server: LiveServer) -> list[dict[str, object]]:
    return [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]


def test_every_log_line_is_a_json_object_with_the_common_fields(live_server: LiveServer) -> None:
    httpx2.get(f"{live_server.url}/health")
    lines = [line for line in live_server.log().splitlines() if line.strip()]
    # Lines Daphne or Python print before logging is configured are not ours to shape; all of ours are JSON.
    ours = [json.loads(line) for line in lines if line.startswith("{")]
    assert len(ours) >= len(lines) - 2
    for line in ours:
        assert {"ts", "level", "logger", "msg"} <= set(line)


def test_one_access_line_per_request_without_the_query_string(live_server: LiveServer) -> None:
    marker = f"q-{uuid.uuid4().hex}"
    httpx2.get(f"{live_server.url}/health?access_token={marker}")

    def found() -> list[dict[str, object]]:
        return [
            entry
            for entry in json_lines(live_server)
            if entry["logger"] == "sandstorm.access" and entry["path"] == "/health"
        ]

    line = poll(found, 10, what="the access line")[-1]
    assert {"ts", "level", "logger", "msg", "method", "path", "status", "duration_ms", "client"} <= set(line)
    assert line["method"] == "GET" and line["status"] == 200 and line["client"] == "127.0.0.1"
    assert isinstance(line["duration_ms"], float | int)
    assert marker not in live_server.log()


@pytest.mark.anyio
async def test_one_line_per_tool_call_without_arguments_or_results(live_server: LiveServer, anyio_backend: str) -> None:
    secret = f"argument-{uuid.uuid4().hex}"
    async with mcp_client(live_server.mcp_url, live_server.token) as client:
        await client.call_tool("terminal_exec", {"command": f"echo {secret}"})

    def found() -> list[dict[str, object]]:
        return [
            entry for entry in json_lines(live_server) if entry.get("tool") == "terminal_exec" and "call_id" in entry
        ]

    line = poll(found, 10, what="the tool-call line")[-1]
    assert line["user"] == "admin" and line["outcome"] == "ok"
    assert str(line["credential"]).startswith("bearer") or ":" in str(line["credential"])
    assert isinstance(line["duration_ms"], int) and line["call_id"]
    assert secret not in live_server.log()
    assert live_server.token not in live_server.log()


def test_the_formatter_adds_extra_fields_and_tracebacks() -> None:
    record = logging.LogRecord("sandstorm.test", logging.ERROR, __file__, 1, "failed %s", ("here",), None)
    record.tool = "file_read"
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "failed here" and line["level"] == "ERROR" and line["logger"] == "sandstorm.test"
    assert line["tool"] == "file_read" and "ValueError: boom" in line["exc"]
    assert line["ts"].endswith("+00:00")
