"""Running commands: bounded output capture, timeouts, cancellation, and signals to background processes.

Every command runs in a new session (its own process group), so a timeout, a cancelled call or `terminal_kill`
can signal the whole group: the command, and anything it started, with no child left behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
from collections.abc import Callable
from dataclasses import dataclass

from mcpserver.executor.capture import StreamCapture, spill_stem
from mcpserver.executor.interface import ExecResult, OutputListener, ToolFailure
from mcpserver.executor.paths import Workspace
from mcpserver.executor.relay import DEFAULT_CAP, OutputRelay
from mcpserver.executor.savedoutput import SavedOutput
from mcpserver.executor.spawn import Spawned, spawn

logger = logging.getLogger(__name__)

TERM_GRACE = 2.0  # seconds between SIGTERM and SIGKILL
PIPE_GRACE = 0.5  # how long pipes may stay open after the command exits (held by something it backgrounded)
KILL_WAIT = 5.0  # how long to wait for a SIGKILLed process to be gone before giving up on it
TIMEOUT_EXIT_CODE = 124
TOO_MANY_TASKS = "too many processes for this user (the limit is SANDSTORM_TOOL_MAX_PROCESSES)"

# Told the pid and start ticks of a command as soon as it runs (so its group can be ended if we die mid-call).
SpawnListener = Callable[[int, int], None]


def kill_group(pgid: int, signum: int) -> None:
    """Signal a process group we started; a group that is already gone is fine."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass
    except PermissionError:
        logger.warning("not allowed to signal process group %d", pgid)


async def _wait_for(future: asyncio.Future[None], timeout: float) -> bool:
    """Whether `future` finished within `timeout` seconds (it is never cancelled by the wait)."""
    done, _ = await asyncio.wait({future}, timeout=timeout)
    return bool(done)


