"""The one writer of the audit log: every record is appended through an AuditWriter.

`write(record)` is for synchronous callers (views, management commands): the record is committed on the caller's
thread and Django connection, inside the caller's transaction if there is one. `awrite(build)` is for coroutines:
the writer decides where the record is committed. A record that has nothing to share a commit with (no other tool
call is open in this process, nothing is queued for the batch thread) is committed on the caller's own thread if,
on SQLite, the write can start at once (audit.log.caller_thread). Otherwise the batch thread writes it: it takes
every record that waits (up to MAX_BATCH) and appends them in one transaction, one commit and one wake-up of each
waiting event loop per batch, which is what many concurrent calls need.

On the batch thread a record is built there as well (hashing a large argument or result is not the event loop's
work), by a function the caller passes. A batch that fails is written again record by record, so a record that
cannot be written fails only its own caller. A caller that is cancelled while it waits does not withdraw its record.

The writer is built from the settings when the audit app is ready (`configure()`), not at import, so a test can
build one for another configuration; `close()` writes what is queued and ends the batch thread.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, OperationalError, connection, connections
from django.dispatch import receiver

from audit.log.append import append_all
from audit.log.caller_thread import CallerThreadAppender
from audit.models import AuditRecord

logger = logging.getLogger(__name__)
MAX_BATCH = 128
Appender = Callable[[Sequence[AuditRecord]], object]


@dataclass(eq=False)
class _Job:
    build: Callable[[], Sequence[AuditRecord]]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Sequence[AuditRecord]] = field(repr=False)
    records: Sequence[AuditRecord] = field(init=False, repr=False)
    error: BaseException | None = None


class CallerThread(Protocol):
    """Commits records on the calling thread if that needs no waiting (audit.log.caller_thread)."""

    def try_append(self, records: Sequence[AuditRecord]) -> bool: ...

    def close(self) -> None: ...


_STOP = None  # put on the queue by close(): the thread finishes what is before it, then ends


class AuditWriter:
    """Appends records to the chain; its batch thread is started on first use, and again after close()."""

    def __init__(
        self,
        *,
        append_all: Appender = append_all,
        caller_thread: CallerThread | None = None,
        turn: threading.Lock | None = None,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self._append_all = append_all
        self._caller_thread = caller_thread
        # This process's writers take turns here before they ask the database for its write lock. SQLite's busy
        # handler waits for a lock by sleeping between tries, so writers that race for it leave the database idle
        # between them; a Python lock hands over at once. (Other processes still wait the SQLite way.)
        self._turn = turn or threading.Lock()
        self._max_batch = max_batch
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lifecycle = threading.Lock()
        self._queued = 0  # records handed to the batch thread and not yet written
        self._open_calls = 0  # tool calls whose started record was written and whose finished record was not yet
        # A forked child has none of the parent's threads: its first append must start a thread of its own.
        os.register_at_fork(after_in_child=self._forget_thread)

    @property
    def turn(self) -> threading.Lock:
        return self._turn

    def write(self, record: AuditRecord) -> AuditRecord:
        """Commit `record` on this thread's Django connection, in the caller's transaction if it is in one."""
        self.write_all([record])
        return record

    def write_all(self, records: Sequence[AuditRecord]) -> Sequence[AuditRecord]:
        """`write` for several records, in order, in one transaction."""
        if connection.in_atomic_block:
            # Inside a transaction that may already hold the database's write lock: waiting for a turn here could
            # deadlock with a writer that holds the turn and waits for that lock.
            self._append_all(records)
        else:
            with self._turn:
                self._append_all(records)
        return records

    async def awrite(
        self, build: Callable[[], AuditRecord], *, opens_call: bool = False, closes_call: bool = False
    ) -> AuditRecord:
        """Append the record `build()` makes, once it is committed; raises what building or writing it raised.

        `opens_call`, `closes_call`: the record is a tool call's started or finished record (the writer counts the
        calls that are open).
        """
        if closes_call:
            self._open_calls = max(0, self._open_calls - 1)
        (record,) = await self._awrite(functools.partial(_one, build))
        if opens_call:
            self._open_calls += 1
        return record

    async def awrite_together(self, build: Callable[[], Sequence[AuditRecord]]) -> Sequence[AuditRecord]:
        """Append the records `build()` makes, in order, in one transaction, once they are committed (a read's
        started and finished records: a finished record without its started record's id follows it)."""
        return await self._awrite(build)

    async def _awrite(self, build: Callable[[], Sequence[AuditRecord]]) -> Sequence[AuditRecord]:
        if self._caller_thread is not None and self._queued == 0 and self._open_calls == 0:
            # No other call is open and nothing waits for the batch thread: nothing to share a commit with.
            records = build()
            if self._caller_thread.try_append(records):
                return records
            build = functools.partial(_same, records)
        loop = asyncio.get_running_loop()
        job = _Job(build, loop, loop.create_future())
        with self._lifecycle:
            if self._thread is None:
                # Each thread has a queue of its own, so one that is closing never takes a newer thread's jobs.
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(target=self._run, args=(self._jobs,), name="audit-writer", daemon=True)
                self._thread.start()
            self._queued += 1
            self._jobs.put(job)
        return await job.future

    def _forget_thread(self) -> None:
        self._thread = None
        self._queued = 0
        self._open_calls = 0
        self._lifecycle = threading.Lock()

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued and end the batch thread (a later append starts a new one)."""
        with self._lifecycle:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._jobs.put(_STOP)
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                logger.error("audit writer: records were still being written after %.0f s at shut-down", timeout)
        if self._caller_thread is not None:
            self._caller_thread.close()

    def _run(self, jobs: queue.SimpleQueue[_Job | None]) -> None:
        try:
            stopping = False
            while not stopping:
                batch, stopping = self._take(jobs)
                if batch:
                    self._write(batch)
                    with self._lifecycle:
                        self._queued -= len(batch)
                    _deliver(batch)
        finally:
            connection.close()  # this thread's own connection

    def _take(self, jobs: queue.SimpleQueue[_Job | None]) -> tuple[list[_Job], bool]:
        """The next batch, waiting for its first job, and whether close() asked the thread to end after it."""
        batch: list[_Job] = []
        job = jobs.get()
        while job is not _STOP:
            batch.append(job)
            if len(batch) == self._max_batch:
                return batch, False
            try:
                job = jobs.get_nowait()
            except queue.Empty:
                return batch, False
        return batch, True

    def _write(self, batch: list[_Job]) -> None:
        ready = [job for job in batch if _build(job)]
        if not ready:
            return
        try:
            self._append([record for job in ready for record in job.records])
            return
        except Exception as error:  # noqa: BLE001 - handed to the callers, as their own thread would have raised it
            if len(ready) == 1 or isinstance(error, OperationalError):
                # One record, or a database that cannot be written now (locked, gone): the same for every record.
                for job in ready:
                    job.error = error
                return
        for job in ready:  # a record the database refused: each alone, so only that record's caller fails
            try:
                self._append(list(job.records))
            except Exception as error:  # noqa: BLE001 - as above
                job.error = error

    def _append(self, records: list[AuditRecord]) -> None:
        with self._turn:
            self._append_all(records)


def _same(records: Sequence[AuditRecord]) -> Sequence[AuditRecord]:
    return records


def _one(build: Callable[[], AuditRecord]) -> Sequence[AuditRecord]:
    return (build(),)


def _build(job: _Job) -> bool:
    try:
        job.records = job.build()
    except Exception as error:  # noqa: BLE001 - the caller's own failure, raised in the caller
        job.error = error
        return False
    return True


def _deliver(batch: list[_Job]) -> None:
    """Wake each waiting event loop once for all of its jobs in the batch."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Job]] = {}
    for job in batch:
        by_loop.setdefault(job.loop, []).append(job)
    for loop, jobs in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, jobs)
        except RuntimeError:
            pass  # that loop is closed: nobody waits for these records any more (they are written)


