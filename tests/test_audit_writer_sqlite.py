"""The writer on SQLite commits a record on the caller's thread when nothing has to wait: the same rows its batch
thread would write, and any other case left to that thread, which waits and reports failures as before."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import DatabaseError, connection
from django.utils import timezone

from audit import log
from audit.log import Actor, finished_record, started_record
from audit.log.append import _INSERTED, append_all, db_values, make_storable
from audit.log.caller_thread import CallerThreadAppender
from audit.log.writer import AuditWriter
from audit.models import AuditRecord, ChainHead
from tests.database import requires_sqlite

pytestmark = [requires_sqlite, pytest.mark.django_db(transaction=True)]

ACTOR = Actor(
    user_id=1, username="agent", credential_kind="bearer", credential_id="7", credential_name="laptop", scope="mcp"
)


class CountingAppender:
    """The batch thread's path (append_all, for real), counting the records that took it."""

    def __init__(self) -> None:
        self.records: list[AuditRecord] = []

    def __call__(self, records: Sequence[AuditRecord]) -> None:
        self.records.extend(records)
        append_all(records)


@pytest.fixture
def turn() -> threading.Lock:
    return threading.Lock()


@pytest.fixture
def caller_thread(turn: threading.Lock) -> Iterator[CallerThreadAppender]:
    appender = CallerThreadAppender(turn, checkpoint_every=8)
    yield appender
    appender.close()


@pytest.fixture
def through_writer() -> CountingAppender:
    return CountingAppender()


@pytest.fixture
def writer(
    turn: threading.Lock, caller_thread: CallerThreadAppender, through_writer: CountingAppender
) -> Iterator[AuditWriter]:
    writer = AuditWriter(append_all=through_writer, caller_thread=caller_thread, turn=turn)
    yield writer
    writer.close()
    connection.close()


def database_path() -> Path:
    return Path(connection.settings_dict["NAME"])


async def one_call(writer: AuditWriter, command: str) -> tuple[AuditRecord, AuditRecord]:
    started = await writer.awrite(lambda: started_record(ACTOR, "terminal_exec", {"command": command}, "test"))
    finished = await writer.awrite(
        lambda: finished_record(started, "ok", result_text="done", exit_code=0, duration_ms=3)
    )
    return started, finished


def test_a_lone_calls_records_are_committed_on_the_callers_thread(
    writer: AuditWriter, through_writer: CountingAppender
) -> None:
    started, finished = asyncio.run(one_call(writer, "echo one"))
    assert through_writer.records == []
    stored = AuditRecord.objects.get(pk=finished.pk)
    assert (stored.started_id, stored.outcome, stored.mac) == (started.pk, "ok", finished.mac)
    assert AuditRecord.objects.get(pk=started.pk).arguments == {"command": "echo one"}
    assert log.verify().ok


def test_a_row_committed_on_the_callers_thread_is_the_row_the_batch_thread_writes(
    writer: AuditWriter, caller_thread: CallerThreadAppender
) -> None:
    when = timezone.now() - timedelta(seconds=5)
    arguments = {"command": "printf 'a\\0b'", "n": 1.5, "big": 1e20, "nested": {"k\x00": [None, True, -0.0]}}

    def record() -> AuditRecord:
        built = started_record(ACTOR, "terminal_exec", arguments, "test")
        built.created_at, built.call_id, built.detail = when, "c" * 32, {"large_arguments": False}
        return built

    inline_record, writer_record = record(), record()
    assert caller_thread.try_append([inline_record])
    append_all([writer_record])
    columns = [field.column for field in _INSERTED if field.column not in ("prev_mac", "mac")]
    with sqlite3.connect(database_path()) as raw:
        rows = [
            raw.execute(f"SELECT {', '.join(columns)} FROM audit_auditrecord WHERE id = ?", [pk]).fetchone()
            for pk in (inline_record.pk, writer_record.pk)
        ]
    assert rows[0] == rows[1]
    assert log.verify().ok


def test_text_values_skip_only_a_conversion_that_would_not_change_them() -> None:
    record = finished_record(
        started_record(ACTOR, "file_read", {"path": "a"}, "test"), "error", result_text="x\x00y", exit_code=3
    )
    record.credential_id = 7  # not a str: converted as the field would
    make_storable(record)
    assert db_values(record, connection) == [
        field.get_db_prep_save(field.pre_save(record, True), connection) for field in _INSERTED
    ]


