"""The audit log's writer: where it commits a record, the records that wait share a transaction, a failure stays
with its caller.

The first tests give the writer a stand-in for the chain's append_all, to hold a batch or refuse one record, and
for the caller-thread appender, to see when the writer tries it; the last write through the real chain, on
whichever database the suite runs on.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence

import pytest
from django.db import IntegrityError, OperationalError

from audit import log
from audit.log import Actor, acall_finished, acall_started, aevent, event
from audit.log.writer import AuditWriter
from audit.models import KIND_FINISHED, KIND_STARTED, AuditRecord


class Appender:
    """Stands in for audit.log.append.append_all: notes each batch by event name, numbers the records, refuses on request."""

    def __init__(self, refuse: Callable[[Sequence[AuditRecord]], Exception | None] = lambda records: None) -> None:
        self.batches: list[list[str]] = []
        self.refuse = refuse
        self.hold = threading.Event()
        self.hold.set()
        self.holding = threading.Event()
        self._ids = itertools.count(1)

    def __call__(self, records: Sequence[AuditRecord]) -> None:
        self.holding.set()
        self.hold.wait(10)
        self.batches.append([record.event for record in records])
        refused = self.refuse(records)
        if refused is not None:
            raise refused
        for record in records:
            record.id = next(self._ids)


def named(name: str) -> Callable[[], AuditRecord]:
    return lambda: AuditRecord(kind="event", event=name)


async def held_then_queued(
    writer: AuditWriter, appender: Appender, names: list[str]
) -> list[AuditRecord | BaseException]:
    """Append "first" and hold its transaction until `names` are all queued behind it; what each append gave."""
    appender.hold.clear()
    first = asyncio.ensure_future(writer.awrite(named("first")))
    await asyncio.to_thread(appender.holding.wait, 10)
    rest = [asyncio.ensure_future(writer.awrite(named(name))) for name in names]
    await asyncio.sleep(0.05)  # every append has reached the queue
    appender.hold.set()
    return await asyncio.gather(first, *rest, return_exceptions=True)


def records(results: list[AuditRecord | BaseException]) -> list[AuditRecord]:
    """`results`, each of which must be a written record (no append failed)."""
    written = [result for result in results if isinstance(result, AuditRecord)]
    assert len(written) == len(results), results
    return written


@pytest.fixture
def appender() -> Appender:
    return Appender()


@pytest.fixture
def writer(appender: Appender) -> Iterator[AuditWriter]:
    writer = AuditWriter(append_all=appender, max_batch=8)
    yield writer
    writer.close()


def test_records_that_wait_are_written_together(writer: AuditWriter, appender: Appender) -> None:
    names = [f"r{number}" for number in range(11)]
    results = records(asyncio.run(held_then_queued(writer, appender, names)))
    assert [record.event for record in results] == ["first", *names]
    assert len({record.id for record in results}) == 12
    # The held transaction, then the queued records in order, at most max_batch a transaction.
    assert appender.batches == [["first"], names[:8], names[8:]]


def test_a_record_alone_is_written_at_once(writer: AuditWriter, appender: Appender) -> None:
    async def one_by_one() -> list[str]:
        return [(await writer.awrite(named(f"r{number}"))).event for number in range(3)]

    assert asyncio.run(one_by_one()) == ["r0", "r1", "r2"]
    assert appender.batches == [["r0"], ["r1"], ["r2"]]


def test_a_record_that_cannot_be_built_fails_only_its_caller(writer: AuditWriter, appender: Appender) -> None:
    def broken() -> AuditRecord:
        raise ValueError("cannot build this one")

    async def run() -> list[object]:
        appender.hold.clear()
        first = asyncio.ensure_future(writer.awrite(named("first")))
        await asyncio.to_thread(appender.holding.wait, 10)
        queued = [asyncio.ensure_future(writer.awrite(build)) for build in (named("a"), broken, named("b"))]
        await asyncio.sleep(0.05)
        appender.hold.set()
        return await asyncio.gather(first, *queued, return_exceptions=True)

    first, a, failed, b = asyncio.run(run())
    assert isinstance(failed, ValueError) and str(failed) == "cannot build this one"
    assert (a.event, b.event) == ("a", "b")  # type: ignore[attr-defined]  # gather() with exceptions gives objects
    assert appender.batches == [["first"], ["a", "b"]]


def test_a_record_the_database_refuses_fails_only_its_caller() -> None:
    refusing = Appender(lambda records: IntegrityError("refused") if any(r.event == "bad" for r in records) else None)
    writer = AuditWriter(append_all=refusing)
    try:
        results = asyncio.run(held_then_queued(writer, refusing, ["a", "bad", "b"]))
    finally:
        writer.close()
    first, a, bad, b = results
    assert isinstance(bad, IntegrityError)
    first, a, b = records([first, a, b])
    assert (first.event, a.event, b.event) == ("first", "a", "b")
    # The batch failed as a whole, then each of its records was written alone.
    assert refusing.batches == [["first"], ["a", "bad", "b"], ["a"], ["bad"], ["b"]]


def test_a_database_that_cannot_be_written_fails_the_batch_without_retrying_each_record() -> None:
    locked = Appender(lambda records: OperationalError("database is locked") if len(records) > 1 else None)
    writer = AuditWriter(append_all=locked)
    try:
        first, *rest = asyncio.run(held_then_queued(writer, locked, ["a", "b", "c"]))
    finally:
        writer.close()
    assert isinstance(first, AuditRecord) and first.event == "first"
    assert all(isinstance(result, OperationalError) for result in rest)
    assert locked.batches == [["first"], ["a", "b", "c"]]  # each record alone would wait for the lock again


def test_a_cancelled_caller_does_not_withdraw_its_record(writer: AuditWriter, appender: Appender) -> None:
    async def run() -> str:
        appender.hold.clear()
        waiting = asyncio.ensure_future(writer.awrite(named("cancelled")))
        await asyncio.to_thread(appender.holding.wait, 10)
        waiting.cancel()
        await asyncio.sleep(0)
        appender.hold.set()
        return (await writer.awrite(named("next"))).event

    assert asyncio.run(run()) == "next"
    assert appender.batches == [["cancelled"], ["next"]]


def test_close_writes_what_is_queued_and_a_later_append_starts_again(writer: AuditWriter, appender: Appender) -> None:
    async def queue_and_close() -> list[asyncio.Task[AuditRecord]]:
        appender.hold.clear()
        futures = [asyncio.ensure_future(writer.awrite(named(f"r{number}"))) for number in range(3)]
        await asyncio.to_thread(appender.holding.wait, 10)
        appender.hold.set()
        await asyncio.to_thread(writer.close)
        return futures

    futures = asyncio.run(queue_and_close())
    assert [event for batch in appender.batches for event in batch] == ["r0", "r1", "r2"]
    assert not [thread for thread in threading.enumerate() if thread.name == "audit-writer"]
    assert all(future.done() for future in futures)
    assert asyncio.run(writer.awrite(named("again"))).event == "again"


def test_callers_on_several_event_loops_each_get_their_own_records(writer: AuditWriter, appender: Appender) -> None:
    results: dict[int, list[str]] = {}

    def loop_in_thread(number: int) -> None:
        async def run() -> list[str]:
            records = await asyncio.gather(*(writer.awrite(named(f"{number}-{n}")) for n in range(20)))
            return [record.event for record in records]

        results[number] = asyncio.run(run())

    threads = [threading.Thread(target=loop_in_thread, args=(number,)) for number in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == {number: [f"{number}-{n}" for n in range(20)] for number in range(4)}


class CallerThreadStandIn:
    """Stands in for the caller-thread appender: notes each record it is offered, and takes it or not."""

    def __init__(self, *, takes: bool) -> None:
        self.offered: list[str] = []
        self.takes = takes

    def try_append(self, records: Sequence[AuditRecord]) -> bool:
        self.offered.extend(record.event for record in records)
        return self.takes

    def close(self) -> None:
        pass


def test_a_record_alone_is_committed_on_the_callers_thread_when_it_can_be(appender: Appender) -> None:
    caller_thread = CallerThreadStandIn(takes=True)
    writer = AuditWriter(append_all=appender, caller_thread=caller_thread)
    try:
        assert asyncio.run(writer.awrite(named("alone"))).event == "alone"
    finally:
        writer.close()
    assert caller_thread.offered == ["alone"] and appender.batches == []


def test_a_record_while_another_is_being_written_goes_to_the_batch_thread(appender: Appender) -> None:
    caller_thread = CallerThreadStandIn(takes=False)  # the first record cannot be committed at once
    writer = AuditWriter(append_all=appender, caller_thread=caller_thread)
    try:
        results = records(asyncio.run(held_then_queued(writer, appender, ["second", "third"])))
    finally:
        writer.close()
    assert [record.event for record in results] == ["first", "second", "third"]
    # Only the first was offered: the others came while a record was queued, and joined its batch thread.
    assert caller_thread.offered == ["first"]
    assert appender.batches == [["first"], ["second", "third"]]


def test_the_records_of_a_call_while_another_is_open_go_to_the_batch_thread(appender: Appender) -> None:
    caller_thread = CallerThreadStandIn(takes=True)
    writer = AuditWriter(append_all=appender, caller_thread=caller_thread)

    async def two_calls_overlapping() -> None:
        await writer.awrite(named("a started"), opens_call=True)
        await writer.awrite(named("b started"), opens_call=True)
        await writer.awrite(named("a finished"), closes_call=True)
        await writer.awrite(named("b finished"), closes_call=True)
        await writer.awrite(named("c started"), opens_call=True)

    try:
        asyncio.run(two_calls_overlapping())
    finally:
        writer.close()
    # Alone, a call's records are committed on the caller's thread; with another call open, they share commits.
    assert caller_thread.offered == ["a started", "b finished", "c started"]
    assert appender.batches == [["b started"], ["a finished"]]


def test_a_record_the_callers_thread_cannot_take_is_written_by_the_batch_thread(appender: Appender) -> None:
    caller_thread = CallerThreadStandIn(takes=False)
    writer = AuditWriter(append_all=appender, caller_thread=caller_thread)
    try:
        record = asyncio.run(writer.awrite(named("refused at once")))
    finally:
        writer.close()
    assert caller_thread.offered == ["refused at once"] and appender.batches == [["refused at once"]]
    assert record.id == 1


def test_the_configured_writer_writes_every_record_until_it_is_reset(appender: Appender) -> None:
    log.configure(AuditWriter(append_all=appender))
    try:
        event("sync")
        asyncio.run(aevent("async"))
    finally:
        log.reset()
    assert appender.batches == [["sync"], ["async"]]


# --- through the real chain -----------------------------------------------------------------------------------------


@pytest.fixture
def batch_sizes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """This process's writer, without the caller-thread path: the size of each batch its thread writes."""
    sizes: list[int] = []
    writer = AuditWriter()
    real_append = writer._append

    def counting(records: list[AuditRecord]) -> None:
        sizes.append(len(records))
        real_append(records)

    monkeypatch.setattr(writer, "_append", counting)
    log.configure(writer)
    yield sizes
    log.reset()  # its thread's database connection is closed with it; the next record builds one from the settings


