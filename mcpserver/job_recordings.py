"""Background commands' recordings: followed while a job runs, kept beside the audit log once it is over.

A job's host writes its events (output with its timing and stream, input typed through terminal_input) to a file
in the executor's directory (executor/jobevents.py). A server process copies them, a page at a time, into the
recording of the call that started the job (audit/recordings.py: the same file a foreground call's would be, so
the call's page and the audit list replay it, while it runs too). Once the job is over, `background.ended` keeps
the recording's SHA-256 in the hash chain, as a call's finished record does.

Each job is followed by one server process at a time: it claims the row (`recorder`, `recorder_seen`) and renews
the claim as it goes. A process that stops lets go of its claims; one not renewed for CLAIM_SECONDS (its process
died) is taken over. The next writes the recording again from the start: the executor keeps the events until the
job's files are pruned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import DatabaseError
from django.db.models import Q
from django.utils import timezone

from audit.log.records import event_record
from audit.log.writer import current
from audit.models import KIND_STARTED, AuditRecord
from audit.recordings import JOB_ENDED, Recording
from mcpserver.executor.interface import Executor, ExecutorError, ToolFailure
from mcpserver.models import BackgroundProcess
from mcpserver.process import INSTANCE_ID

logger = logging.getLogger(__name__)

FOLLOW_SECONDS = 1.0  # between looks at the jobs followed
CLAIM_SECONDS = 30.0  # a claim not renewed for this long is another process's to take
PAGES_PER_LOOK = 8  # pages of one job's events copied per look: a noisy job does not hold up the others


class JobRecorder:
    """Follows the jobs whose recordings are not kept yet, in this server process."""

    def __init__(self, executor: Callable[[], Executor]) -> None:
        self.executor = executor
        self.open: dict[int, Recording] = {}  # row id -> its recording, being written by us
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for recording in self.open.values():
            recording.close()  # what is written stays whole; the next process writes it again from the start
        self.open.clear()
        with contextlib.suppress(DatabaseError):  # else the claims go stale in CLAIM_SECONDS
            await BackgroundProcess.objects.filter(recorder=INSTANCE_ID, recording__isnull=True).aupdate(recorder="")

    async def _run(self) -> None:
        while True:
            try:
                await self.look()
            except (DatabaseError, ExecutorError) as error:
                logger.warning("could not follow background commands' recordings: %s", error)
            await asyncio.sleep(FOLLOW_SECONDS)

    async def look(self) -> int:
        """Copy what the followed jobs wrote since the last look; keep the recordings of those that are over. How
        many recordings were kept."""
        kept = 0
        for row, taken_over in await self._claimed():
            try:
                kept += await self._follow(row, taken_over)
            except ToolFailure as failure:  # not a job's files (a row from before job hosts): nothing to follow
                self.open.pop(row.pk, None)
                await BackgroundProcess.objects.filter(pk=row.pk).aupdate(recording={"unrecorded": str(failure)})
        return kept

    async def _claimed(self) -> list[tuple[BackgroundProcess, bool]]:
        now = timezone.now()
        stale = now - timedelta(seconds=CLAIM_SECONDS)
        ours_or_free = Q(recorder=INSTANCE_ID) | Q(recorder="") | Q(recorder_seen__lt=stale)
        pending = BackgroundProcess.objects.filter(recording__isnull=True).exclude(call_id="")
        claimed = []
        async for row in pending.filter(ours_or_free):
            taken = await BackgroundProcess.objects.filter(ours_or_free, pk=row.pk, recording__isnull=True).aupdate(
                recorder=INSTANCE_ID, recorder_seen=now
            )
            if not taken:
                continue
            claimed.append((row, row.recorder not in ("", INSTANCE_ID)))
        return claimed

    async def _follow(self, row: BackgroundProcess, taken_over: bool) -> bool:
        recording = self.open.get(row.pk) or await self._begin(row, taken_over)
        if recording is None:
            return False
        offset, answer = row.recorded_offset, {}
        for _page in range(PAGES_PER_LOOK):
            answer = await self.executor().job_events(row.log_path, row.pid, row.start_ticks, offset)
            recording.write((float(at), str(code), str(text)) for at, code, text in answer["events"])
            offset = int(answer["next_offset"])
            if answer["done"] or not answer["events"]:
                break
        await BackgroundProcess.objects.filter(pk=row.pk).aupdate(recorded_offset=offset)
        if not answer.get("done"):
            return False
        await self._keep(row, recording, answer)
        return True

    async def _begin(self, row: BackgroundProcess, taken_over: bool) -> Recording | None:
        """The recording of the job's call, from the start (a process that took the job over writes it again)."""
        started = await AuditRecord.objects.filter(kind=KIND_STARTED, call_id=row.call_id).afirst()
        if started is None:  # pruned while the job ran: nothing names a recording any more
            await BackgroundProcess.objects.filter(pk=row.pk).aupdate(recording={"unrecorded": "its call was pruned"})
            return None
        recording = Recording(row.call_id, started.tool, started.created_at.timestamp(), pty=_is_pty(started))
        if taken_over or row.recorded_offset:  # left part-way by a process that stopped
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(recording.path.unlink)
        self.open[row.pk] = recording
        row.recorded_offset = 0
        return recording

    async def _keep(self, row: BackgroundProcess, recording: Recording, answer: dict[str, Any]) -> None:
        self.open.pop(row.pk, None)
        described = recording.close()
        if not answer.get("recorded", True) and described is None:
            described = {"unrecorded": "it has no recording (started with recording off, or its files were pruned)"}
        kept = described or {}
        await BackgroundProcess.objects.filter(pk=row.pk).aupdate(recording=kept)
        record = event_record(
            JOB_ENDED,
            None,
            instance_id=INSTANCE_ID,
            pid=row.pid,
            command=row.command[:200],
            credential=row.credential,
            state=answer.get("state"),
            exit_code=answer.get("exit_code"),
            recording=described,
        )
        record.call_id = row.call_id  # the call that started it: its page finds the recording by it
        await current().awrite(lambda: record)


def _is_pty(started: AuditRecord) -> bool:
    arguments = started.arguments if isinstance(started.arguments, dict) else {}
    return bool(arguments.get("pty"))
