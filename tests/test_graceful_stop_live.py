"""SIGTERM under load: every call a client sent gets an answer. Calls still running get the JSON-RPC error "the
server is stopping; the command was stopped" (and their commands end); calls that finished get their result, so
no call is recorded `ok` whose answer never left; the server exits cleanly and the chain verifies."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from mcpserver.stopping import CALL_STOPPED, STOPPING_CODE
from tests.live import LiveServer, apoll, live_pids_with, make_server, mcp_client, text_of

pytestmark = [pytest.mark.live, pytest.mark.anyio]
SLEEPERS = 20  # sessions with a long command running when the stop comes
LOOPERS = 10  # sessions calling quick commands one after another through the stop


def outcomes_by_marker(server: LiveServer, prefix: str) -> dict[str, str]:
    """The recorded outcome of every call whose command mentions `prefix`, by the marker word it echoed."""
    rows = server.database.query(
        "SELECT s.arguments AS arguments, f.outcome AS outcome FROM audit_auditrecord s "
        "JOIN audit_auditrecord f ON f.started_id = s.id WHERE s.kind = 'call.started' "
        "AND CAST(s.arguments AS TEXT) LIKE %s",
        f"%{prefix}%",
    )
    found = {}
    for row in rows:
        text = str(row["arguments"])
        start = text.index(prefix)
        found[text[start:].split()[0].strip("\"',}")] = str(row["outcome"])
    return found


async def test_sigterm_under_load_answers_every_call_with_its_result_or_the_stopping_error(tmp_path: Path) -> None:
    server = make_server(
        tmp_path,
        SANDSTORM_MAX_CONCURRENT_CALLS="64",
        SANDSTORM_MAX_SESSIONS_PER_CREDENTIAL="64",
        SANDSTORM_RATE_LIMIT="0",
    )
    server.start()
    prefix = f"stop{uuid.uuid4().hex[:8]}"
    sleeper_answers: list[object] = []
    seen_results: set[str] = set()  # the markers of quick calls whose result reached their client

    async def sleeper(number: int) -> None:
        async with mcp_client(server.mcp_url, server.token) as client:
            try:
                await client.call_tool("terminal_exec", {"command": f"sleep 60; echo {prefix}-s{number}"})
                sleeper_answers.append("a result")
            except MCPError as error:
                sleeper_answers.append((error.error.code, error.error.message))

    async def looper(number: int) -> None:
        try:
            async with mcp_client(server.mcp_url, server.token) as client:
                for call in range(10_000):
                    marker = f"{prefix}-l{number}-{call}"
                    result = await client.call_tool("terminal_exec", {"command": f"echo {marker}"})
                    if text_of(result) == f"stdout:\n{marker}\n\nexit_code: 0":
                        seen_results.add(marker)
        except Exception:  # noqa: BLE001 - after the stop a looper ends however its next call fails
            return

    began = time.monotonic()
    try:
        async with anyio.create_task_group() as group:
            for number in range(SLEEPERS):
                group.start_soon(sleeper, number)
            for number in range(LOOPERS):
                group.start_soon(looper, number)
            await apoll(lambda: len(live_pids_with(f"{prefix}-s")) >= SLEEPERS, 30, "every sleeper's command to run")
            await apoll(lambda: len(seen_results) >= LOOPERS, 30, "the loopers to be calling")
            assert server.process is not None
            stopped_at = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            exit_code = await anyio.to_thread.run_sync(server.process.wait, 30)
            stop_took = time.monotonic() - stopped_at
    finally:
        server.stop(signal.SIGKILL)  # a test that failed before the stop leaves no server behind
    assert exit_code == 0, server.log()[-3000:]
    assert stop_took < 15
    assert sleeper_answers == [(STOPPING_CODE, CALL_STOPPED)] * SLEEPERS
    assert not live_pids_with(f"{prefix}-s")  # the stopped commands ended with the server
    recorded = outcomes_by_marker(server, prefix)
    sleepers = {marker: outcome for marker, outcome in recorded.items() if "-s" in marker.removeprefix(prefix)}
    assert sorted(sleepers.values()) == ["cancelled"] * SLEEPERS
    # No quick call was recorded ok without its result reaching the client.
    recorded_ok = {marker for marker, outcome in recorded.items() if outcome == "ok" and "-l" in marker}
    assert recorded_ok <= seen_results, sorted(recorded_ok - seen_results)[:5]
    assert len(seen_results) >= LOOPERS and time.monotonic() - began < 120
    assert "Traceback" not in server.log()
    assert server.manage("audit_verify").returncode == 0