async def _supervise(child: Spawned, timeout: float, stop: asyncio.Future[None] | None = None) -> bool:
    """Wait for the command and its pipes; on timeout (or `stop`), end its group. Returns whether it timed out."""
    if stop is None:
        timed_out = not await _wait_for(child.exited, timeout)
    else:
        done, _ = await asyncio.wait({child.exited, stop}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        timed_out = not done
    if not child.exited.done():
        kill_group(child.pid, signal.SIGTERM)
        if not await _wait_for(child.exited, TERM_GRACE):
            kill_group(child.pid, signal.SIGKILL)
            await _wait_for(child.exited, KILL_WAIT)
    if not await _wait_for(child.pipes_closed, PIPE_GRACE):
        kill_group(child.pid, signal.SIGKILL)  # what the command left running in the background still holds the pipes
        await _wait_for(child.pipes_closed, KILL_WAIT)
    return timed_out


def _abandon(child: Spawned) -> None:
    """The call was cancelled: end the group now, SIGKILL what is left later, and let go of the pipes.

    Nothing here may await: the task running it is being cancelled. The process is still reaped when it ends.
    """
    kill_group(child.pid, signal.SIGTERM)
    child.close_pipes()
    asyncio.get_running_loop().call_later(TERM_GRACE, kill_group, child.pid, signal.SIGKILL)


def _exit_code(child: Spawned, timed_out: bool) -> int:
    if timed_out:
        return TIMEOUT_EXIT_CODE
    code = child.returncode
    if code is None:
        return -1  # still running after SIGKILL (e.g. stuck in the kernel); we stopped waiting for it
    return 128 - code if code < 0 else code  # killed by signal N: 128+N, as a shell reports it


def _sink(streams: dict[int, StreamCapture], relay: OutputRelay | None) -> Callable[[int, bytes], None]:
    def take(number: int, data: bytes) -> None:
        streams[number].feed(data)
        if relay is not None:
            relay.feed(number, data)

    return take


async def run_process(
    argv: list[str],
    *,
    cwd: str,
    env: dict[str, str],
    timeout: float,
    output_budget: int,
    listener: OutputListener | None,
    saved: SavedOutput,
    label: str,
    on_spawn: SpawnListener | None = None,
    listen_max_bytes: int = DEFAULT_CAP,
) -> ExecResult:
    """Run `argv` (no shell) in its own process group, keeping at most `output_budget` bytes of its output."""
    if not os.path.isdir(cwd):
        raise ToolFailure(f"Error: {cwd}: Not a directory")
    loop = asyncio.get_running_loop()
    # Unguessable: the name is what lets its reader page through it (terminal_output), and only the result holds it.
    stem = spill_stem(label) + secrets.token_hex(12)
    streams = {fd: StreamCapture(name, output_budget, saved, stem) for fd, name in ((1, "stdout"), (2, "stderr"))}
    relay = OutputRelay(listener, listen_max_bytes) if listener is not None else None
    started = loop.time()
    try:
        try:
            child = spawn(argv, cwd, env, _sink(streams, relay))
        except FileNotFoundError as error:
            raise ToolFailure(f"Error: {argv[0]} is not installed") from error
        except PermissionError as error:
            raise ToolFailure(f"Error: {argv[0]}: Permission denied") from error
        except BlockingIOError as error:
            raise ToolFailure(f"Error: cannot start {argv[0]}: {TOO_MANY_TASKS}") from error
        if on_spawn is not None:
            on_spawn(child.pid, read_start_ticks(child.pid) or 0)
        try:
            timed_out = await _supervise(child, timeout)
        except asyncio.CancelledError:
            _abandon(child)
            raise
        child.close_pipes()  # still open only if something the command left behind holds them past KILL_WAIT
        if relay is not None:
            await relay.finish()  # all of the output, the last line before the exit included, before the result
    finally:
        if relay is not None:
            relay.stop()
        for stream in streams.values():
            stream.close()
    return _result(streams, child, timed_out, timeout, int((loop.time() - started) * 1000))


def _result(
    streams: dict[int, StreamCapture],
    child: Spawned,
    timed_out: bool,
    timeout: float,
    duration_ms: int,
) -> ExecResult:
    stderr = streams[2].text()
    if timed_out:
        stderr += ("" if not stderr or stderr.endswith("\n") else "\n") + f"timeout after {timeout:g}s"
    spilled = [stream.path for stream in streams.values() if stream.path is not None]
    return ExecResult(
        stdout=streams[1].text(),
        stderr=stderr,
        exit_code=_exit_code(child, timed_out),
        timed_out=timed_out,
        truncated=any(stream.cut for stream in streams.values()),
        duration_ms=duration_ms,
        output_path=str(spilled[0]) if spilled else None,  # stdout's file if it has one
        stdout_bytes=streams[1].total,
        stderr_bytes=streams[2].total,
    )


@dataclass(frozen=True)
class Collected:
    """What `collect_output` kept of a command's output, and how the command ended."""

    output: bytes  # stdout and stderr as they were written, at most the cap
    cut: bool  # it wrote more than the cap: the rest was dropped and its group ended
    timed_out: bool
    returncode: int | None  # as subprocess reports it; None if it outlived even SIGKILL


class _Collector:
    """A sink keeping the first `cap` bytes; past them, `overflowed` is done and the rest is dropped."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.chunks: list[bytes] = []
        self.size = 0
        self.overflowed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def feed(self, _number: int, data: bytes) -> None:
        if self.overflowed.done():
            return
        room = self.cap - self.size
        self.chunks.append(data[:room])
        self.size += min(len(data), room)
        if len(data) > room:
            self.overflowed.set_result(None)


async def collect_output(
    argv: list[str],
    *,
    env: dict[str, str],
    timeout: float,
    cap: int,
    pass_fds: tuple[int, ...] = (),
    cwd: str | None = None,
) -> Collected:
    """Run `argv` (no shell) as commands are run, both streams together, keeping at most `cap` bytes of them.

    For the executor's own helper commands, whose whole output is their result: nothing is saved to a file. A
    command that writes more than `cap`, or outlives `timeout`, has its group ended as a timed-out command does.
    Raises what `spawn` raises for a program that cannot be started.
    """
    collector = _Collector(cap)
    child = spawn(argv, cwd, env, collector.feed, merge_stderr=True, pass_fds=pass_fds)
    try:
        timed_out = await _supervise(child, timeout, collector.overflowed)
    except asyncio.CancelledError:
        _abandon(child)
        raise
    child.close_pipes()
    return Collected(b"".join(collector.chunks), collector.overflowed.done(), timed_out, child.returncode)


def read_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks since boot), or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read().decode("ascii", errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rfind(")") + 1 :].split()  # the name (field 2) may itself hold spaces and parentheses
    # fields[0] is field 3 (the state), so field 22 is fields[19]
    return int(fields[19]) if len(fields) > 19 else None


class ProcessOps:
    """The executor's process tools. Expects `self.workspace`, `self.root` and `self.env` (see LocalExecutor)."""

    workspace: Workspace
    root: str
    env: dict[str, str]
    saved_output: SavedOutput

    def _working_dir(self, cwd: str | None) -> str:
        directory = self.workspace.resolve(cwd)
        if not directory.is_dir():
            raise ToolFailure(f"Error: {cwd}: Not a directory")
        return str(directory)

    async def run_command(
        self,
        command: str,
        cwd: str | None,
        timeout: float,
        output_budget: int,
        listener: OutputListener | None,
        listen_max_bytes: int = DEFAULT_CAP,
        on_spawn: SpawnListener | None = None,
    ) -> ExecResult:
        return await run_process(
            ["/bin/bash", "-c", command],
            cwd=self._working_dir(cwd),
            env=self.env,
            timeout=timeout,
            output_budget=output_budget,
            listener=listener,
            saved=self.saved_output,
            label="exec",
            on_spawn=on_spawn,
            listen_max_bytes=listen_max_bytes,
        )

    async def process_start_ticks(self, pid: int) -> int | None:
        return read_start_ticks(pid)

    async def signal_group(self, pid: int, pgid: int, start_ticks: int, signum: int) -> bool:
        """Signal the group only if `pid` is still the very process that was started (never a reused PID)."""
        if pid <= 0 or pgid <= 0 or read_start_ticks(pid) != start_ticks:
            return False
        try:
            if os.getpgid(pid) != pgid:
                return False
            os.killpg(pgid, signum)
        except ProcessLookupError:
            return False
        except PermissionError:
            logger.warning("not allowed to signal process group %d", pgid)
            return False
        return True
