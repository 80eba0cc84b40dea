"""A tool call cancelled while its started record is being written: it never runs, and its record is closed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from audit import log
from audit.log import Actor
from audit.models import KIND_FINISHED, KIND_STARTED, OUTCOME_CANCELLED, OUTCOME_OK, AuditRecord
from mcpserver import dispatch
from mcpserver.call import ToolCall
from mcpserver.executor.remote import RemoteExecutor
from mcpserver.registry import ToolSpec
from mcpserver.results import ToolResult
from oauth.credentials import Principal

ACTOR = Actor(username="agent", credential_kind="bearer", credential_id="1")
PRINCIPAL = Principal(
    user_id=1,
    username="agent",
    credential_kind="bearer",
    credential_id=1,
    credential_name="t",
    scopes=frozenset({"mcp"}),
)


@pytest.fixture
def ran() -> list[dict[str, Any]]:
    return []


@pytest.fixture
def spec(ran: list[dict[str, Any]]) -> ToolSpec:
    async def tool(call: object, **arguments: Any) -> ToolResult:
        ran.append(arguments)  # no await before this: a call that gets here has run
        return ToolResult(text="ran", exit_code=0)

    return ToolSpec(
        name="terminal_exec", fn=tool, title="t", read_only=False, destructive=False, idempotent=False, open_world=False
    )


@pytest.fixture
def tool_call(tmp_path: Path) -> ToolCall:
    """The call the tool is given; the tool here never uses it, so its executor is never reached."""
    return ToolCall("terminal_exec", PRINCIPAL, RemoteExecutor(str(tmp_path / "executor.sock"), str(tmp_path)), 65536)


@pytest.fixture(autouse=True)
def _close_writer() -> Iterator[None]:
    yield
    log.close()


def slow_started(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Make the started record take a while to write; the event is set once it is being written."""
    writing = asyncio.Event()
    real = dispatch.acall_started

    async def slow(*args: Any, **kwargs: Any) -> AuditRecord:
        writing.set()
        await asyncio.sleep(0.2)
        return await real(*args, **kwargs)

    monkeypatch.setattr(dispatch, "acall_started", slow)
    return writing


@pytest.mark.django_db(transaction=True)
def test_a_call_cancelled_while_its_started_record_is_written_never_runs_and_is_recorded_cancelled(
    monkeypatch: pytest.MonkeyPatch, spec: ToolSpec, tool_call: ToolCall, ran: list[dict[str, Any]]
) -> None:
    async def cancel_during_the_write() -> None:
        writing = slow_started(monkeypatch)
        async with anyio.create_task_group() as group:
            group.start_soon(dispatch.run_audited, spec, tool_call, ACTOR, {"command": "rm -rf build"})
            await writing.wait()
            group.cancel_scope.cancel()

    anyio.run(cancel_during_the_write)
    assert ran == []
    started = AuditRecord.objects.get(kind=KIND_STARTED)
    assert started.arguments == {"command": "rm -rf build"}
    finished = AuditRecord.objects.get(kind=KIND_FINISHED)
    assert (finished.started_id, finished.outcome) == (started.id, OUTCOME_CANCELLED)


@pytest.mark.django_db(transaction=True)
def test_a_call_not_cancelled_runs_once(
    monkeypatch: pytest.MonkeyPatch, spec: ToolSpec, tool_call: ToolCall, ran: list[dict[str, Any]]
) -> None:
    async def call() -> ToolResult:
        slow_started(monkeypatch)
        return await dispatch.run_audited(spec, tool_call, ACTOR, {"command": "make"})

    assert anyio.run(call).text == "ran"
    assert ran == [{"command": "make"}]
    assert AuditRecord.objects.get(kind=KIND_FINISHED).outcome == OUTCOME_OK