def test_a_write_lock_held_elsewhere_never_blocks_the_event_loop(
    writer: AuditWriter, through_writer: CountingAppender
) -> None:
    other = sqlite3.connect(database_path(), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process writing, e.g. a management command

    async def call_beside_a_ticker() -> tuple[int, float]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticking = asyncio.ensure_future(ticker())
        asyncio.get_running_loop().call_later(0.5, other.execute, "COMMIT")
        began = time.monotonic()
        await one_call(writer, "echo locked")
        ticking.cancel()
        return ticks, time.monotonic() - began

    try:
        ticks, waited = asyncio.run(call_beside_a_ticker())
    finally:
        other.close()
    assert waited >= 0.4  # the record waited for the lock...
    assert ticks >= 20  # ...on the writer's thread, while the event loop went on
    assert len(through_writer.records) >= 1 and log.verify().ok


def test_a_busy_write_turn_leaves_the_record_to_the_writer(
    writer: AuditWriter, turn: threading.Lock, through_writer: CountingAppender
) -> None:
    turn.acquire()  # this process's writer, or a synchronous writer, is writing
    threading.Timer(0.2, turn.release).start()
    started, finished = asyncio.run(one_call(writer, "echo busy"))
    assert through_writer.records[:1] == [started]
    assert AuditRecord.objects.filter(pk__in=[started.pk, finished.pk]).count() == 2


def test_a_record_the_database_refuses_fails_its_caller_and_changes_nothing(
    writer: AuditWriter, through_writer: CountingAppender
) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TRIGGER refuse_boom BEFORE INSERT ON audit_auditrecord WHEN NEW.tool = 'boom' "
            "BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END"
        )
    head = log.chain_head()
    try:
        with pytest.raises(DatabaseError):
            asyncio.run(writer.awrite(lambda: started_record(ACTOR, "boom", {}, "test")))
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER refuse_boom")
    assert [record.tool for record in through_writer.records] == [
        "boom"
    ]  # tried on this thread, then by the batch thread
    assert log.chain_head() == head and not AuditRecord.objects.filter(tool="boom").exists()
    asyncio.run(one_call(writer, "echo after"))  # the caller-thread connection is still usable
    assert log.verify().ok


def test_an_empty_chain_is_started_on_the_callers_thread(writer: AuditWriter, through_writer: CountingAppender) -> None:
    assert not ChainHead.objects.exists()
    started, finished = asyncio.run(one_call(writer, "echo first"))
    assert through_writer.records == []
    assert started.prev_mac == log.GENESIS_MAC and ChainHead.objects.get().last_record_id == finished.pk
    assert log.verify().ok


def test_the_wal_is_checkpointed_though_only_the_callers_thread_commits(
    writer: AuditWriter, caller_thread: CallerThreadAppender
) -> None:
    wal = Path(f"{database_path()}-wal")

    async def calls(count: int) -> None:
        for number in range(count):
            await one_call(writer, f"echo {number}")
            # A checkpoint thread started by this call has finished before the next (a loaded machine may run it late).
            deadline = time.monotonic() + 30
            while caller_thread._checkpointing and time.monotonic() < deadline:
                await asyncio.sleep(0.001)

    asyncio.run(calls(20))
    with sqlite3.connect(database_path()) as raw:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # start from an empty WAL
    asyncio.run(calls(150))  # 300 records: about 4,000 pages if nothing checkpointed
    assert wal.stat().st_size < 2_000_000, wal.stat().st_size
    assert log.verify().ok


def test_the_writer_configured_from_the_settings_commits_on_the_callers_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    offered: list[str] = []
    real_try_append = CallerThreadAppender.try_append

    def noting(self: CallerThreadAppender, records: Sequence[AuditRecord]) -> bool:
        offered.extend(record.event for record in records)
        return real_try_append(self, records)

    monkeypatch.setattr(CallerThreadAppender, "try_append", noting)
    log.configure()
    try:
        asyncio.run(log.aevent("configured"))
    finally:
        log.reset()
    assert offered == ["configured"] and AuditRecord.objects.filter(event="configured").exists()
