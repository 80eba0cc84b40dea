"""The audit log as the in-process /mcp application writes it: a rate-limited call recorded as denied, fail-closed
when the started record cannot be written, a flood of bad tokens recorded once and then as a count."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from tests.inprocess import (
    InProcessServer,
    audit_records,
    new_token,
    records_of_call,
    serve_in_process,
    stateless_headers,
    text_of,
)

pytestmark = [pytest.mark.inprocess, pytest.mark.anyio, pytest.mark.django_db(transaction=True)]

REFUSE_STARTED_RECORDS = {
    "sqlite": (
        [
            "CREATE TRIGGER refuse_audit BEFORE INSERT ON audit_auditrecord "
            "WHEN NEW.kind = 'call.started' BEGIN SELECT RAISE(ABORT, 'audit disk full'); END"
        ],
        ["DROP TRIGGER refuse_audit"],
    ),
    "postgresql": (
        [
            "CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.kind = 'call.started' THEN RAISE EXCEPTION 'audit disk full'; END IF; RETURN NEW; END $$",
            "CREATE TRIGGER refuse_audit BEFORE INSERT ON audit_auditrecord FOR EACH ROW EXECUTE FUNCTION refuse_audit()",
        ],
        ["DROP TRIGGER refuse_audit ON audit_auditrecord", "DROP FUNCTION refuse_audit()"],
    ),
}


@sync_to_async
def execute(statements: list[str]) -> None:
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


@pytest.fixture
async def started_records_refused(transactional_db: None, anyio_backend: str) -> AsyncIterator[None]:
    """The database refuses every started record while the test runs (the trigger outlives the test's rows)."""
    create, drop = REFUSE_STARTED_RECORDS[connection.vendor]
    await execute(create)
    yield
    await execute(drop)


async def test_a_tool_call_refused_by_the_rate_limit_is_recorded_as_denied(tmp_path: Path) -> None:
    token = await new_token("limited")
    markers = [uuid.uuid4().hex, uuid.uuid4().hex]
    async with serve_in_process(tmp_path / "workspace", RATE_LIMIT_PER_MINUTE=1) as server:
        statuses = []
        for marker in markers:
            call = server.tools_call("terminal_exec", {"command": f"echo {marker}"})
            statuses.append(
                (await server.post(token, call, **stateless_headers("tools/call", "terminal_exec"))).status_code
            )
    assert statuses == [200, 429]
    assert (await records_of_call(markers[0]))[-1].outcome == "ok"
    started, finished = await records_of_call(markers[1])
    assert (started.credential_kind, started.credential_name) == ("bearer", "limited")
    assert finished.outcome == "denied" and finished.reason == "Error: rate limit exceeded"


async def test_when_the_started_record_cannot_be_written_the_tool_does_not_run(
    mcp_app: InProcessServer, started_records_refused: None
) -> None:
    token = await new_token("fail-closed")
    marker = mcp_app.workspace / "should-not-exist"
    result = await mcp_app.call_tool(token, "terminal_exec", {"command": f"touch {marker}"})
    assert result["isError"]
    assert (
        text_of(result)
        == "Error: the audit log could not be written, so the call was not run; the server log has the details"
    )
    assert not marker.exists()


async def test_a_flood_of_bad_tokens_is_recorded_once_then_as_a_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with serve_in_process(tmp_path / "workspace") as server:
        for attempt in range(5):
            assert (await server.post(f"sst_bogus_{attempt}_xxxxxxxxxxxxxxxx", {})).status_code == 401
        assert len(await audit_records(event="auth.failed")) == 1
    rows = await audit_records(event="auth.failed")
    assert len(rows) == 2 and rows[1].client_address == "127.0.0.1"
    assert rows[1].detail is not None and rows[1].detail["count"] == 4
    assert "sst_bogus" not in str([(row.detail, row.reason, row.client_address) for row in rows])
    assert "audit chain head: record" in caplog.text
