"""The audit invariant, both halves (docs/security.md): no result reaches an agent unrecorded, and no side effect
starts before its record is durable.

A read-only tool runs first; its started and finished records are committed together afterwards, before its result
leaves, and a read whose records cannot be written has its result withheld. Every other tool has its started record
committed before it runs. The database refusals here are real: a trigger in the test database rejects the records."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from audit import log
from audit.models import KIND_FINISHED, KIND_STARTED, OUTCOME_CANCELLED, OUTCOME_OK, AuditRecord
from mcpserver import dispatch
from mcpserver.call import ToolCall
from mcpserver.executor.remote import RemoteExecutor
from mcpserver.registry import TOOLS, ToolSpec
from mcpserver.results import ToolResult
from tests.inprocess import InProcessServer, audit_records, new_token, text_of
from tests.test_dispatch_cancel import ACTOR, PRINCIPAL

pytestmark = [pytest.mark.inprocess, pytest.mark.anyio, pytest.mark.django_db(transaction=True)]

READS = sorted(name for name, spec in TOOLS.items() if spec.read_only)
OTHERS = sorted(name for name, spec in TOOLS.items() if not spec.read_only)


@pytest.fixture(autouse=True)
def _close_writer() -> Iterator[None]:
    yield
    log.close()


@sync_to_async
def records_now(call_id: str) -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(call_id=call_id).order_by("id"))


@contextlib.asynccontextmanager
async def database_refuses(condition: str) -> AsyncIterator[None]:
    """create_trigger for the block, from async code."""
    await sync_to_async(create_trigger)(condition)
    try:
        yield
    finally:
        await sync_to_async(drop_trigger)()


def create_trigger(condition: str) -> None:
    """A trigger that makes the database reject every audit record matching `condition` (SQL over NEW)."""
    table = AuditRecord._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(
                f"CREATE TRIGGER test_refuse BEFORE INSERT ON {table} WHEN {condition} "
                "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
            )
        else:
            cursor.execute(
                "CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$"
            )
            cursor.execute(
                f"CREATE TRIGGER test_refuse BEFORE INSERT ON {table} FOR EACH ROW WHEN ({condition}) "
                "EXECUTE FUNCTION test_refuse()"
            )


def drop_trigger() -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("DROP TRIGGER test_refuse")
        else:
            cursor.execute(f"DROP TRIGGER test_refuse ON {AuditRecord._meta.db_table}")
            cursor.execute("DROP FUNCTION test_refuse()")


# --- through the /mcp application ---------------------------------------------------------------------------------


async def test_a_read_runs_before_its_records_which_are_committed_together_before_its_result_leaves(
    mcp_app: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    content = f"read-{uuid.uuid4().hex}\n"
    (mcp_app.workspace / "notes.txt").write_text(content)
    executor = mcp_app.runtime.executor
    real_read = executor.read_file_or_image
    records_while_reading: list[int] = []

    async def read_and_note(*args: Any, **kwargs: Any) -> dict[str, Any]:
        records_while_reading.append(len(await audit_records(tool="file_read")))
        return await real_read(*args, **kwargs)

    monkeypatch.setattr(executor, "read_file_or_image", read_and_note)
    token = await new_token("reads")
    result = await mcp_app.call_tool(token, "file_read", {"path": "notes.txt"})
    assert not result["isError"] and text_of(result) == content
    assert records_while_reading == [0]  # nothing was written before the read
    started, finished = await audit_records(tool="file_read")
    assert (started.kind, finished.kind, finished.outcome) == (KIND_STARTED, KIND_FINISHED, OUTCOME_OK)
    assert finished.id == started.id + 1 and finished.started_id == started.id and finished.call_id == started.call_id
    assert (started.arguments or {}).get("path") == "notes.txt" and started.created_at <= finished.created_at
    assert finished.result_sha256 == hashlib.sha256(content.encode()).hexdigest()
    assert await sync_to_async(lambda: log.verify().ok)()


async def test_a_read_whose_records_the_database_refuses_withholds_its_result(mcp_app: InProcessServer) -> None:
    secret = f"secret-{uuid.uuid4().hex}"
    (mcp_app.workspace / "secret.txt").write_text(secret)
    token = await new_token("withheld")
    async with database_refuses("NEW.tool = 'file_read'"):
        result = await mcp_app.call_tool(token, "file_read", {"path": "secret.txt"})
    assert result["isError"]
    assert text_of(result) == dispatch.READ_UNRECORDED.format(tool="file_read")
    assert secret not in json.dumps(result)
    assert await audit_records(tool="file_read") == []
    # The database takes records again: so do reads.
    again = await mcp_app.call_tool(token, "file_read", {"path": "secret.txt"})
    assert text_of(again) == secret and len(await audit_records(tool="file_read")) == 2


async def test_a_write_whose_started_record_the_database_refuses_never_runs(mcp_app: InProcessServer) -> None:
    token = await new_token("refused")
    async with database_refuses(f"NEW.tool = 'file_write' AND NEW.kind = '{KIND_STARTED}'"):
        result = await mcp_app.call_tool(token, "file_write", {"path": "never.txt", "content": "x"})
    assert result["isError"] and text_of(result) == dispatch.AUDIT_UNAVAILABLE
    assert not (mcp_app.workspace / "never.txt").exists()
    assert await audit_records(tool="file_write") == []


async def test_with_reads_before_set_a_read_has_its_started_record_committed_before_it_runs(
    tmp_path: Path, transactional_db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.inprocess import serve_in_process

    async with serve_in_process(tmp_path / "workspace", AUDIT_READS_BEFORE=True) as server:
        (server.workspace / "notes.txt").write_text("before\n")
        executor = server.runtime.executor
        real_read = executor.read_file_or_image
        kinds_while_reading: list[list[str]] = []

        async def read_and_note(*args: Any, **kwargs: Any) -> dict[str, Any]:
            kinds_while_reading.append([record.kind for record in await audit_records(tool="file_read")])
            return await real_read(*args, **kwargs)

        monkeypatch.setattr(executor, "read_file_or_image", read_and_note)
        result = await server.call_tool(await new_token("before"), "file_read", {"path": "notes.txt"})
    assert text_of(result) == "before\n"
    assert kinds_while_reading == [[KIND_STARTED]]
    assert [record.kind for record in await audit_records(tool="file_read")] == [KIND_STARTED, KIND_FINISHED]


# --- every tool of the registry, through dispatch ------------------------------------------------------------------


def probing(spec: ToolSpec, seen: list[list[str]]) -> ToolSpec:
    """`spec` with a function that notes the kinds of its call's records committed when it runs."""

    async def probe(call: ToolCall, **arguments: Any) -> ToolResult:
        seen.append([record.kind for record in await records_now(call.call_id)])
        return ToolResult(text="probed", exit_code=0)

    return dataclasses.replace(spec, fn=probe)