def _settle(jobs: list[_Job]) -> None:
    for job in jobs:
        if job.future.done():  # its caller was cancelled
            continue
        if job.error is not None:
            job.future.set_exception(job.error)
        else:
            job.future.set_result(job.records)


# --- the writer of this process, built from the settings ----------------------------------------------------------

_current: AuditWriter | None = None
_configuring = threading.Lock()


def for_database(alias: str = DEFAULT_DB_ALIAS) -> AuditWriter:
    """A writer for the database `alias` names: on SQLite, one that may commit on the caller's thread."""
    turn = threading.Lock()
    caller_thread = CallerThreadAppender(turn, alias) if connections[alias].vendor == "sqlite" else None
    return AuditWriter(caller_thread=caller_thread, turn=turn)


def configure(writer: AuditWriter | None = None) -> AuditWriter:
    """Make `writer` (by default one built from the settings) this process's writer; the one before is closed."""
    global _current
    with _configuring:
        previous, _current = _current, writer or for_database()
        current = _current
    if previous is not None and previous is not current:
        previous.close()
    return current


def current() -> AuditWriter:
    """This process's writer; built from the settings if none is configured (after reset(), say)."""
    global _current
    writer = _current
    if writer is not None:
        return writer
    with _configuring:
        if _current is None:
            _current = for_database()
        return _current


def close() -> None:
    """Write what is queued and end the batch thread of this process's writer (a later record starts it again)."""
    if _current is not None:
        _current.close()


def reset() -> None:
    """Close this process's writer and forget it: the next record builds one from the settings as they are then."""
    global _current
    with _configuring:
        previous, _current = _current, None
    if previous is not None:
        previous.close()


@receiver(setting_changed)
def _databases_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "DATABASES":
        reset()


atexit.register(close)
