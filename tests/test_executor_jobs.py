"""Background commands in the executor (mcpserver/executor/jobs.py, jobhost.py): their state through the job
host's files, output by offset and tail at character boundaries, waiting, input through the FIFO, terminals, and
what a job whose host is gone (or whose files are not a job's) reads as."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from mcpserver.executor import jobfiles, jobprocesses, jobs
from mcpserver.executor.interface import BackgroundStart, ToolFailure
from mcpserver.executor.local import LocalExecutor
from mcpserver.executor.processes import read_start_ticks

pytestmark = pytest.mark.anyio
BUDGET = 64 * 1024
DEADLINE = 10.0


@pytest.fixture
def executor(tmp_path: Path) -> LocalExecutor:
    return LocalExecutor(str(tmp_path))


async def output(executor: LocalExecutor, job: BackgroundStart, **options: Any) -> dict[str, Any]:
    arguments: dict[str, Any] = {"offset": 0, "tail": None, "max_bytes": BUDGET, "wait_ms": 0} | options
    return await executor.job_output(job.log_path, job.pid, job.start_ticks, **arguments)


async def until_end(executor: LocalExecutor, job: BackgroundStart) -> dict[str, Any]:
    found = await output(executor, job, wait_ms=int(DEADLINE * 1000), until_end=True)
    assert found["state"] != "running"
    return found


async def until_waiting(executor: LocalExecutor, job: BackgroundStart, prompt: str = "") -> dict[str, Any]:
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        found = await output(executor, job)
        if found["waiting_for_input"] and prompt in found["output"]:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"never waiting for input: {found}")


async def test_a_command_is_followed_by_offset_to_its_exit_code(executor: LocalExecutor) -> None:
    job = await executor.start_background("echo one; sleep 0.3; echo two >&2; exit 3", None)
    first = await output(executor, job, wait_ms=5000)
    assert first["output"] == "one\n" and first["next_offset"] == 4
    rest = await output(executor, job, offset=4, wait_ms=5000)
    assert rest["output"] == "two\n"
    ended = await until_end(executor, job)
    assert (ended["state"], ended["exit_code"], ended["size"]) == ("exited", 3, 8)


async def test_a_wait_returns_on_the_next_line_not_at_its_deadline(executor: LocalExecutor) -> None:
    job = await executor.start_background("sleep 0.5; echo ready; sleep 30", None)
    try:
        started = time.monotonic()
        # Bounds far from what a busy machine takes, and far from the deadline a wrong wait would run to.
        found = await output(executor, job, wait_ms=60_000)
        assert found["output"] == "ready\n" and time.monotonic() - started < 20
        quiet = time.monotonic()
        still = await output(executor, job, offset=found["next_offset"], wait_ms=300)
        assert still["output"] == "" and still["state"] == "running" and 0.25 < time.monotonic() - quiet < 20
    finally:
        os.killpg(job.pgid, signal.SIGTERM)


async def test_a_killed_command_says_by_which_signal(executor: LocalExecutor) -> None:
    job = await executor.start_background("sleep 300", None)
    assert await executor.signal_group(job.pid, job.pgid, job.start_ticks, signal.SIGTERM)
    ended = await until_end(executor, job)
    assert (ended["state"], ended["signal"], ended["exit_code"]) == ("killed", signal.SIGTERM, 128 + signal.SIGTERM)


async def test_tail_and_offsets_never_split_a_character(executor: LocalExecutor) -> None:
    job = await executor.start_background("printf 'aé€😀z'", None)
    await until_end(executor, job)
    assert (await output(executor, job, tail=3))["output"] == "z"  # 3 bytes back is inside the emoji: skipped
    whole = await output(executor, job)
    assert whole["output"] == "aé€😀z" and whole["next_offset"] == 11
    cut = await output(executor, job, max_bytes=4)  # 'a' (1) + 'é' (2) fit; '€' (3) does not
    assert cut["output"] == "aé" and cut["next_offset"] == 3
    on = await output(executor, job, offset=4)  # inside '€': reads on from the next character
    assert on["output"] == "😀z" and on["offset"] == 6


async def test_output_is_fitted_to_the_budget_in_json_bytes(executor: LocalExecutor) -> None:
    job = await executor.start_background("printf '\\033%.0s' $(seq 100)", None)
    await until_end(executor, job)
    found = await output(executor, job, max_bytes=60)  # each ESC is 6 bytes in JSON (\\u001b)
    assert found["output"] == "\x1b" * 10 and found["next_offset"] == 10 and found["size"] == 100


async def test_a_terminal_session_answers_a_prompt_and_hides_a_password(executor: LocalExecutor) -> None:
    job = await executor.start_background(
        "read -p 'Name: ' name; read -s -p 'Password: ' pw; echo; echo \"$name:${#pw}\"; tty", None, "pty"
    )
    prompt = await until_waiting(executor, job)
    assert prompt["output"] == "Name: " and prompt["mode"] == "pty"
    await executor.job_input(job.log_path, job.pid, job.start_ticks, "bob\n", False)
    await asyncio.sleep(0.2)
    await until_waiting(executor, job)
    await executor.job_input(job.log_path, job.pid, job.start_ticks, "hunter2\n", False)
    ended = await until_end(executor, job)
    assert ended["exit_code"] == 0
    lines = ended["output"].split("\r\n")
    assert lines[:2] == ["Name: bob", "Password: "] and "hunter2" not in ended["output"]  # not echoed
    assert lines[2] == "bob:7" and lines[3].startswith("/dev/pts/")


async def test_ctrl_c_reaches_a_terminal_command_as_sigint(executor: LocalExecutor) -> None:
    job = await executor.start_background("sleep 300", None, "pty")
    await asyncio.sleep(0.3)
    await executor.job_input(job.log_path, job.pid, job.start_ticks, "\x03", False)
    ended = await until_end(executor, job)
    assert ended["signal"] == signal.SIGINT


async def test_stdin_takes_input_in_pieces_then_its_end(executor: LocalExecutor) -> None:
    job = await executor.start_background("wc -c", None, "stdin")
    waiting = await until_waiting(executor, job)
    assert waiting["state"] == "running"
    big = "x" * (3 * jobs.INPUT_FRAME + 5)  # more than one frame, more than the FIFO holds at once
    sent = await executor.job_input(job.log_path, job.pid, job.start_ticks, big, True)
    assert sent["written"] == len(big)
    ended = await until_end(executor, job)
    assert ended["output"].strip() == str(len(big)) and ended["exit_code"] == 0
    assert not Path(job.log_path).with_suffix(".in").exists()  # the host removed its FIFO when it ended
    with pytest.raises(ToolFailure, match="no longer running"):
        await executor.job_input(job.log_path, job.pid, job.start_ticks, "late", False)


async def test_input_to_a_command_without_stdin_is_refused(executor: LocalExecutor) -> None:
    job = await executor.start_background("sleep 300", None)
    try:
        with pytest.raises(ToolFailure, match="started without stdin"):
            await executor.job_input(job.log_path, job.pid, job.start_ticks, "x", False)
        assert not (await output(executor, job))["waiting_for_input"]
    finally:
        os.killpg(job.pgid, signal.SIGTERM)


async def test_a_command_whose_host_was_killed_reads_as_lost(executor: LocalExecutor) -> None:
    job = await executor.start_background("sleep 300", None)
    host = psutil.Process(job.pid).ppid()
    os.killpg(job.pgid, signal.SIGKILL)
    os.kill(host, signal.SIGKILL)
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end and (read_start_ticks(job.pid) or read_start_ticks(host)):
        await asyncio.sleep(0.05)
    [state] = await executor.job_states([{"log_path": job.log_path, "pid": job.pid, "start_ticks": job.start_ticks}])
    assert state["state"] == "lost"


async def test_a_job_outlives_the_executor_object_that_started_it(executor: LocalExecutor, tmp_path: Path) -> None:
    job = await executor.start_background("sleep 0.5; echo after", None)
    # A restarted executor knows the job only by its row: log, pid, ticks.
    again = LocalExecutor(str(tmp_path), output_dir=str(executor.saved_output.directory))
    ended = await until_end(again, job)
    assert (ended["output"], ended["exit_code"]) == ("after\n", 0)


@pytest.mark.parametrize(
    "log_path",
    ["/etc/passwd", "{out}/../../secret.log", "{out}/exec-20250101-120000-1a2b3c4d.stdout", "{out}/bg-x.log"],
)
async def test_only_a_job_log_in_the_output_directory_is_read(executor: LocalExecutor, log_path: str) -> None:
    out = executor.saved_output.create()
    with pytest.raises(ToolFailure, match="is not a background command's log"):
        await executor.job_output(log_path.format(out=out), 1, 1, 0, None, BUDGET, 0)


async def test_a_log_swapped_for_a_symlink_is_not_followed(executor: LocalExecutor, tmp_path: Path) -> None:
    job = await executor.start_background("true", None)
    await until_end(executor, job)
    secret = tmp_path / "secret"
    secret.write_text("do not show")
    os.unlink(job.log_path)
    os.symlink(secret, job.log_path)
    with pytest.raises(ToolFailure, match="cannot read"):
        await output(executor, job)


def state_lines(job: BackgroundStart) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(job.log_path).with_suffix(".state").read_text().splitlines()]


async def test_the_state_file_is_the_hosts_json_lines_the_last_one_current(executor: LocalExecutor) -> None:
    job = await executor.start_background("exit 7", None)
    await until_end(executor, job)
    running, state = state_lines(job)
    assert running["state"] == "running"
    assert (state["state"], state["exit_code"], state["pid"], state["start_ticks"]) == (
        "exited", 7, job.pid, job.start_ticks
    )  # fmt: skip


@pytest.mark.parametrize(
    ("written", "state"),
    [
        ('{"state": "running", "mode": "none"}\n{"state": "exited", "exit_code": 3}\n', "exited"),
        ('{"state": "running", "mode": "none"}\n{"state": "exi', "running"),  # a line still being appended
        ('{"state": "exited", "exit_code": 3}', "exited"),  # an older host's file: one object, no newline
    ],
)
def test_a_state_is_the_last_whole_line(tmp_path: Path, written: str, state: str) -> None:
    path = tmp_path / "bg.state"
    path.write_text(written)
    assert jobfiles.read_state(path)["state"] == state


async def test_an_unknown_mode_is_refused(executor: LocalExecutor) -> None:
    with pytest.raises(ToolFailure, match="mode must be one of"):
        await executor.start_background("true", None, "tty")


async def test_a_wait_ends_when_the_command_waits_for_input(executor: LocalExecutor) -> None:
    job = await executor.start_background("read -p 'Continue? ' answer; echo \"got $answer\"", None, "pty")
    prompt = await until_waiting(executor, job, "Continue? ")
    began = time.monotonic()
    found = await output(executor, job, offset=prompt["next_offset"], wait_ms=60_000)
    assert found["waiting_for_input"] and found["output"] == "" and time.monotonic() - began < 20
    await executor.job_input(job.log_path, job.pid, job.start_ticks, "yes\n", False)
    ended = await until_end(executor, job)
    assert ended["output"].endswith("got yes\r\n")


async def test_a_prompt_the_host_writes_late_is_in_the_answer_that_says_waiting(tmp_path: Path) -> None:
    files = jobfiles.JobFiles(tmp_path, "bg-20261206-000000-00000000")
    files.log.write_bytes(b"")

    async def host_writes_the_prompt() -> None:
        await asyncio.sleep(0.015)
        files.log.write_bytes(b"Continue? ")

    writing = asyncio.create_task(host_writes_the_prompt())
    assert await jobs.JobOps._settled_size(files, 0) == len(b"Continue? ")
    await writing


@pytest.mark.parametrize(
    "written",
    ['{"state": "exited", "exit_code": "rm -rf /", "signal": [1]}', '["not", "an", "object"]', '{"state": "hacked"}'],
)
async def test_a_state_file_the_agent_rewrote_is_read_for_what_it_can_be(executor: LocalExecutor, written: str) -> None:
    job = await executor.start_background("true", None)
    await until_end(executor, job)
    Path(job.log_path).with_suffix(".state").write_text(written)
    found = await output(executor, job)
    assert found["state"] in ("exited", "lost") and found["exit_code"] is None and found["signal"] is None


async def test_output_held_open_by_what_the_command_left_does_not_keep_its_host_busy(executor: LocalExecutor) -> None:
    job = await executor.start_background("sleep 30 & echo left", None)
    ended = await until_end(executor, job)  # bash has ended; the sleep it left still holds the output open
    assert (ended["state"], ended["exit_code"], ended["output"]) == ("exited", 0, "left\n")
    host = psutil.Process(state_lines(job)[-1]["host_pid"])
    try:
        assert host.is_running()
        before = sum(host.cpu_times()[:2])
        await asyncio.sleep(1.0)
        assert sum(host.cpu_times()[:2]) - before < 0.1  # it waits for the output, it does not spin
    finally:
        os.killpg(job.pgid, signal.SIGKILL)  # the sleep left in the command's group


async def test_a_password_prompt_of_another_users_program_shows_as_waiting_by_its_echo(
    executor: LocalExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sudo's /proc entries are root's: stand in for one by making no process readable, so only the terminal tells.
    monkeypatch.setattr(jobprocesses, "reads_from", lambda pid, target: False)
    job = await executor.start_background("read -p 'Name: ' name; read -s -p 'Password: ' pw; echo ok", None, "pty")
    end = time.monotonic() + DEADLINE
    while "Name: " not in (await output(executor, job))["output"] and time.monotonic() < end:
        await asyncio.sleep(0.05)
    assert not (await output(executor, job))["waiting_for_input"]  # an echoing prompt needs a reader seen in /proc
    await executor.job_input(job.log_path, job.pid, job.start_ticks, "bob\n", False)
    prompt = await until_waiting(executor, job)
    assert prompt["output"].endswith("Password: ")
    await executor.job_input(job.log_path, job.pid, job.start_ticks, "hunter2\n", False)
    assert (await until_end(executor, job))["exit_code"] == 0
