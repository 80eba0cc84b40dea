"""A command's process, watched from the event loop without threads: its two output pipes, and a pidfd for its end.

Every process the executor starts is started here (`spawn`), in the sandbox of the call's confinement profile
(confinement.py) and the cgroup of its credential (credential_groups.py), with the tool limits (rlimits.py) pinned
in it.

asyncio's subprocess transport (Python 3.11) starts a thread per process to wait for it, connects each pipe through
a transport and a protocol, and takes several turns of the event loop to start a command and to finish it, a cost
a short command notices. Here the loop reads the pipes and the pidfd itself: one `os.read` per chunk of output, one
`waitpid` once the pidfd says the process has ended. Where pidfds are not available (Linux before 5.3, or a seccomp
filter without pidfd_open), a thread from the loop's default pool waits instead.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable

from mcpserver.executor import confinement, credential_groups, rlimits

READ_CHUNK = 64 * 1024
OutputSink = Callable[[int, bytes], None]  # (1 for stdout or 2 for stderr, a chunk of it)

# Started processes not reaped yet, held here so that one whose call was abandoned is still reaped when it ends.
_unreaped: set[Spawned] = set()


class Spawned:
    """A started command: its output goes to `sink` as it comes; `exited` and `pipes_closed` tell when it is over.

    It is reaped when it ends, whether or not anyone still waits for it.
    """

    def __init__(self, process: subprocess.Popen[bytes], pipes: dict[int, int], sink: OutputSink) -> None:
        self._loop = asyncio.get_running_loop()
        self.process = process
        self.pid = process.pid
        self.exited: asyncio.Future[None] = self._loop.create_future()
        self.pipes_closed: asyncio.Future[None] = self._loop.create_future()
        self._sink = sink
        self._pipes = dict(pipes)  # stream number (1, 2) -> our read end of its pipe
        for number, fd in self._pipes.items():
            os.set_blocking(fd, False)
            self._loop.add_reader(fd, self._read, number)
        if not self._pipes:
            self.pipes_closed.set_result(None)
        _unreaped.add(self)
        self._pidfd = self._watch_exit()

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def close_pipes(self) -> None:
        """Stop reading output (what is still unread is dropped); `pipes_closed` is then done."""
        for number in list(self._pipes):
            self._close_pipe(number)

    def _read(self, number: int) -> None:
        try:
            data = os.read(self._pipes[number], READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""  # a pipe that fails to read is at its end for us
        if data:
            self._sink(number, data)
        else:
            self._close_pipe(number)

    def _close_pipe(self, number: int) -> None:
        fd = self._pipes.pop(number)
        self._loop.remove_reader(fd)
        os.close(fd)
        if not self._pipes and not self.pipes_closed.done():
            self.pipes_closed.set_result(None)

    def _watch_exit(self) -> int | None:
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError:
            waiting = self._loop.run_in_executor(None, self.process.wait)
            waiting.add_done_callback(lambda _: self._ended())
            return None
        self._loop.add_reader(pidfd, self._reap)
        return pidfd

    def _reap(self) -> None:
        assert self._pidfd is not None
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = None
        self.process.wait()  # the pidfd is readable: the process has ended, so this returns at once
        self._ended()

    def _ended(self) -> None:
        _unreaped.discard(self)
        if not self.exited.done():
            self.exited.set_result(None)


def spawn(
    argv: list[str],
    cwd: str | None,
    env: dict[str, str],
    sink: OutputSink | None,
    *,
    merge_stderr: bool = False,
    pass_fds: tuple[int, ...] = (),
) -> Spawned:
    """Start `argv` (no shell) in a new session (its own process group), stdin from /dev/null, output to `sink`.

    `sink` None: no output is read (both streams go to /dev/null). `cwd` None: the executor's own. `merge_stderr`: both streams through one pipe, in the order they were written
    (all of it reaches `sink` as stream 1). `pass_fds`: descriptors the command inherits, at the same numbers.
    Raises what subprocess.Popen raises for a program that cannot be started (FileNotFoundError, PermissionError).
    """
    pipes: dict[int, int] = {}  # stream number -> our read end
    ends: list[int] = []  # the child's write ends, closed here once it has its own copies
    stdout = stderr = subprocess.DEVNULL
    if sink is not None:
        pipes[1], stdout = os.pipe()
        ends.append(stdout)
        if merge_stderr:
            stderr = stdout
        else:
            pipes[2], stderr = os.pipe()
            ends.append(stderr)
    profile, sandboxes, groups = confinement.PROFILE.get(), confinement.active(), credential_groups.active()
    env = sandboxes.environment(profile, env)

    def start() -> subprocess.Popen[bytes]:
        return groups.placed(lambda: sandboxes.start(profile, lambda: _popen(argv, cwd, env, stdout, stderr, pass_fds)))

    rlimits.keeper.before_spawn()
    try:
        try:
            process = start()
        except BlockingIOError:  # EAGAIN: the host's tasks grew past our last reading of them
            rlimits.keeper.refresh_now()
            process = start()
    except BaseException:
        for fd in pipes.values():
            os.close(fd)
        raise
    finally:
        for fd in ends:  # the pipes end when the child (and what it started) let go of its copies
            os.close(fd)
    rlimits.keeper.pin(process.pid)
    return Spawned(process, pipes, sink or _discard)


def _discard(_number: int, _data: bytes) -> None:
    """The sink of a process whose output is not read (it has no pipes, so this is never called)."""


def _popen(
    argv: list[str], cwd: str | None, env: dict[str, str], stdout: int, stderr: int, pass_fds: tuple[int, ...]
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
        cwd=cwd,
        env=env,
        pass_fds=pass_fds,
    )