@pytest.mark.django_db(transaction=True)
def test_concurrent_calls_keep_one_chain_with_sync_writers_beside_them(batch_sizes: list[int]) -> None:
    stop_sync = threading.Event()

    def sync_writer() -> None:  # the admin or a management command, writing in a thread of its own
        from django.db import connection

        try:
            while not stop_sync.is_set():
                event("sync.write")
        finally:
            connection.close()

    async def agent(number: int) -> None:
        actor = Actor(username=f"agent-{number}", credential_kind="bearer", credential_id=str(number))
        for call in range(5):
            started = await acall_started(actor, "terminal_exec", {"command": f"echo {call}"}, "test")
            await acall_finished(started, "ok", result_text=str(call), exit_code=0, duration_ms=1)
        await aevent("agent.done", actor, agent=number)

    async def all_agents() -> None:
        await asyncio.gather(*(agent(number) for number in range(30)))

    beside = threading.Thread(target=sync_writer)
    beside.start()
    try:
        asyncio.run(all_agents())
    finally:
        stop_sync.set()
        beside.join(30)

    assert AuditRecord.objects.filter(kind=KIND_STARTED).count() == 150
    finished = AuditRecord.objects.filter(kind=KIND_FINISHED)
    assert finished.count() == 150
    started_ids = set(AuditRecord.objects.filter(kind=KIND_STARTED).values_list("id", flat=True))
    assert {record.started_id for record in finished} == started_ids
    assert all(record.username.startswith("agent-") for record in finished)
    assert AuditRecord.objects.filter(event="agent.done").count() == 30
    result = log.verify()
    assert result.ok, result
    assert sum(batch_sizes) == 330 and max(batch_sizes) > 1  # thirty agents at once: records shared transactions


def test_a_forked_child_starts_a_writer_thread_of_its_own(writer: AuditWriter, appender: Appender) -> None:
    import multiprocessing

    asyncio.run(writer.awrite(named("in the parent")))  # the parent's thread is running
    context = multiprocessing.get_context("fork")
    results = context.Queue()

    def child() -> None:
        record = asyncio.run(asyncio.wait_for(writer.awrite(named("in the child")), 10))
        results.put(record.event)
        writer.close()

    process = context.Process(target=child)
    process.start()
    process.join(30)
    assert process.exitcode == 0
    assert results.get(timeout=5) == "in the child"
