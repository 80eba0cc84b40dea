"""The server's half of background commands' recordings (mcpserver/job_recordings.py), in-process against an executor
that answers pages of events: one server process follows a job at a time, a claim left by a process that died is
taken over after CLAIM_SECONDS and the recording written again from the start, a row that is not a job's is marked
unrecorded instead of being retried forever, and the kept recording's SHA-256 is in the `background.ended` event."""

from __future__ import annotations

import gzip
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import override_settings
from django.utils import timezone

from audit.log import Actor, acall_started
from audit.models import KIND_EVENT, AuditRecord
from audit.recordings import damaged_recordings, file_sha256, read
from mcpserver import job_recordings
from mcpserver.executor.interface import Executor, ToolFailure
from mcpserver.job_recordings import JobRecorder
from mcpserver.models import BackgroundProcess
from mcpserver.process import INSTANCE_ID

pytestmark = [pytest.mark.inprocess, pytest.mark.anyio, pytest.mark.django_db(transaction=True)]


class PagedEvents(Executor):
    """A job's events file as pages: `lines` so far, and whether the job is over."""

    def __init__(self) -> None:
        self.lines: list[list[Any]] = []
        self.over = False
        self.asked: list[int] = []

    async def job_events(
        self, log_path: str, pid: int, start_ticks: int, offset: int, max_bytes: int = 1024 * 1024
    ) -> dict[str, Any]:
        if "not-a-job" in log_path:
            raise ToolFailure(f"Error: {log_path} is not a background command's log")
        self.asked.append(offset)
        events = self.lines[offset:]
        return {
            "events": events,
            "next_offset": len(self.lines),
            "done": self.over and not events,
            "recorded": True,
            "state": "exited" if self.over else "running",
            "exit_code": 0 if self.over else None,
        }


@pytest.fixture
def recordings(tmp_path: Path) -> Any:
    with override_settings(RECORDINGS_DIR=str(tmp_path / "recordings")):
        yield tmp_path / "recordings"


async def started_call(tool: str, arguments: dict[str, Any]) -> AuditRecord:
    return await acall_started(
        Actor(username="agent", credential_kind="bearer", credential_id="1"), tool, arguments, "t"
    )


async def job_row(
    call_id: str, log_path: str = "/out/bg-20261207-000000-0000abcd.log", **fields: Any
) -> BackgroundProcess:
    return await BackgroundProcess.objects.acreate(
        pid=4242, pgid=4242, start_ticks=1, command="make test", log_path=log_path, credential="bearer:1",
        username="agent", instance_id=INSTANCE_ID, call_id=call_id, **fields,
    )  # fmt: skip


def events_of(path: Path) -> list[list[Any]]:
    """As far as it is written (a recording still being written has no gzip trailer yet)."""
    return [list(event) for event in read(path)[1]]


async def test_a_job_is_followed_as_it_runs_and_kept_once_it_is_over(recordings: Path) -> None:
    call = await started_call("terminal_exec_background", {"command": "make test"})
    row = await job_row(call.call_id)
    executor = PagedEvents()
    recorder = JobRecorder(lambda: executor)
    executor.lines = [[0.1, "o", "building\n"]]
    assert await recorder.look() == 0
    [path] = recordings.glob(f"*/{call.call_id}.jsonl.gz")
    assert events_of(path) == [[0.1, "o", "building\n"]], "readable while the job runs"
    executor.lines.append([1.5, "e", "warning\n"])
    executor.over = True
    assert await recorder.look() == 1
    assert executor.asked[-2:] == [1, 2], "each look goes on from where the last stopped"
    await row.arefresh_from_db()
    assert row.recording is not None
    assert row.recording["events"] == 2 and row.recording["sha256"] == file_sha256(path)
    ended = await AuditRecord.objects.aget(kind=KIND_EVENT, event="background.ended")
    assert ended.call_id == call.call_id and (ended.detail or {})["recording"] == row.recording
    assert (ended.detail or {})["exit_code"] == 0 and (ended.detail or {})["pid"] == 4242
    assert await recorder.look() == 0, "kept once"
    assert await AuditRecord.objects.filter(event="background.ended").acount() == 1


async def test_another_process_waits_for_a_live_claim_and_takes_over_a_stale_one(recordings: Path) -> None:
    call = await started_call("terminal_exec_background", {"command": "make test"})
    live_claim = timezone.now()
    row = await job_row(call.call_id, recorder="f" * 32, recorder_seen=live_claim, recorded_offset=1)
    executor = PagedEvents()
    executor.lines, executor.over = [[0.1, "o", "one\n"], [0.2, "o", "two\n"]], True
    recorder = JobRecorder(lambda: executor)
    assert await recorder.look() == 0 and executor.asked == [], "another process follows it"

    stale = live_claim - timedelta(seconds=job_recordings.CLAIM_SECONDS + 1)
    await BackgroundProcess.objects.filter(pk=row.pk).aupdate(recorder_seen=stale)
    assert await recorder.look() == 1
    assert executor.asked[0] == 0, "written again from the start"
    [path] = recordings.glob(f"*/{call.call_id}.jsonl.gz")
    assert [event[2] for event in events_of(path)] == ["one\n", "two\n"]
    await row.arefresh_from_db()
    assert row.recorder == INSTANCE_ID and row.recording and row.recording["events"] == 2
    assert await sync_to_async(damaged_recordings)() == []
    path.write_bytes(gzip.compress(b'{"version": 1}\n[0.1, "o", "forged\\n"]\n'))
    [problem] = await sync_to_async(damaged_recordings)()
    assert f"(call {call.call_id})" in problem and "does not match its SHA-256" in problem


async def test_a_row_that_is_not_a_jobs_is_marked_unrecorded_not_retried(recordings: Path) -> None:
    call = await started_call("terminal_exec_background", {"command": "old"})
    row = await job_row(call.call_id, log_path="/workspace/not-a-job.log")
    executor = PagedEvents()
    recorder = JobRecorder(lambda: executor)
    assert await recorder.look() == 0
    await row.arefresh_from_db()
    assert row.recording == {"unrecorded": "Error: /workspace/not-a-job.log is not a background command's log"}
    assert await recorder.look() == 0 and executor.asked == []


async def test_stopping_lets_go_of_the_claims_for_the_next_process(recordings: Path) -> None:
    call = await started_call("terminal_exec_background", {"command": "sleep 100"})
    row = await job_row(call.call_id)
    executor = PagedEvents()
    executor.lines = [[0.1, "o", "partial\n"]]
    recorder = JobRecorder(lambda: executor)
    await recorder.look()
    await row.arefresh_from_db()
    assert row.recorder == INSTANCE_ID and row.recorded_offset == 1
    await recorder.stop()
    await row.arefresh_from_db()
    assert row.recorder == "" and row.recording is None
