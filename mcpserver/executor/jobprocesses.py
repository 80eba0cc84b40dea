"""The processes of a background job, read from /proc: whether it is the one the registry names, what it started
(in its session, and below its subreaping host), signalling them, and whether one waits to read the job's input."""

from __future__ import annotations

import os
import platform
import termios
from collections.abc import Iterator
from pathlib import Path

from mcpserver.executor.processes import read_start_ticks

READ_SYSCALL = {"x86_64": 0, "aarch64": 63}.get(platform.machine())
TTY_READ_WCHANS = frozenset({"n_tty_read", "wait_woken"})
PIPE_READ_WCHANS = frozenset({"pipe_read", "anon_pipe_read", "pipe_wait"})


def alive(pid: int, ticks: int) -> bool:
    return pid > 0 and read_start_ticks(pid) == ticks


def _stats() -> Iterator[tuple[int, list[str]]]:
    """Each live process and the fields of its /proc/<pid>/stat after the command name (state first)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat_file:
                text = stat_file.read().decode("ascii", errors="replace")
        except OSError:
            continue
        yield int(entry.name), text[text.rfind(")") + 1 :].split()


def session_members(session: int) -> list[int]:
    """The processes of `session` (field 6 of /proc/<pid>/stat): a job's command and all it started there."""
    return [pid for pid, fields in _stats() if len(fields) > 3 and fields[3] == str(session)]


def children_of_each() -> dict[int, list[int]]:
    """Each process's children, from field 4 of /proc/<pid>/stat; zombies (ended, to be reaped) left out."""
    children: dict[int, list[int]] = {}
    for pid, fields in _stats():
        if len(fields) > 1 and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(pid)
    return children


def descendants(root: int) -> list[int]:
    """Every live process below `root`: for a job host (a subreaper), all that its command started, even in
    sessions of their own."""
    children, found, todo = children_of_each(), [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def send_signal(pid: int, signum: int, group: bool = False) -> bool:
    """Whether the signal was sent; a process gone meanwhile, or not ours to signal (sudo's), is not an error."""
    try:
        (os.killpg if group else os.kill)(pid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def reads_from(pid: int, target: str) -> bool:
    """Whether `pid` sleeps in a read of `target` (the job's terminal, or its stdin pipe).

    /proc/<pid>/syscall names the call and its descriptor; where it cannot be read (a process of another user,
    such as sudo), the kernel function it sleeps in, with its stdin being `target`, stands in.
    """
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
        if READ_SYSCALL is not None and fields and fields[0] == str(READ_SYSCALL):
            return os.readlink(f"/proc/{pid}/fd/{int(fields[1], 16)}") == target
        if fields and fields[0] != "running":
            return False
    except (OSError, ValueError, IndexError):
        pass
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
        reading = TTY_READ_WCHANS if target.startswith("/dev/") else PIPE_READ_WCHANS
        return wchan in reading and os.readlink(f"/proc/{pid}/fd/0") == target
    except OSError:
        return False


def echo_off(tty: str) -> bool:
    """Whether the job's terminal has echo turned off, as a password prompt does it (sudo, ssh, passwd): the sign
    that is left when the prompting program runs as another user, whose /proc entries cannot be read."""
    try:
        fd = os.open(tty, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return not termios.tcgetattr(fd)[3] & termios.ECHO
    except termios.error:
        return False
    finally:
        os.close(fd)
