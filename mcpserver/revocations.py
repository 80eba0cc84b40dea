"""When credentials are revoked: cancel their running tool calls and, if asked, stop their background processes.

`oauth` records each revocation as a Revocation row and sends `credentials_revoked` once it is committed. In the
server process the signal wakes the watcher at once (the admin's rotation runs in a worker thread, so the wake-up
is handed to the event loop); the watcher also polls the table, which is how it learns about revocations made by
another process (`manage.py rotate_tokens`). Only calls and processes started before the revocation are touched,
so a credential issued by the rotation itself is never affected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError
from django.utils import timezone

from audit.recorder import aevent
from mcpserver.executor.interface import Executor, ToolFailure
from mcpserver.executor.remote import ExecutorFault, ExecutorLost
from mcpserver.inflight import InFlightCalls
from mcpserver.instance import INSTANCE_ID
from mcpserver.models import BackgroundProcess
from mcpserver.runtime import get_runtime
from oauth.models import Revocation

logger = logging.getLogger(__name__)
POLL_SECONDS = 2.0
KILL_GRACE_SECONDS = 2.0


def _unsignalled_processes(revocation: Revocation) -> list[BackgroundProcess]:
    candidates = BackgroundProcess.objects.filter(signalled_at__isnull=True, started_at__lte=revocation.created_at)
    return [process for process in candidates if revocation.covers(process.credential)]


async def stop_background_processes(revocation: Revocation, executor: Executor) -> list[int]:
    """SIGTERM, then after a grace period SIGKILL, each background process the revocation covers (PID-safe)."""
    processes = await sync_to_async(_unsignalled_processes, thread_sensitive=False)(revocation)
    stopped = []
    for process in processes:
        try:
            signalled = await executor.signal_group(process.pid, process.pgid, process.start_ticks, signal.SIGTERM)
        except (ToolFailure, ExecutorLost, ExecutorFault) as error:
            # Left unmarked, so the admin can see it still listed; the executor is down, and so are its tools.
            logger.error("could not stop background process %d of a revoked credential: %s", process.pid, error)
            continue
        if signalled:
            stopped.append(process)
        await BackgroundProcess.objects.filter(pk=process.pk).aupdate(signalled_at=timezone.now())
    if stopped:
        await asyncio.sleep(KILL_GRACE_SECONDS)
        for process in stopped:
            try:
                await executor.signal_group(process.pid, process.pgid, process.start_ticks, signal.SIGKILL)
            except (ToolFailure, ExecutorLost, ExecutorFault) as error:
                logger.error("could not SIGKILL background process %d of a revoked credential: %s", process.pid, error)
        await aevent(
            "credentials.background_stopped",
            None,
            instance_id=INSTANCE_ID,
            revocation_id=revocation.pk,
            pids=[process.pid for process in stopped],
        )
    return [process.pid for process in stopped]


class RevocationWatcher:
    """Applies each new Revocation row once in this server process."""

    def __init__(self, inflight: InFlightCalls, executor: Executor) -> None:
        self.inflight = inflight
        self.executor = executor
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping: set[asyncio.Task[list[int]]] = set()
        self._last_id = 0  # from the start: background processes of credentials revoked while the server was down

    async def start(self) -> None:
        global _watcher
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        self._task = self._loop.create_task(self._run())
        _watcher = self

    async def stop(self) -> None:
        global _watcher
        _watcher = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def wake_threadsafe(self) -> None:
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            try:
                await self.apply_new()
            except DatabaseError:
                logger.exception("could not read revocations; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_SECONDS)
            self._wake.clear()

    async def apply_new(self) -> None:
        revocations = [r async for r in Revocation.objects.filter(pk__gt=self._last_id).order_by("pk")]
        for revocation in revocations:
            cancelled = self.inflight.cancel_credentials(revocation.covers, revocation.created_at)
            if cancelled:
                logger.warning("cancelled %d running tool call(s) of revoked credentials (%s)", cancelled, revocation)
            self._last_id = revocation.pk
            if revocation.stop_background:
                # In a task of its own: the SIGKILL grace period must not hold up cancelling further calls.
                task = asyncio.get_running_loop().create_task(stop_background_processes(revocation, self.executor))
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)


_watcher: RevocationWatcher | None = None


def on_credentials_revoked(sender: Any, revocation: Revocation, **kwargs: Any) -> None:
    """Receiver of oauth's `credentials_revoked`: wake this server's watcher, or, in a process without one (a
    management command), stop the background processes right here."""
    if _watcher is not None:
        _watcher.wake_threadsafe()
    elif revocation.stop_background:
        asyncio.run(stop_background_processes(revocation, get_runtime().executor))
