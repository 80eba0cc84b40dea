"""A finished record the database refuses is never dropped: held in memory and in the spill file, written again
until the database takes it, replayed by the next start, with /health at 503 meanwhile and one log line, not a
traceback per call. The refusals are real: a trigger in the test database, a full tmpfs for the spill file."""

from __future__ import annotations

import errno
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from asgiref.sync import sync_to_async
from django.db import OperationalError

from audit import log
from audit.instances import recover_interrupted
from audit.log import Actor, call_started, finished_record
from audit.log import held as held_module
from audit.log.held import SPILL_NAME, HeldRecords, replay_spill
from audit.models import KIND_FINISHED, OUTCOME_OK, AuditRecord
from tests.inprocess import InProcessServer, audit_records, new_token, text_of
from tests.small_disk import fill, small_tmpfs
from tests.test_audit_reads import create_trigger, database_refuses, drop_trigger

pytestmark = [pytest.mark.inprocess, pytest.mark.anyio, pytest.mark.django_db(transaction=True)]
DEADLINE = 30.0
ACTOR = Actor(username="agent", credential_kind="bearer", credential_id="1")


@pytest.fixture(autouse=True)
def _fresh_held() -> Iterator[None]:
    held_module.reset()
    yield
    held_module.reset()
    log.close()


async def health(server: InProcessServer) -> tuple[int, dict[str, object]]:
    """/health's view, for the services of the application `server` runs in this process."""
    from django.test import AsyncRequestFactory

    from mcpserver.health import health as health_view

    response = await health_view(AsyncRequestFactory().get("/health"))
    return response.status_code, json.loads(response.content)


async def finished_of(started: AuditRecord) -> list[AuditRecord]:
    return await audit_records(kind=KIND_FINISHED, started_id=started.id)


@pytest.fixture
async def app_with_state(tmp_path: Path, transactional_db: None) -> AsyncIterator[InProcessServer]:
    from tests.inprocess import serve_in_process

    state = tmp_path / "state"
    state.mkdir()
    async with serve_in_process(tmp_path / "workspace", STATE_DIR=state) as server:
        yield server


async def test_a_refused_finished_record_is_held_then_written_and_health_says_so_meanwhile(
    app_with_state: InProcessServer, caplog: pytest.LogCaptureFixture
) -> None:
    from django.conf import settings as django_settings

    server = app_with_state
    state = Path(django_settings.STATE_DIR)
    token = await new_token("held")
    marker = uuid.uuid4().hex
    caplog.set_level(logging.ERROR, logger="audit.log.held")
    async with database_refuses(f"NEW.kind = '{KIND_FINISHED}' AND NEW.tool = 'terminal_exec'"):
        results = [
            await server.call_tool(token, "terminal_exec", {"command": f"echo {marker}-{number}"})
            for number in range(3)
        ]
        assert [text_of(result) for result in results] == [
            f"stdout:\n{marker}-{number}\n\nexit_code: 0" for number in range(3)
        ]
        status, body = await health(server)
        assert status == 503
        assert body["audit_records_held"] == {
            "count": 3,
            "error": "3 finished audit record(s) wait to be written: refused by the test",
        }
        spilled = [json.loads(line) for line in (state / SPILL_NAME).read_text().splitlines()]
        assert [line["outcome"] for line in spilled] == [OUTCOME_OK] * 3
        assert {line["held_because"] for line in spilled} == {"refused by the test"}
        assert await audit_records(kind=KIND_FINISHED, tool="terminal_exec") == []
    # The database takes records again: the held ones are written, in order, by the retries.
    with anyio.fail_after(DEADLINE):
        while await audit_records(kind=KIND_FINISHED, tool="terminal_exec") == []:
            await anyio.sleep(0.1)
    started = await audit_records(kind="call.started", tool="terminal_exec")
    finished = await audit_records(kind=KIND_FINISHED, tool="terminal_exec")
    assert [record.started_id for record in finished] == [record.id for record in started]
    assert [record.outcome for record in finished] == [OUTCOME_OK] * 3
    assert all(record.result_sha256 for record in finished)
    assert not (state / SPILL_NAME).exists()
    (held_event,) = await audit_records(event="audit.records_held")
    assert held_event.id == finished[-1].id + 1 and held_event.detail is not None
    assert (held_event.detail["count"], held_event.detail["reason"]) == (3, "refused by the test")
    assert held_event.detail["replayed"] is False
    assert (await health(server))[0] == 200
    assert await sync_to_async(lambda: log.verify().ok)()
    held_lines = [record for record in caplog.records if record.name == "audit.log.held"]
    assert len(held_lines) == 1 and "refused by the test" in held_lines[0].getMessage()
    assert held_lines[0].exc_info is None


