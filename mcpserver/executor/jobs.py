"""Background commands: started in a job host (jobhost.py), followed, fed input, ended, and their state read back.

A job is named by its log's file name in the saved-output directory, `bg-<time>-<random>.log`; beside it are its
state file (`.state`, appended to by the host) and, for a job started with stdin or a terminal, its input FIFO
(`.in`, mode 0600). The executor creates and opens all three and hands the host their descriptors: the directory is
the executor's, outside the workspace, where no tool reaches and a confined host may not write by path. Everything
a job is lives in those files and in its processes, never in the executor's memory: a job outlives the executor and
the server that started it, and is found again from the registry's row after either restarts.

Jobs started before the directory moved out of the workspace keep their files in `<workspace>/.sandstorm/output`;
they are still read there.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcpserver.executor import confinement, jobhost, jobprocesses
from mcpserver.executor.capture import spill_stem, trim_incomplete_end, trim_incomplete_start
from mcpserver.executor.interface import DEFAULT_RECORD_CAP, BackgroundStart, ToolFailure
from mcpserver.executor.jobevents import EVENTS_PAGE, read_events
from mcpserver.executor.jobfiles import (
    JOB_LOG,
    MODES,
    SAVED_OUTPUT,
    JobFiles,
    log_size,
    open_job_files,
    read_state,
)
from mcpserver.executor.processes import KILL_WAIT, TERM_GRACE, TOO_MANY_TASKS
from mcpserver.executor.savedoutput import SavedOutput
from mcpserver.executor.spawn import spawn
from mcpserver.executor.textsize import json_size

BACKGROUND_LOG_CAP = 64 * 1024 * 1024
HOST_START_TIMEOUT = 10.0
POLL_INTERVAL = 0.01  # seconds between looks at a followed log: the wake-up latency of terminal_output's wait
INPUT_LOOK_EVERY = 25  # polls: a wait looks through /proc for a reader of the job's input every 250 ms
PROMPT_SETTLE = (3, 0.5)  # a log the same size over 3 polls (at most 0.5 s) holds what came before the read
INPUT_TIMEOUT = 5.0  # how long terminal_input waits for a command that does not read what it was sent
INPUT_FRAME = 64 * 1024
END_POLL = 0.05  # seconds between looks for what is left of a job being ended


class JobOps:
    """The background half of the executor; composed into LocalExecutor, which sets these attributes."""

    env: dict[str, str]
    saved_output: SavedOutput
    _input_locks: dict[str, asyncio.Lock]
    _working_dir: Callable[[str | None], str]  # ProcessOps'

    # --- starting ------------------------------------------------------------------------------------------------

    async def start_background(
        self, command: str, cwd: str | None, mode: str = "none", record_cap: int = DEFAULT_RECORD_CAP
    ) -> BackgroundStart:
        if mode not in MODES:
            raise ToolFailure(f"Error: mode must be one of {', '.join(MODES)}")
        directory = self._working_dir(cwd)
        profile, sandboxes = confinement.PROFILE.get(), confinement.active()
        sandbox = sandboxes.ruleset_fd(profile)  # refuses a profile the kernel cannot enforce, before anything is made
        log_cap = self.saved_output.grant(BACKGROUND_LOG_CAP)  # counted whole until the directory is measured again
        if not log_cap:
            raise ToolFailure(f"Error: not started: there is no room for its log: {self.saved_output.full_message()}")
        files = JobFiles(self.saved_output.create(), spill_stem("bg"))
        fds = open_job_files(files, mode, recorded=record_cap > 0)
        spec = {
            "command": command,
            "mode": mode,
            "cap": log_cap,
            "record_cap": int(record_cap),
            **fds,
            "sandbox_fd": -1 if sandbox is None else sandbox,
        }
        argv = [sys.executable, "-I", "-S", jobhost.__file__, json.dumps(spec)]
        answer = bytearray()
        passed = tuple(fd for fd in (*fds.values(), sandbox) if fd is not None and fd >= 0)
        try:
            # The host is our own code holding the job's files, so it runs unconfined; it binds the command it
            # starts to the credential's sandbox (the ruleset passed to it) before the command runs.
            with confinement.unconfined():
                host = spawn(
                    argv,
                    directory,
                    sandboxes.environment(profile, self.env),
                    lambda _n, data: answer.extend(data[:4096]),
                    merge_stderr=True,
                    pass_fds=passed,
                )
        except BlockingIOError as error:
            self.saved_output.give_back(log_cap)
            raise ToolFailure(f"Error: not started: {TOO_MANY_TASKS}") from error
        finally:
            for fd in fds.values():
                if fd >= 0:
                    os.close(fd)  # the host holds its copies
        done, _ = await asyncio.wait({host.pipes_closed}, timeout=HOST_START_TIMEOUT)
        words = bytes(answer).split()
        if not done or len(words) != 2 or not all(word.isdigit() for word in words):
            host.close_pipes()
            said = bytes(answer).decode("utf-8", errors="replace").strip().splitlines()[-1:] or ["no answer"]
            raise ToolFailure(f"Error: background command not started: its job host said: {said[0][:300]}")
        pid, ticks = int(words[0]), int(words[1])
        return BackgroundStart(pid=pid, pgid=pid, start_ticks=ticks, log_path=str(files.log))

    # --- reading -------------------------------------------------------------------------------------------------

    def _job(self, log_path: str) -> JobFiles:
        """The job a registry row names, refused unless its log is a job log directly in the saved-output directory
        (or, for a job started before it moved, in the workspace's old one)."""
        path = Path(log_path)
        known = (self.saved_output.directory, self.saved_output.legacy_directory)
        if path.parent not in known or not JOB_LOG.fullmatch(path.name):
            raise ToolFailure(f"Error: {log_path} is not a background command's log")
        return JobFiles(path.parent, path.name.removesuffix(".log"))

    def _state(self, files: JobFiles, pid: int, ticks: int) -> dict[str, Any]:
        """What the host last wrote, checked against the processes: a host gone without an exit is `lost`."""
        state = read_state(files.state)
        if state.get("state") in ("exited", "killed"):
            if state.get("mode", "none") != "none" and files.directory == self.saved_output.directory:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(files.fifo)  # the host closed it at the end; the name is ours to remove
            return state
        host_alive = jobprocesses.alive(state.get("host_pid", 0), state.get("host_ticks", -1))
        if state and host_alive:
            return state
        if jobprocesses.alive(pid, ticks):
            return {**state, "state": "running"}
        return {**state, "state": "lost"}

    def _describe(self, files: JobFiles, pid: int, ticks: int, look_for_input: bool = True) -> dict[str, Any]:
        state = self._state(files, pid, ticks)
        size = log_size(files)
        target = state.get("stdin_target") or ""
        waiting = state["state"] == "running" and bool(target) and look_for_input and self._waits_for_input(pid, target)
        return {
            "state": state["state"],
            "exit_code": state.get("exit_code"),
            "signal": state.get("signal"),
            "mode": state.get("mode", "none"),
            "size": size,
            "waiting_for_input": waiting,
            "ended": state.get("ended"),
        }

    @staticmethod
    def _waits_for_input(session: int, target: str) -> bool:
        if any(jobprocesses.reads_from(member, target) for member in jobprocesses.session_members(session)):
            return True
        return target.startswith("/dev/") and jobprocesses.echo_off(target)

    async def job_output(
        self,
        log_path: str,
        pid: int,
        start_ticks: int,
        offset: int | None,
        tail: int | None,
        max_bytes: int,
        wait_ms: int,
        until_end: bool = False,
    ) -> dict[str, Any]:
        """Output from `offset` (or the last `tail` bytes), at most `max_bytes`, cut at a character boundary.

        With `wait_ms`, waits until there is output past the offset (or, `until_end`, regardless of output) or the
        command is no longer running.
        """
        files = self._job(log_path)
        described = self._describe(files, pid, start_ticks)
        if tail is not None:
            offset = max(0, described["size"] - tail)
        start = offset or 0
        deadline = time.monotonic() + wait_ms / 1000
        polls = 0
        while (
            described["state"] == "running"
            and (until_end or (described["size"] <= start and not described["waiting_for_input"]))
            and time.monotonic() < deadline
        ):  # a command waiting for input writes nothing more until it gets some: the wait ends there
            await asyncio.sleep(POLL_INTERVAL)
            polls += 1
            described = self._describe(files, pid, start_ticks, look_for_input=polls % INPUT_LOOK_EVERY == 0)
        if polls and described["state"] == "running":
            described = self._describe(files, pid, start_ticks)
        if described["waiting_for_input"]:
            described["size"] = await self._settled_size(files, described["size"])
        data = self._read_log(files, start, max_bytes)
        if tail is not None or start > 0:
            skipped = len(data) - len(trim_incomplete_start(data))
            data, start = data[skipped:], start + skipped
        data = _fit(data, max_bytes, whole=start + len(data) >= described["size"])
        return {**described, "offset": start, "next_offset": start + len(data), "output": data.decode(errors="replace")}

    @staticmethod
    async def _settled_size(files: JobFiles, size: int) -> int:
        """The log's size once the host has written what the command printed before it began to read.

        The command's prompt reaches the log through the host, after the command is already blocked reading: an
        agent told "waiting for input" should see the question too.
        """
        steady, limit = PROMPT_SETTLE
        deadline, same = time.monotonic() + limit, 0
        while same < steady and time.monotonic() < deadline:
            await asyncio.sleep(POLL_INTERVAL)
            now = log_size(files)
            same, size = (same + 1, size) if now == size else (0, now)
        return size

    def _read_log(self, files: JobFiles, start: int, max_bytes: int) -> bytes:
        try:
            fd = os.open(files.log, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return b""
        except OSError as error:
            raise ToolFailure(f"Error: cannot read {files.log}: {error.strerror}") from error
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ToolFailure(f"Error: {files.log} is not a regular file")
            return os.pread(fd, max_bytes, start)
        finally:
            os.close(fd)

    async def read_saved_output(
        self, name: str, offset: int | None, tail: int | None, max_bytes: int
    ) -> dict[str, Any]:
        """A page of a command's saved output (the file a cut result names), as `job_output` pages a log.

        Only a file directly in the saved-output directory with the unguessable name run_process gives: the name,
        which only the result of the command's call holds, is what lets its holder read it."""
        if not SAVED_OUTPUT.fullmatch(name):
            raise ToolFailure(f"Error: {name!r} is not the name of a command's saved output")
        files = JobFiles(self.saved_output.directory, name.removesuffix(".log"))
        size = log_size(files)
        if not size and not files.log.exists():
            raise ToolFailure(f"Error: no saved output {name} (files go after 7 days, or an administrator pruned it)")
        start = max(0, size - tail) if tail is not None else offset or 0
        data = self._read_log(files, start, max_bytes)
        if start > 0:
            skipped = len(data) - len(trim_incomplete_start(data))
            data, start = data[skipped:], start + skipped
        data = _fit(data, max_bytes, whole=start + len(data) >= size)
        return {
            "size": size,
            "offset": start,
            "next_offset": start + len(data),
            "output": data.decode(errors="replace"),
        }

    async def job_events(
        self, log_path: str, pid: int, start_ticks: int, offset: int, max_bytes: int = EVENTS_PAGE
    ) -> dict[str, Any]:
        """A page of the job's recording from byte `offset`: its events, where to go on, and whether it is done
        (the host wrote its end; or the job is over and its host gone without one, or it has no recording)."""
        files = self._job(log_path)
        page = read_events(files, max(0, int(offset)), min(max(int(max_bytes), 4096), EVENTS_PAGE))
        state = self._state(files, pid, start_ticks)
        host_gone = not jobprocesses.alive(state.get("host_pid", 0), state.get("host_ticks", -1))
        over = state["state"] != "running" and host_gone  # a host killed before its end: what it wrote is all
        return {
            "events": page.events,
            "next_offset": page.next_offset,
            "done": page.end or (over and not page.events),
            "recorded": page.found,
            "state": state["state"],
            "exit_code": state.get("exit_code"),
        }

    async def job_states(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The state of each job (`log_path`, `pid`, `start_ticks`), in order; a job not found reads as lost."""
        found = []
        for job in jobs:
            try:
                files = self._job(str(job["log_path"]))
            except ToolFailure:
                found.append({"state": "lost", "size": 0, "waiting_for_input": False, "mode": "none"})
                continue
            found.append(self._describe(files, int(job["pid"]), int(job["start_ticks"])))
        return found

    # --- ending ------------------------------------------------------------------------------------------------

    async def end_job(self, log_path: str, pid: int, start_ticks: int, escalate: bool = True) -> bool:
        """SIGTERM the job's command group and everything its host adopted; with `escalate`, SIGKILL what is left
        after TERM_GRACE, round after round (a process may fork meanwhile) until nothing is, or KILL_WAIT has passed.
        Whether anything was running to be signalled. PID-safe: the command and the host are each checked to be the
        very process that was started (pid and start ticks) before they or their descendants are signalled."""
        files = self._job(log_path)
        if not self._signal_job(files, pid, start_ticks, signal.SIGTERM):
            return False
        if escalate:
            await self._until_ended(files, pid, start_ticks, TERM_GRACE, None)
            await self._until_ended(files, pid, start_ticks, KILL_WAIT, signal.SIGKILL)
        return True

    def _job_processes(self, files: JobFiles, pid: int, start_ticks: int) -> tuple[bool, list[int]]:
        """Whether the command still runs, and the live processes below its host (if the host still runs)."""
        state = read_state(files.state)
        host, host_ticks = state.get("host_pid", 0), state.get("host_ticks", -1)
        below = jobprocesses.descendants(host) if jobprocesses.alive(host, host_ticks) else []
        return jobprocesses.alive(pid, start_ticks), below

    def _signal_job(self, files: JobFiles, pid: int, start_ticks: int, signum: int) -> int:
        """Signal the command's group (while the command runs) and each process below the host: how many got it."""
        command, below = self._job_processes(files, pid, start_ticks)
        sent = int(command and jobprocesses.send_signal(pid, signum, group=True))
        return sent + sum(jobprocesses.send_signal(member, signum) for member in below)

    async def _until_ended(
        self, files: JobFiles, pid: int, start_ticks: int, limit: float, signum: signal.Signals | None
    ) -> None:
        """Wait up to `limit` seconds for the job's processes to be gone, sending `signum` to what is left each look."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            command, below = self._job_processes(files, pid, start_ticks)
            if not command and not below:
                return
            if signum is not None:
                self._signal_job(files, pid, start_ticks, signum)
            await asyncio.sleep(END_POLL)

    # --- input ---------------------------------------------------------------------------------------------------

    async def job_input(self, log_path: str, pid: int, start_ticks: int, text: str, eof: bool) -> dict[str, Any]:
        files = self._job(log_path)
        described = self._describe(files, pid, start_ticks)
        if described["mode"] == "none":
            raise ToolFailure(
                f"Error: background command {pid} was started without stdin: start it with stdin (or pty) true"
            )
        if described["state"] != "running":
            raise ToolFailure(f"Error: background command {pid} is no longer running ({described['state']})")
        data = text.encode()
        frames = [jobhost.FRAME_HEADER.pack(b"D", len(part)) + part for part in _pieces(data, INPUT_FRAME)]
        if eof:
            frames.append(jobhost.FRAME_HEADER.pack(b"E", 0))
        lock = self._input_locks.setdefault(files.stem, asyncio.Lock())
        async with lock:  # frames of two calls must not interleave in the FIFO
            await self._write_fifo(files, pid, b"".join(frames))
        return {**self._describe(files, pid, start_ticks), "written": len(data)}

    async def _write_fifo(self, files: JobFiles, pid: int, payload: bytes) -> None:
        try:
            fd = os.open(files.fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as error:
            if error.errno in (errno.ENXIO, errno.ENOENT):
                raise ToolFailure(
                    f"Error: background command {pid} no longer takes input (its job host is gone)"
                ) from None
            raise ToolFailure(f"Error: cannot write to background command {pid}: {error.strerror}") from error
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                raise ToolFailure(f"Error: {files.fifo} is not the job's input FIFO")
            deadline = time.monotonic() + INPUT_TIMEOUT
            view = memoryview(payload)
            while view:
                try:
                    view = view[os.write(fd, view) :]
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise ToolFailure(
                            f"Error: background command {pid} is not reading its input: "
                            f"{len(payload) - len(view)} of {len(payload)} bytes were passed on"
                        ) from None
                    await asyncio.sleep(POLL_INTERVAL)
        finally:
            os.close(fd)


def _fit(data: bytes, budget: int, whole: bool) -> bytes:
    """The longest head of `data` whose text fits `budget` JSON bytes (escapes and replacement characters count),
    never ending inside a character unless it is the whole rest of the log."""
    if not whole:
        data = trim_incomplete_end(data)
    while data and (size := json_size(data.decode(errors="replace"))) > budget:
        data = trim_incomplete_end(data[: min(len(data) - 1, len(data) * budget // size)])
    return data


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[at : at + size] for at in range(0, len(data), size)] or [b""]
