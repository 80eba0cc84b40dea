"""A background command's recording as its job host keeps it (jobhost.Recorder) and the executor reads it back
(jobevents.py, JobOps.job_events): stdout and stderr apart with their timing, input typed into a pipe or a terminal,
the per-call cap's head and tail, the end, and a file tampered with by a command that could reach it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from mcpserver.executor.interface import BackgroundStart
from mcpserver.executor.jobfiles import JobFiles
from mcpserver.executor.local import LocalExecutor

pytestmark = pytest.mark.anyio
DEADLINE = 15.0


@pytest.fixture
def executor(tmp_path: Path) -> LocalExecutor:
    return LocalExecutor(str(tmp_path))


async def all_events(executor: LocalExecutor, job: BackgroundStart, page: int = 4096) -> tuple[list[list[Any]], dict]:
    """Every event, page by page, until the executor says the recording is done."""
    events: list[list[Any]] = []
    offset, end = 0, time.monotonic() + DEADLINE
    while time.monotonic() < end:
        answer = await executor.job_events(job.log_path, job.pid, job.start_ticks, offset, page)
        events += answer["events"]
        offset = answer["next_offset"]
        if answer["done"]:
            return events, answer
        if not answer["events"]:
            await asyncio.sleep(0.05)
    raise AssertionError(f"the recording never ended: {events}")


def files_of(job: BackgroundStart) -> JobFiles:
    path = Path(job.log_path)
    return JobFiles(path.parent, path.name.removesuffix(".log"))


async def test_stdout_and_stderr_are_kept_apart_in_order_with_their_timing(executor: LocalExecutor) -> None:
    job = await executor.start_background(
        "echo a; sleep 0.4; echo b >&2; sleep 0.4; printf '\\033[31mred\\033[0m\\n'; echo d >&2; exit 4", None
    )
    events, answer = await all_events(executor, job)
    assert [(code, text) for _at, code, text in events] == [
        ("o", "a\n"),
        ("e", "b\n"),
        ("o", "\x1b[31mred\x1b[0m\n"),
        ("e", "d\n"),
    ]
    times = [at for at, _code, _text in events]
    assert times == sorted(times) and times[1] - times[0] > 0.3, "the pauses are kept"
    assert (answer["state"], answer["exit_code"], answer["recorded"]) == ("exited", 4, True)
    log = Path(job.log_path).read_text()
    assert log == "a\nb\n\x1b[31mred\x1b[0m\nd\n", "the log still holds both streams, in order"


async def test_input_typed_into_a_pipe_is_kept_as_input_events(executor: LocalExecutor) -> None:
    job = await executor.start_background('read name; echo "hello $name"; cat', None, "stdin")
    await executor.job_input(job.log_path, job.pid, job.start_ticks, "bob\n", False)
    await executor.job_input(job.log_path, job.pid, job.start_ticks, "rest", True)
    events, _answer = await all_events(executor, job)
    said = [(code, text) for _at, code, text in events]
    assert ("i", "bob\n") in said and ("i", "rest") in said and ("m", "[end of input]") in said
    assert said.index(("i", "bob\n")) < said.index(("o", "hello bob\n"))
    assert "".join(text for code, text in said if code == "o") == "hello bob\nrest"


async def test_a_terminal_session_keeps_what_was_typed_and_what_it_showed(executor: LocalExecutor) -> None:
    job = await executor.start_background("read -p 'Continue? ' answer; echo \"got $answer\"", None, "pty")
    end = time.monotonic() + DEADLINE
    while "Continue? " not in Path(job.log_path).read_text() and time.monotonic() < end:
        await asyncio.sleep(0.05)
    await executor.job_input(job.log_path, job.pid, job.start_ticks, "yes\r", False)
    events, answer = await all_events(executor, job)
    assert ("i", "yes\r") in [(code, text) for _at, code, text in events]
    shown = "".join(text for _at, code, text in events if code == "o")
    assert "Continue? " in shown and "got yes" in shown, shown
    assert {code for _at, code, _text in events} <= {"o", "i"}, "a terminal has one stream"
    assert answer["exit_code"] == 0


async def test_past_the_cap_the_head_and_tail_are_kept_and_the_cut_is_said(executor: LocalExecutor) -> None:
    command = "for i in $(seq 1 2000); do echo line$i; sleep 0.0005; done"
    job = await executor.start_background(command, None, "none", record_cap=4000)
    events, _answer = await all_events(executor, job)
    text = "".join(text for _at, code, text in events if code == "o")
    notes = [text for _at, code, text in events if code == "m"]
    assert text.startswith("line1\nline2\n") and text.endswith("line1999\nline2000\n")
    assert 3000 <= len(text) <= 4200 and "line1000\n" not in text
    assert len(notes) == 1 and notes[0].endswith("bytes of output left out here]")
    left_out = int(notes[0].strip("[").split()[0])
    assert left_out + len(text) == sum(len(f"line{i}\n") for i in range(1, 2001))


async def test_recording_off_makes_no_file_and_the_job_still_ends(executor: LocalExecutor) -> None:
    job = await executor.start_background("echo quiet", None, "none", record_cap=0)
    events, answer = await all_events(executor, job)
    assert events == [] and answer["recorded"] is False and answer["state"] == "exited"
    assert not files_of(job).events.exists()


async def test_a_running_job_is_read_as_it_goes_and_is_not_done(executor: LocalExecutor) -> None:
    job = await executor.start_background("echo first; sleep 30", None)
    try:
        end = time.monotonic() + DEADLINE
        answer: dict[str, Any] = {"events": []}
        while not answer["events"] and time.monotonic() < end:
            answer = await executor.job_events(job.log_path, job.pid, job.start_ticks, 0)
            await asyncio.sleep(0.05)
        assert [event[1:] for event in answer["events"]] == [["o", "first\n"]]
        assert answer["done"] is False and answer["state"] == "running"
        again = await executor.job_events(job.log_path, job.pid, job.start_ticks, answer["next_offset"])
        assert again["events"] == [] and again["next_offset"] == answer["next_offset"]
    finally:
        os.killpg(job.pgid, signal.SIGKILL)
    events, answer = await all_events(executor, job)
    assert answer["state"] == "killed"


async def test_lines_that_are_not_events_are_skipped_and_a_half_line_waits(executor: LocalExecutor) -> None:
    job = await executor.start_background("echo real", None)
    await all_events(executor, job)
    events_file = files_of(job).events
    whole = events_file.read_bytes()
    forged = [
        b"not json\n",
        json.dumps({"end": False}).encode() + b"\n",
        json.dumps([1.0, "x", "bad code"]).encode() + b"\n",
        json.dumps([True, "o", "bool time"]).encode() + b"\n",
        json.dumps([1.0, "o", 5]).encode() + b"\n",
        json.dumps([2.0, "o", "kept"]).encode() + b"\n",
        b'[3.0, "o", "half',
    ]
    events_file.write_bytes(whole.replace(b'{"end": true}\n', b"") + b"".join(forged))
    answer = await executor.job_events(job.log_path, job.pid, job.start_ticks, 0)
    assert [event[1:] for event in answer["events"]] == [["o", "real\n"], ["o", "kept"]]
    assert answer["next_offset"] == events_file.stat().st_size - len(b'[3.0, "o", "half')
    assert answer["done"] is False, "the page had events: the next one says it is over"
    end = time.monotonic() + DEADLINE
    last = await executor.job_events(job.log_path, job.pid, job.start_ticks, answer["next_offset"])
    while not last["done"] and time.monotonic() < end:  # the host exits just after writing its end
        await asyncio.sleep(0.05)
        last = await executor.job_events(job.log_path, job.pid, job.start_ticks, answer["next_offset"])
    assert last["events"] == [] and last["done"] is True, "the host is gone: what it wrote is all there is"
