"""When credentials are revoked: cancel their running tool calls and, if asked, stop their background processes and
whatever else their commands left running.

`oauth` records each revocation as a Revocation row and sends `credentials_revoked` once it is committed. In the
server process the signal wakes the watcher at once (the admin's actions run in a worker thread, so the wake-up
is handed to the event loop); the watcher also polls the table, which is how it learns about revocations made by
another process (`manage.py revoke_token`, `rotate_tokens`, another server process). Only calls and processes
started before the revocation are touched, so a credential issued by the rotation itself is never affected.

Background processes are stopped by whichever process sees the revocation first: the command that made it (a
process without a watcher does it before it exits), or any server process's watcher. Each process is claimed in
the registry (its `signalled_at` set where still empty) before it is signalled, so it is stopped, and recorded,
once however many processes see the same revocation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError
from django.utils import timezone

from audit.log import aevent
from mcpserver.executor.interface import Executor, ExecutorError
from mcpserver.inflight import InFlightCalls
from mcpserver.models import BackgroundProcess
from mcpserver.process import INSTANCE_ID
from mcpserver.services import build_executor, registered
from mcpserver.stop_reasons import REVOCATION, ROTATION, SUSPENSION, Stopped
from mcpserver.workers import announce_revocation
from oauth.models import Revocation

logger = logging.getLogger(__name__)
POLL_SECONDS = 2.0
Claimed = list[tuple[BackgroundProcess, Revocation]]


def _covering(process: BackgroundProcess, revocations: Sequence[Revocation]) -> Revocation | None:
    return next((r for r in revocations if process.started_at <= r.created_at and r.covers(process.credential)), None)


def _claim_processes(revocations: Sequence[Revocation]) -> Claimed:
    """The unsignalled background processes these revocations cover, each marked signalled by this process alone."""
    latest = max(revocation.created_at for revocation in revocations)
    claimed = []
    for process in BackgroundProcess.objects.filter(signalled_at__isnull=True, started_at__lte=latest):
        revocation = _covering(process, revocations)
        if revocation is None:
            continue
        now = timezone.now()
        # Conditional, so that of several processes seeing the same revocation only one signals each process.
        if BackgroundProcess.objects.filter(pk=process.pk, signalled_at__isnull=True).update(signalled_at=now):
            process.signalled_at = now
            claimed.append((process, revocation))
    return claimed


async def _release(process: BackgroundProcess) -> None:
    """Unclaim a process that could not be signalled, so that it stays listed as running and is tried again."""
    await BackgroundProcess.objects.filter(pk=process.pk, signalled_at=process.signalled_at).aupdate(signalled_at=None)


async def _end(executor: Executor, process: BackgroundProcess) -> bool | None:
    """End the process's job through the executor: its group and all its job host adopted, SIGTERM then SIGKILL
    (PID-safe). Whether anything was running; None if the executor could not be asked."""
    try:
        return await executor.end_job(process.log_path, process.pid, process.start_ticks)
    except ExecutorError as error:
        logger.error("could not stop background process %d of a revoked credential: %s", process.pid, error)
        return None


async def stop_background_processes(revocations: Sequence[Revocation], executor: Callable[[], Executor]) -> list[int]:
    """End each background process the revocations cover, with all it started (even what left its session), then
    whatever else their credentials' commands left running (credential_groups.py), and record what was stopped, one
    audit event per revocation and kind. Returns the pids stopped."""
    wanted = [revocation for revocation in revocations if revocation.stop_background]
    if not wanted:
        return []
    claimed = await sync_to_async(_claim_processes, thread_sensitive=False)(wanted)
    stopped = await _stop_jobs(wanted, executor, claimed)
    for revocation in wanted:
        if await _jobs_ended_elsewhere(revocation, {process.pk for process, _by in claimed}):
            continue  # the process that claimed them ends what else is left once it has ended them (and said so)
        await _stop_detached(revocation, executor)
    return stopped


async def _jobs_ended_elsewhere(revocation: Revocation, mine: set[int]) -> bool:
    """Whether another process claimed background jobs of this revocation (not those in `mine`) that it may still
    be ending. Their processes are in the credentials' groups too: killing those groups here first would end the
    jobs unaudited as jobs (their claimer would find nothing left to stop)."""
    claimed = BackgroundProcess.objects.filter(
        signalled_at__gte=revocation.created_at, started_at__lte=revocation.created_at
    ).exclude(pk__in=mine)
    return any([revocation.covers(process.credential) async for process in claimed])


async def _stop_jobs(wanted: Sequence[Revocation], executor: Callable[[], Executor], claimed: Claimed) -> list[int]:
    if not claimed:
        return []
    ended = await asyncio.gather(*(_end(executor(), process) for process, _revocation in claimed))
    stopped: Claimed = []
    for (process, revocation), signalled in zip(claimed, ended, strict=True):
        if signalled is None:
            await _release(process)  # the executor is down, and so are its tools; a later pass tries again
        elif signalled:
            stopped.append((process, revocation))
    for revocation in wanted:
        mine = [process for process, by in stopped if by.pk == revocation.pk]
        if mine:
            await aevent(
                "credentials.background_stopped",
                None,
                instance_id=INSTANCE_ID,
                revocation_id=revocation.pk,
                reason=revocation.reason,
                revoked_by=revocation.username,
                pids=[process.pid for process in mine],
                credentials=sorted({process.credential for process in mine}),
                commands=[process.command[:200] for process in mine],
            )
    return [process.pid for process, _revocation in stopped]


async def _stop_detached(revocation: Revocation, executor: Callable[[], Executor]) -> None:
    """What the credentials' commands started and left running outside any background job (`setsid cmd &` in a
    terminal_exec): the executor kills what is left in their groups. Every server process seeing the revocation
    asks; the first finds them, the others nothing."""
    keys, prefixes, before = list(revocation.keys), list(revocation.prefixes), revocation.created_at.timestamp()
    try:
        killed = await executor().end_credentials(keys, prefixes, before)
    except ExecutorError as error:
        logger.error("could not stop the processes left by revoked credentials (%s): %s", revocation, error)
        return
    if killed:
        await aevent(
            "credentials.processes_stopped",
            None,
            instance_id=INSTANCE_ID,
            revocation_id=revocation.pk,
            reason=revocation.reason,
            revoked_by=revocation.username,
            pids=[process["pid"] for process in killed],
            credentials=sorted({str(process["credential"]) for process in killed}),
            commands=[str(process["command"]) for process in killed],
        )


def stopped_by(revocation: Revocation) -> Stopped:
    """What the finished records of the calls a revocation cancels say of it."""
    if revocation.reason == Revocation.REASON_ROTATION:
        return Stopped(ROTATION, revocation.username)
    if revocation.reason == Revocation.REASON_SUSPENSION:  # a row that revokes nothing (oauth.suspension)
        return Stopped(SUSPENSION, revocation.username)
    return Stopped(REVOCATION, revocation.username, revocation.reason)


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
            cancelled = self.inflight.cancel_credentials(
                revocation.covers, revocation.created_at, stopped_by(revocation)
            )
            if cancelled:
                logger.warning("cancelled %d running tool call(s) of revoked credentials (%s)", cancelled, revocation)
            self._last_id = revocation.pk
        if any(revocation.stop_background for revocation in revocations):
            # In a task of its own: the SIGKILL grace period must not hold up cancelling further calls.
            task = asyncio.get_running_loop().create_task(stop_background_processes(revocations, lambda: self.executor))
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)


_watcher: RevocationWatcher | None = None


def on_credentials_revoked(sender: Any, revocation: Revocation, **kwargs: Any) -> None:
    """Receiver of oauth's `credentials_revoked`: wake this server's watcher, or, in a process without one (a
    management command), stop the background processes right here, through the executor this process is configured
    for: the one of the application built in this process if there is one, else one built from the settings for this
    revocation (production's service, `sandstorm-manage` sets its socket; in development an executor child of its
    own, running as the same user as the server's). The server processes' watchers see the same revocation within
    POLL_SECONDS, or at once where several workers share a channel layer (mcpserver.workers); whichever process
    claims a background process first stops it."""
    announce_revocation()
    if _watcher is not None:
        _watcher.wake_threadsafe()
    elif revocation.stop_background:
        services = registered()
        if services is not None:
            asyncio.run(stop_background_processes([revocation], lambda: services.executor))
            return
        executor, child = build_executor()
        try:
            asyncio.run(stop_background_processes([revocation], lambda: executor))
        finally:
            if child is not None:
                child.stop()