def tool_call(name: str, tmp_path: Path) -> ToolCall:
    """The call a tool is given; the probe never uses its executor."""
    return ToolCall(name, PRINCIPAL, RemoteExecutor(str(tmp_path / "executor.sock"), str(tmp_path)), 65536)


@pytest.mark.parametrize("name", OTHERS)
async def test_a_tool_that_can_change_something_has_its_started_record_committed_before_it_runs(
    name: str, tmp_path: Path
) -> None:
    seen: list[list[str]] = []
    result = await dispatch.run_audited(probing(TOOLS[name], seen), tool_call(name, tmp_path), ACTOR, {})
    assert result.text == "probed"
    assert seen == [[KIND_STARTED]]


@pytest.mark.parametrize("name", READS)
async def test_a_read_only_tool_runs_before_any_record_and_leaves_both_after(name: str, tmp_path: Path) -> None:
    seen: list[list[str]] = []
    call = tool_call(name, tmp_path)
    result = await dispatch.run_audited(probing(TOOLS[name], seen), call, ACTOR, {})
    assert result.text == "probed"
    assert seen == [[]]
    assert [record.kind for record in await records_now(call.call_id)] == [KIND_STARTED, KIND_FINISHED]


async def test_a_read_cancelled_while_it_runs_leaves_both_records_marked_cancelled(tmp_path: Path) -> None:
    running = anyio.Event()

    async def slow_read(call: ToolCall, **arguments: Any) -> ToolResult:
        running.set()
        await anyio.sleep_forever()
        raise AssertionError("not reached")

    spec = dataclasses.replace(TOOLS["file_read"], fn=slow_read)
    call = tool_call("file_read", tmp_path)
    async with anyio.create_task_group() as group:
        group.start_soon(dispatch.run_audited, spec, call, ACTOR, {"path": "slow.txt"})
        await running.wait()
        group.cancel_scope.cancel()
    started, finished = await records_now(call.call_id)
    assert (started.kind, finished.kind, finished.outcome) == (KIND_STARTED, KIND_FINISHED, OUTCOME_CANCELLED)
    assert finished.started_id == started.id


def test_the_read_only_tools_are_the_ones_that_read() -> None:
    # A tool moved onto the after-path must be one that changes nothing: this list is reviewed when it changes.
    assert READS == [
        "file_glob",
        "file_grep",
        "file_list",
        "file_read",
        "git_diff",
        "git_log",
        "git_status",
        "terminal_list",
        "terminal_output",
        "workspace_info",
    ]
