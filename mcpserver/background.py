"""Reading and writing the background-process registry from async tool code."""

from __future__ import annotations

from django.utils import timezone

from mcpserver.executor.interface import BackgroundStart
from mcpserver.models import BackgroundProcess
from mcpserver.process import INSTANCE_ID
from oauth.credentials import Principal


async def record_started_process(principal: Principal, started: BackgroundStart, command: str, cwd: str) -> None:
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
    )


async def find_started_process(pid: int, start_ticks: int) -> BackgroundProcess | None:
    return await BackgroundProcess.objects.filter(pid=pid, start_ticks=start_ticks).afirst()


async def record_signal(process: BackgroundProcess) -> None:
    await BackgroundProcess.objects.filter(pk=process.pk).aupdate(signalled_at=timezone.now())
