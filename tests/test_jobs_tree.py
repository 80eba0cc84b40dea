"""Ending a background command ends everything it started (issue 31): the job host is a child subreaper, so what
the command leaves behind in a session of its own (`setsid … &`) stays below it, and `end_job` ends that whole
tree, round after round, never a process outside it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from mcpserver.executor.interface import BackgroundStart
from mcpserver.executor.local import LocalExecutor

pytestmark = pytest.mark.anyio
DEADLINE = 10.0


@pytest.fixture
def executor(tmp_path: Path) -> LocalExecutor:
    return LocalExecutor(str(tmp_path))


def named(name: str) -> list[psutil.Process]:
    """Live processes whose command line starts with `name` (zombies have ended)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["cmdline"] and process.info["cmdline"][0] == name:
            if process.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


async def until(check: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def kill_all(name: str) -> None:
    for process in named(name):
        process.kill()


async def escaped(executor: LocalExecutor, name: str) -> BackgroundStart:
    """A job whose command leaves `name` running in a session of its own, its output not the job's, and ends."""
    command = f"setsid bash -c 'exec -a {name} sleep 283' >/dev/null 2>&1 < /dev/null & echo started"
    job = await executor.start_background(command, None)
    await until(lambda: len(named(name)) == 1, f"{name} to run")
    return job


async def test_what_a_job_left_in_a_session_of_its_own_stays_below_its_host(executor: LocalExecutor) -> None:
    name = f"x{uuid.uuid4().hex[:8]}"
    try:
        job = await escaped(executor, name)
        found = await executor.job_output(job.log_path, job.pid, job.start_ticks, 0, None, 4096, 10_000, True)
        assert (found["state"], found["output"]) == ("exited", "started\n")
        [left] = named(name)
        host = psutil.Process(left.ppid())
        assert host.cmdline()[-2].endswith("jobhost.py")  # adopted by the host, not by init
        assert os.getsid(left.pid) == left.pid  # in a session of its own, out of the command's group
    finally:
        kill_all(name)


async def test_ending_a_job_ends_what_it_left_in_another_session_and_then_its_host(executor: LocalExecutor) -> None:
    name = f"x{uuid.uuid4().hex[:8]}"
    try:
        job = await escaped(executor, name)
        [left] = named(name)
        host = psutil.Process(left.ppid())
        assert await executor.end_job(job.log_path, job.pid, job.start_ticks)
        assert named(name) == []
        await until(lambda: not host.is_running() or host.status() == psutil.STATUS_ZOMBIE, "the host to exit")
        assert not await executor.end_job(job.log_path, job.pid, job.start_ticks)  # nothing left to signal
    finally:
        kill_all(name)


async def test_ending_a_job_kills_what_ignores_sigterm(executor: LocalExecutor) -> None:
    name = f"x{uuid.uuid4().hex[:8]}"
    command = f"setsid bash -c 'trap \"\" TERM; exec -a {name} sleep 283' & sleep 283"
    try:
        job = await executor.start_background(command, None)
        await until(lambda: len(named(name)) == 1, f"{name} to run")
        began = time.monotonic()
        assert await executor.end_job(job.log_path, job.pid, job.start_ticks)
        assert named(name) == [] and time.monotonic() - began < DEADLINE
        [state] = await executor.job_states(
            [{"log_path": job.log_path, "pid": job.pid, "start_ticks": job.start_ticks}]
        )
        assert state["state"] in ("killed", "lost")
    finally:
        kill_all(name)


async def test_without_escalation_it_only_sends_sigterm_to_the_tree(executor: LocalExecutor) -> None:
    name = f"x{uuid.uuid4().hex[:8]}"
    command = f"setsid bash -c 'trap \"echo got-term; exit 0\" TERM; exec -a {name} sleep 283' & sleep 283"
    try:
        job = await executor.start_background(command, None)
        await until(lambda: len(named(name)) == 1, f"{name} to run")
        assert await executor.end_job(job.log_path, job.pid, job.start_ticks, escalate=False)
        await until(lambda: not named(name), f"{name} to end on SIGTERM")
    finally:
        kill_all(name)


async def test_a_process_outside_the_job_is_never_touched(executor: LocalExecutor) -> None:
    name = f"x{uuid.uuid4().hex[:8]}"
    bystander = subprocess.Popen(["bash", "-c", f"exec -a {name}-other sleep 60"])
    try:
        job = await escaped(executor, name)
        assert await executor.end_job(job.log_path, job.pid, job.start_ticks)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
        kill_all(name)