def test_the_next_start_writes_what_the_spill_file_holds_and_those_calls_are_not_interrupted(
    tmp_path: Path, transactional_db: None
) -> None:
    started = call_started(ACTOR, "terminal_exec", {"command": "echo spilled"}, "gone-instance")
    record = finished_record(started, OUTCOME_OK, result_text="spilled\n", exit_code=0, duration_ms=5)
    # A process that held it, spilled it and was then killed.
    keeper = HeldRecords(tmp_path)
    keeper._spill_one(record, "database is locked")  # noqa: SLF001 - what hold() does first, without a loop
    with (tmp_path / SPILL_NAME).open("a") as spill:
        spill.write('{"kind": "call.fini')  # a line cut short by the kill
    assert replay_spill(tmp_path) == 1
    assert recover_interrupted("this-instance") == 0
    (finished,) = AuditRecord.objects.filter(kind=KIND_FINISHED, started_id=started.id)
    assert (finished.outcome, finished.exit_code, finished.call_id) == (OUTCOME_OK, 0, started.call_id)
    assert not (tmp_path / SPILL_NAME).exists()
    (held_event,) = AuditRecord.objects.filter(event="audit.records_held")
    assert held_event.id == finished.id + 1 and held_event.detail is not None
    assert held_event.detail["count"] == 1 and held_event.detail["replayed"] is True
    assert held_event.detail["reason"] == "database is locked"
    assert log.verify().ok
    # Replayed twice (a second start before the file was removed) writes nothing twice.
    keeper._spill_one(record, "database is locked")  # noqa: SLF001
    assert replay_spill(tmp_path) == 0


def test_each_worker_replays_its_own_spill_file_and_worker_1_those_of_workers_no_longer_run(
    tmp_path: Path, transactional_db: None
) -> None:
    def spilled_by(worker: int) -> AuditRecord:
        started = call_started(ACTOR, "terminal_exec", {"command": f"echo {worker}"}, f"worker-{worker}")
        HeldRecords(tmp_path, worker)._spill_one(finished_record(started, OUTCOME_OK), "locked")  # noqa: SLF001
        return started

    first, second, third = spilled_by(1), spilled_by(2), spilled_by(3)
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        SPILL_NAME,
        "audit_spill.worker-2.jsonl",
        "audit_spill.worker-3.jsonl",
    ]
    assert replay_spill(tmp_path, worker=2, workers=3) == 1  # its own alone
    assert replay_spill(tmp_path, worker=1, workers=2) == 2  # its own, and worker 3's: there is no worker 3 now
    assert sorted(path.name for path in tmp_path.iterdir()) == []
    for started in (first, second, third):
        assert AuditRecord.objects.filter(kind=KIND_FINISHED, started_id=started.id).count() == 1


async def test_refused_starts_log_one_line_with_a_count_not_a_traceback_each(
    mcp_app: InProcessServer, caplog: pytest.LogCaptureFixture
) -> None:
    token = await new_token("refused-starts")
    caplog.set_level(logging.ERROR)
    async with database_refuses("NEW.tool = 'terminal_exec'"):
        for number in range(20):
            result = await mcp_app.call_tool(token, "terminal_exec", {"command": f"echo {number}"})
            assert result["isError"]
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert len(errors) == 1, [record.getMessage() for record in errors]
    assert errors[0].exc_info is None and "refused by the test" in errors[0].getMessage()


@pytest.fixture
def full_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, for a disk that fills up."""
    with small_tmpfs(tmp_path / "small", "1m") as mount:
        yield mount


def test_a_full_disk_gives_the_spill_file_the_room_its_ballast_kept(full_tmpfs: Path, transactional_db: None) -> None:
    keeper = HeldRecords(full_tmpfs, ballast_bytes=128 * 1024)
    keeper.prepare()
    assert (full_tmpfs / "audit_spill.ballast").stat().st_size == 128 * 1024
    fill(full_tmpfs)
    started = call_started(ACTOR, "file_write", {"path": "x", "content": "y"}, "instance")
    record = finished_record(started, OUTCOME_OK, result_text="Written 1 bytes", duration_ms=1)
    keeper.hold(record, OSError(errno.ENOSPC, "database or disk is full"))
    assert not (full_tmpfs / "audit_spill.ballast").exists()
    assert json.loads((full_tmpfs / SPILL_NAME).read_text())["call_id"] == started.call_id
    assert keeper.count == 1 and keeper.problem() == "1 finished audit record(s) wait to be written: " + (
        "[Errno 28] database or disk is full"
    )
    # At shut-down the database takes it: nothing is left to replay.
    keeper.stop()
    assert keeper.count == 0 and not (full_tmpfs / SPILL_NAME).exists()
    assert AuditRecord.objects.filter(kind=KIND_FINISHED, started_id=started.id).count() == 1


def test_a_record_neither_the_database_nor_a_full_disk_takes_is_logged_as_lost_with_the_reason(
    full_tmpfs: Path, transactional_db: None, caplog: pytest.LogCaptureFixture
) -> None:
    # Nothing can be written on the state dir's disk any more (no ballast left), and the database refuses the
    # record until the end: the loss goes to the server log, with the call and the database's own error.
    keeper = HeldRecords(full_tmpfs)
    fill(full_tmpfs)
    started = call_started(ACTOR, "file_write", {"path": "x", "content": "y"}, "instance")
    record = finished_record(started, OUTCOME_OK, result_text="Written 1 bytes", duration_ms=1)
    caplog.set_level(logging.ERROR, logger="audit.log.held")
    create_trigger(f"NEW.kind = '{KIND_FINISHED}'")
    try:
        keeper.hold(record, OperationalError("database or disk is full"))
        assert keeper.count == 1 and not (full_tmpfs / SPILL_NAME).read_text()
        keeper.stop()
    finally:
        drop_trigger()
    lost = [line.getMessage() for line in caplog.records if "LOST" in line.getMessage()]
    assert len(lost) == 1, [line.getMessage() for line in caplog.records]
    assert started.call_id in lost[0] and "refused by the test" in lost[0]
    assert not AuditRecord.objects.filter(kind=KIND_FINISHED, started_id=started.id).exists()
