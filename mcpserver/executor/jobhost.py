"""The job host: the small process that holds one background command for its whole life.

The executor starts it (in a new session, as the agent user) with a JSON spec as its one argument, and reads one
line from its stdout: the command's pid and start ticks. The host then outlives the executor's calls, restarts
and, in production, the executor itself (its unit has KillMode=process):

- it runs the command in a session of its own (so `terminal_kill` signals the command's group, never the host),
  with stdin from /dev/null, from a pipe, or from a pseudo-terminal (`mode`: none, stdin, pty);
- it copies the command's output (both streams, in order) into the log, up to `cap` bytes, then drops the rest
  (the command never blocks or dies on a full log);
- it forwards what the executor writes to the job's FIFO (framed: b"D" + 4-byte length + data, or b"E" for end
  of input) to the command's stdin, or to the terminal;
- it writes the job's state file (atomically, JSON): running, then the exit status once the command has ended and
  its output is read.

It runs as `python3 -I -S jobhost.py SPEC`: standard library only, so it starts fast and small, and imports
nothing of the project (it may outlive an upgrade of the installed code).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import selectors
import signal
import struct
import sys
import termios
import time
from typing import Any

READ_CHUNK = 64 * 1024
INPUT_BUFFER = 1024 * 1024  # pending input past this is left in the FIFO: the executor's write waits, not our memory
DRAIN_GRACE = 0.5  # seconds the output may stay open after the command ended (held by what it left running)
POLL_WITHOUT_PIDFD = 0.1  # seconds
FRAME_HEADER = struct.Struct(">cI")
PTY_ROWS, PTY_COLUMNS = 40, 160


def start_ticks(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat: with the pid, it names one process for its whole life."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        text = stat.read().decode("ascii", errors="replace")
    return int(text[text.rfind(")") + 1 :].split()[19])


def write_state(path: str, state: dict[str, Any]) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as out:
        json.dump(state, out)
    os.replace(temporary, path)


def exec_command(command: str, stdin: int, output: int) -> None:
    """In the forked child: a session of its own, the given descriptors as 0, 1 and 2, then bash."""
    try:
        os.setsid()
        if os.isatty(stdin):
            fcntl.ioctl(stdin, termios.TIOCSCTTY, 0)
        os.dup2(stdin, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        for signum in (signal.SIGPIPE, signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)  # Python ignores SIGPIPE; bash must see the defaults
        os.execve("/bin/bash", ["bash", "-c", command], os.environ)
    finally:
        os._exit(127)


class Host:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.mode: str = spec["mode"]
        self.cap: int = spec["cap"]
        self.log = os.open(spec["log"], os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.written = 0
        self.cut = False
        self.fifo = -1
        if self.mode != "none":
            # Opened for reading and writing: it never reads as ended when the executor closes its end.
            self.fifo = os.open(spec["fifo"], os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.frames = b""
        self.pending = b""
        self.eof_asked = False
        self.selector = selectors.DefaultSelector()
        self.status: int | None = None

    def start(self) -> None:
        stdin_target = ""
        if self.mode == "pty":
            master, slave = os.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", PTY_ROWS, PTY_COLUMNS, 0, 0))
            stdin_target = os.ttyname(slave)
            child_in, child_out = slave, slave
            self.output, self.stdin = master, os.dup(master)
        else:
            self.output, child_out = os.pipe()
            if self.mode == "stdin":
                child_in, self.stdin = os.pipe()
                stdin_target = f"pipe:[{os.fstat(child_in).st_ino}]"
            else:
                child_in, self.stdin = os.open(os.devnull, os.O_RDONLY), -1
        self.pid = os.fork()
        if self.pid == 0:
            exec_command(self.spec["command"], child_in, child_out)
        for fd in {child_in, child_out}:
            os.close(fd)
        self.ticks = start_ticks(self.pid)
        self.state: dict[str, Any] = {
            "state": "running",
            "pid": self.pid,
            "start_ticks": self.ticks,
            "host_pid": os.getpid(),
            "host_ticks": start_ticks(os.getpid()),
            "mode": self.mode,
            "stdin_target": stdin_target,
            "started": time.time(),
        }
        write_state(self.spec["state"], self.state)
        os.write(1, f"{self.pid} {self.ticks}\n".encode())
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            os.dup2(devnull, fd)  # the executor reads until end of file: it has its answer
        os.close(devnull)

    def run(self) -> None:
        os.set_blocking(self.output, False)
        self.selector.register(self.output, selectors.EVENT_READ, self.copy_output)
        try:
            exited = os.pidfd_open(self.pid)
        except OSError:  # no pidfds (old kernel, seccomp): look for the command's end between waits
            exited = -1
        else:
            self.selector.register(exited, selectors.EVENT_READ, lambda: self.reap(exited))
        if self.stdin >= 0:
            os.set_blocking(self.stdin, False)
            self.selector.register(self.fifo, selectors.EVENT_READ, self.read_fifo)
        drain_until: float | None = None
        while self.output >= 0 or self.status is None:
            recorded = "exit_code" in self.state
            timeout = None if drain_until is None or recorded else max(0.0, drain_until - time.monotonic())
            if exited < 0 and self.status is None:
                timeout = POLL_WITHOUT_PIDFD
            for key, _mask in self.selector.select(timeout):
                key.data()
            if exited < 0 and self.status is None:
                reaped, status = os.waitpid(self.pid, os.WNOHANG)
                self.status = status if reaped else None
            if self.status is not None and drain_until is None:
                drain_until = time.monotonic() + DRAIN_GRACE
            if drain_until is not None and time.monotonic() >= drain_until and "exit_code" not in self.state:
                self.record_exit()  # the output stays open (something the command left holds it): say so now
        if "exit_code" not in self.state:
            self.record_exit()

    def copy_output(self) -> None:
        try:
            data = os.read(self.output, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError as error:
            if error.errno != errno.EIO:  # EIO: every holder of the terminal is gone, as end of file
                raise
            data = b""
        if not data:
            self.selector.unregister(self.output)
            os.close(self.output)
            self.output = -1
            return
        room = self.cap - self.written
        try:
            if room > 0:
                self.written += os.write(self.log, data[:room])
            if len(data) > room and not self.cut:
                self.cut = True
                os.write(self.log, f"\n[log cut at {self.cap} bytes]\n".encode())
        except OSError:  # a full disk, or the log's file system gone: the command runs on, its output unlogged
            self.cap, self.cut = self.written, True

    def read_fifo(self) -> None:
        try:
            self.frames += os.read(self.fifo, READ_CHUNK)
        except BlockingIOError:
            return
        while len(self.frames) >= FRAME_HEADER.size:
            kind, length = FRAME_HEADER.unpack_from(self.frames)
            if len(self.frames) < FRAME_HEADER.size + length:
                break
            body = self.frames[FRAME_HEADER.size : FRAME_HEADER.size + length]
            self.frames = self.frames[FRAME_HEADER.size + length :]
            if kind == b"D":
                self.pending += body
            elif kind == b"E":
                self.eof_asked = True
        self.write_input()

    def write_input(self) -> None:
        if self.stdin < 0:
            self.pending = b""
            return
        if self.eof_asked and self.mode == "pty" and not self.pending.endswith(b"\x04"):
            self.pending += b"\x04"  # end of input on a terminal is its EOF character, Ctrl-D
            self.eof_asked = False
        try:
            while self.pending:
                self.pending = self.pending[os.write(self.stdin, self.pending) :]
        except BlockingIOError:
            pass
        except OSError as error:
            if error.errno not in (errno.EPIPE, errno.EIO):
                raise
            self.pending, self.eof_asked = b"", True  # the command closed its stdin: nothing more reaches it
        self.watch_input()

    def watch_input(self) -> None:
        """Write when the command can take more; read the FIFO only while little is waiting to be written."""
        if self.stdin < 0:
            return
        stdin_key = self.selector.get_map().get(self.stdin)
        if self.pending and stdin_key is None:
            self.selector.register(self.stdin, selectors.EVENT_WRITE, self.write_input)
        elif not self.pending and stdin_key is not None:
            self.selector.unregister(self.stdin)
        fifo_watched = self.fifo in self.selector.get_map()
        if len(self.pending) >= INPUT_BUFFER and fifo_watched:
            self.selector.unregister(self.fifo)
        elif len(self.pending) < INPUT_BUFFER and not fifo_watched:
            self.selector.register(self.fifo, selectors.EVENT_READ, self.read_fifo)
        if not self.pending and self.eof_asked and self.mode != "pty":
            if self.fifo in self.selector.get_map():
                self.selector.unregister(self.fifo)
            os.close(self.stdin)
            self.stdin = -1

    def reap(self, exited: int) -> None:
        self.selector.unregister(exited)
        os.close(exited)
        _, self.status = os.waitpid(self.pid, 0)

    def record_exit(self) -> None:
        status = self.status
        if status is None:
            return
        signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        self.state.update(
            state="killed" if signum else "exited",
            exit_code=os.waitstatus_to_exitcode(status) if signum is None else 128 + signum,
            signal=signum,
            ended=time.time(),
            output_bytes=self.written,
        )
        if self.mode != "none":
            # Before the state says so: whoever reads "exited" finds no FIFO to write to, not a silent one.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.spec["fifo"])
        write_state(self.spec["state"], self.state)


def main() -> None:
    spec = json.loads(sys.argv[1])
    for signum in (signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)  # the host ends when its command has, not with a terminal
    host = Host(spec)
    host.start()
    host.run()


if __name__ == "__main__":
    main()
