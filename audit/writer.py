"""Group commit for the audit log's async writers: one thread appends every waiting record in one transaction.

A tool call writes two records. Sent to the default thread pool, each record took a pool thread, that thread's own
database connection and a transaction of its own; under fifty concurrent agents those threads queued for the
chain's write lock and for the GIL, and the audit cost more CPU than the rest of the call. Here one thread owns one
connection, takes the records that are waiting (up to MAX_BATCH) and appends them to the chain in one transaction:
one commit, and one wake-up of each waiting event loop, per batch. Alone, a record is written as soon as it comes.

A record is built on this thread as well (hashing a large argument or result is not the event loop's work), by a
function the caller passes. A batch that fails is written again record by record, so a record that cannot be
written fails only its own caller. A caller that is cancelled while it waits does not withdraw its record.

The record of a lone call (the only tool call running in this process) has nothing to share a commit with: with an
inline appender (audit.inline, SQLite), it is built and committed on the caller's thread when that needs no
waiting, and comes here only otherwise.
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

from django.db import OperationalError, connection

from audit.inline import InlineAppender
from audit.models import AuditRecord

logger = logging.getLogger(__name__)
MAX_BATCH = 128
Appender = Callable[[Sequence[AuditRecord]], object]


@dataclass(eq=False)
class _Job:
    build: Callable[[], AuditRecord]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[AuditRecord] = field(repr=False)
    record: AuditRecord = field(init=False, repr=False)
    error: BaseException | None = None


_STOP = None  # put on the queue by close(): the thread finishes what is before it, then ends


class AuditWriter:
    """Appends records for coroutines on a thread of its own; started on first use, again after close()."""

    def __init__(
        self, append_all: Appender, turn: threading.Lock, max_batch: int = MAX_BATCH, inline: InlineAppender | None = None
    ) -> None:
        self._append_all = append_all
        self._inline = inline
        self._turn = turn  # shared with this process's synchronous writers
        self._max_batch = max_batch
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lifecycle = threading.Lock()
        atexit.register(self.close)
        # A forked child has none of the parent's threads: its first append must start a thread of its own.
        os.register_at_fork(after_in_child=self._forget_thread)

    async def append(self, build: Callable[[], AuditRecord], *, lone_call: bool = False) -> AuditRecord:
        """Append the record `build()` makes, once it is committed; raises what building or writing it raised.

        `lone_call`: the caller is the only tool call running in this process, so the record may be written inline.
        """
        if lone_call and self._inline is not None:
            record = build()
            if self._inline.try_append(record):
                return record
            build = functools.partial(_same, record)
        loop = asyncio.get_running_loop()
        job = _Job(build, loop, loop.create_future())
        with self._lifecycle:
            if self._thread is None:
                # Each thread has a queue of its own, so one that is closing never takes a newer thread's jobs.
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(target=self._run, args=(self._jobs,), name="audit-writer", daemon=True)
                self._thread.start()
            self._jobs.put(job)
        return await job.future

    def _forget_thread(self) -> None:
        self._thread = None
        self._lifecycle = threading.Lock()

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued and end the thread (a later append starts a new one)."""
        with self._lifecycle:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._jobs.put(_STOP)
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                logger.error("audit writer: records were still being written after %.0f s at shut-down", timeout)
        if self._inline is not None:
            self._inline.close()

    def _run(self, jobs: queue.SimpleQueue[_Job | None]) -> None:
        try:
            stopping = False
            while not stopping:
                batch, stopping = self._take(jobs)
                if batch:
                    self._write(batch)
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
            self._append([job.record for job in ready])
            return
        except Exception as error:  # noqa: BLE001 - handed to the callers, as their own thread would have raised it
            if len(ready) == 1 or isinstance(error, OperationalError):
                # One record, or a database that cannot be written now (locked, gone): the same for every record.
                for job in ready:
                    job.error = error
                return
        for job in ready:  # a record the database refused: each alone, so only that record's caller fails
            try:
                self._append([job.record])
            except Exception as error:  # noqa: BLE001 - as above
                job.error = error

    def _append(self, records: list[AuditRecord]) -> None:
        with self._turn:
            self._append_all(records)


def _same(record: AuditRecord) -> AuditRecord:
    return record


def _build(job: _Job) -> bool:
    try:
        job.record = job.build()
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
            job.future.set_result(job.record)
