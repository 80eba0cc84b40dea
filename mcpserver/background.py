"""Reading and writing the background-process registry from async tool code."""

from __future__ import annotations

import asyncio

from django.conf import settings
from django.utils import timezone

from mcpserver.executor.interface import BackgroundStart, Executor
from mcpserver.models import BackgroundProcess
from mcpserver.process import INSTANCE_ID
from oauth.credentials import Principal


def record_cap() -> int:
    """Bytes of a job's output its recording keeps (head and tail past it); 0: recording is off."""
    return int(settings.RECORDING_MAX_BYTES)


async def record_started_process(
    principal: Principal, started: BackgroundStart, command: str, cwd: str, call_id: str
) -> None:
    """The registry's row of a job `call_id` started; its recording is kept from it (job_recordings.py)."""
    await BackgroundProcess.objects.acreate(
        pid=started.pid,
        pgid=started.pgid,
        start_ticks=started.start_ticks,
        command=command,
        cwd=cwd,
        log_path=started.log_path,
        credential=principal.key,
        username=principal.username,
        instance_id=INSTANCE_ID,
        call_id=call_id,
    )


async def find_started_process(pid: int, start_ticks: int) -> BackgroundProcess | None:
    return await BackgroundProcess.objects.filter(pid=pid, start_ticks=start_ticks).afirst()


async def record_signal(process: BackgroundProcess) -> None:
    await BackgroundProcess.objects.filter(pk=process.pk).aupdate(signalled_at=timezone.now())


async def find_job(principal: Principal, pid: int) -> BackgroundProcess | None:
    """The newest background command with this id that this credential's user started (never another user's)."""
    return await BackgroundProcess.objects.filter(pid=pid, username=principal.username).afirst()


async def jobs_of(username: str, limit: int) -> tuple[list[BackgroundProcess], int]:
    """The newest `limit` background commands `username` started, and how many there are in all."""
    rows = BackgroundProcess.objects.filter(username=username)
    return [row async for row in rows[:limit]], await rows.acount()


def job_ref(process: BackgroundProcess) -> dict[str, object]:
    """What the executor needs to find a job again: its log, and the pid and start ticks of its command."""
    return {"log_path": process.log_path, "pid": process.pid, "start_ticks": process.start_ticks}


async def stop_jobs(executor: Executor, rows: list[BackgroundProcess]) -> list[BackgroundProcess]:
    """End each row's job: its command group and all its job host adopted (even in sessions of their own), SIGTERM
    then SIGKILL to what is left (PID-safe); the rows that had anything running. Raises ExecutorError when the
    executor cannot be asked."""
    ended = await asyncio.gather(*(executor.end_job(row.log_path, row.pid, row.start_ticks) for row in rows))
    stopped = [row for row, signalled in zip(rows, ended, strict=True) if signalled]
    for row in stopped:
        await record_signal(row)
    return stopped
