"""Tool calls through the in-process /mcp application: results, the read-only scope's refusals and the concurrency
limit, with the audit records each leaves."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.inprocess import InProcessServer, new_token, records_of_call, serve_in_process, text_of
from tests.live import tool_count

pytestmark = [pytest.mark.inprocess, pytest.mark.anyio, pytest.mark.django_db(transaction=True)]

DEADLINE = 30.0  # seconds a condition may take to come true on a loaded machine; a healthy run ends the wait at once


async def wait_until_exists(path: Path) -> None:
    with anyio.fail_after(DEADLINE):
        while not path.exists():
            await anyio.sleep(0.01)


async def test_file_write_then_file_read_returns_the_content(mcp_app: InProcessServer) -> None:
    token = await new_token("files")
    written = await mcp_app.call_tool(token, "file_write", {"path": "notes/today.txt", "content": "hello\n"})
    read = await mcp_app.call_tool(token, "file_read", {"path": "notes/today.txt"})
    assert not written["isError"] and text_of(written) == f"Written 6 bytes to {mcp_app.workspace / 'notes/today.txt'}"
    assert not read["isError"] and text_of(read) == "hello\n"
    assert (mcp_app.workspace / "notes" / "today.txt").read_text() == "hello\n"


async def test_the_sdk_client_lists_the_20_tools_and_runs_terminal_exec(mcp_app: InProcessServer) -> None:
    token = await new_token("sdk")
    async with mcp_app.client(token) as client:
        tools = (await client.list_tools()).tools
        result = await client.call_tool("terminal_exec", {"command": "echo era-ok"})
    assert len(tools) == tool_count() and [tool.name for tool in tools[:2]] == ["file_read", "file_write"]
    assert "".join(getattr(block, "text", "") for block in result.content) == "stdout:\nera-ok\n\nexit_code: 0"
    assert result.structured_content is not None and result.structured_content["exit_code"] == 0


async def test_a_read_only_token_may_not_run_terminal_exec_and_the_refusal_is_recorded(
    mcp_app: InProcessServer,
) -> None:
    reader = await new_token("reader", scope="mcp:read")
    marker = uuid.uuid4().hex
    result = await mcp_app.call_tool(reader, "terminal_exec", {"command": f"touch {marker}"})
    assert result["isError"]
    assert text_of(result) == "Error: this credential's scope (mcp:read) does not allow terminal_exec"
    assert not (mcp_app.workspace / marker).exists()
    started, finished = await records_of_call(marker)
    assert (started.kind, finished.kind, finished.outcome) == ("call.started", "call.finished", "denied")
    assert finished.reason == "Error: this credential's scope (mcp:read) does not allow terminal_exec"
    assert (started.credential_name, started.scope) == ("reader", "mcp:read")


async def test_a_call_and_its_records_started_before_and_finished_after_with_its_principal(
    mcp_app: InProcessServer,
) -> None:
    token = await new_token("recorded", username="alice")
    marker = uuid.uuid4().hex
    began = time.monotonic()
    result = await mcp_app.call_tool(token, "terminal_exec", {"command": f"echo {marker}; sleep 0.1; exit 3"})
    elapsed_ms = (time.monotonic() - began) * 1000
    assert result["isError"]
    started, finished = await records_of_call(marker)
    assert started.id < finished.id and finished.started_id == started.id
    for record in (started, finished):
        assert (record.tool, record.username, record.credential_kind, record.credential_name) == (
            "terminal_exec",
            "alice",
            "bearer",
            "recorded",
        )
        assert (record.scope, record.client_address) == ("mcp", "127.0.0.1")
    assert started.arguments == {
        "command": f"echo {marker}; sleep 0.1; exit 3",
        "cwd": None,
        "timeout": None,
        "background_after": None,
        "description": None,
    }
    assert (finished.outcome, finished.exit_code) == ("error", 3)
    assert marker in finished.result_excerpt
    assert finished.duration_ms is not None and 100 <= finished.duration_ms <= elapsed_ms


async def test_calls_beyond_the_concurrency_limit_are_refused_while_others_run(tmp_path: Path) -> None:
    token = await new_token("one-at-a-time")
    async with serve_in_process(tmp_path / "workspace", MAX_CONCURRENT_CALLS=1) as server:
        started, release = server.workspace / "slow-started", server.workspace / "release"
        # Runs until the test lets it go (bounded: the tool's own timeout).
        slow_command = f"touch {started}; while [ ! -e {release} ]; do sleep 0.01; done; echo done"
        results: dict[str, dict[str, Any]] = {}
        second = f"echo second-{uuid.uuid4().hex}"

        async def slow() -> None:
            results["slow"] = await server.call_tool(
                token, "terminal_exec", {"command": slow_command, "timeout": DEADLINE}
            )

        async with anyio.create_task_group() as group:
            group.start_soon(slow)
            await wait_until_exists(started)
            results["second"] = await server.call_tool(token, "terminal_exec", {"command": second})
            release.touch()
        other = await server.call_tool(token, "terminal_exec", {"command": "echo after"})
    refused = results["second"]
    assert refused["isError"]
    assert (
        text_of(refused)
        == "Error: this credential already has 1 tool calls running (the limit); wait for one to finish"
    )
    assert "done" in text_of(results["slow"]) and not results["slow"]["isError"]
    assert "after" in text_of(other)  # the place is free again once the slow call has finished
    denied = (await records_of_call(second))[-1]
    assert denied.outcome == "denied" and "1 tool calls running" in denied.reason


async def test_a_command_past_its_timeout_is_recorded_as_timed_out_by_no_one(mcp_app: InProcessServer) -> None:
    token = await new_token("timeouts")
    marker = uuid.uuid4().hex
    result = await mcp_app.call_tool(token, "terminal_exec", {"command": f"echo {marker}; sleep 30", "timeout": 0.5})
    assert result["isError"] and result["structuredContent"]["timed_out"] is True
    _started, finished = await records_of_call(marker)
    assert finished.outcome == "timeout"
    assert finished.reason == "timed out: it ran past its timeout of 0.5 s, and its processes were killed"
    assert finished.detail is not None and finished.detail["stopped"] == {
        "channel": "timeout",
        "by": "",
        "detail": "0.5",
    }
