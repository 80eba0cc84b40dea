"""The job host: the small process that holds one background command for its whole life.

The executor starts it (in a new session, as the agent user) with a JSON spec as its one argument, and reads one
line from its stdout: the command's pid and start ticks. The host then outlives the executor's calls, restarts
and, in production, the executor itself (its unit has KillMode=process):

- it never opens a file by name: the executor opens the job's log, state file and input FIFO (in its own saved-output
  directory, which a confined host may not write by path) and hands the descriptors over (`*_fd` in the spec);
- it is a child subreaper (PR_SET_CHILD_SUBREAPER): whatever the command leaves behind, even in a session of its
  own (`setsid cmd &`), is reparented to the host instead of to init, and the host lives, reaping them, until the
  last is gone. So the host's descendants are everything the job started, and stopping the job ends them all;

- it runs the command in a session of its own (so `terminal_kill` signals the command's group, never the host),
  with stdin from /dev/null, from a pipe, or from a pseudo-terminal (`mode`: none, stdin, pty);
- it copies the command's output (both streams, in order) into the log, up to `cap` bytes, then drops the rest
  (the command never blocks or dies on a full log);
- it keeps the job's recording in its events file (`events_fd`): each piece of output as it came, with its time
  and stream, and each input passed on, as JSON lines [seconds since the start, code, text] ("o" stdout, "e"
  stderr, "i" input, "m" a note of ours), then {"end": true} once it is done. At most `record_cap` bytes of output:
  the first half as it comes, then only the newest half, written at the end after a note of how much was left out
  (the executor's relay.py keeps a foreground call's the same way);
- it forwards what the executor writes to the job's FIFO (framed: b"D" + 4-byte length + data, or b"E" for end
  of input) to the command's stdin, or to the terminal;
- it appends the job's state to its state file, one JSON line each (running, then the exit status once the command
  has ended and its output is read): the last whole line is the state, so a reader never sees half of one.

It runs as `python3 -I -S jobhost.py SPEC`: standard library only, so it starts fast and small, and imports
nothing of the project (it may outlive an upgrade of the installed code).
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import errno
import fcntl
import functools
import json
import os
import selectors
import signal
import struct
import sys
import termios
import time
from collections import deque
from typing import Any

READ_CHUNK = 64 * 1024
INPUT_BUFFER = 1024 * 1024  # pending input past this is left in the FIFO: the executor's write waits, not our memory
DRAIN_GRACE = 0.5  # seconds the output may stay open after the command ended (held by what it left running)
FRAME_HEADER = struct.Struct(">cI")
PTY_ROWS, PTY_COLUMNS = 40, 160
PR_SET_CHILD_SUBREAPER = 36


def start_ticks(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat: with the pid, it names one process for its whole life."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        text = stat.read().decode("ascii", errors="replace")
    return int(text[text.rfind(")") + 1 :].split()[19])


def write_state(fd: int, state: dict[str, Any]) -> None:
    """One line appended (the executor opened the file O_APPEND): a reader takes the last whole line."""
    os.write(fd, (json.dumps(state) + "\n").encode())


PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 24, 47, 4
CAPABILITY_VERSION_3 = 0x20080522
LANDLOCK_RESTRICT_SELF = 446  # the same number on every architecture


def become_subreaper() -> None:
    """Orphaned descendants of the command are reparented to us, not to init: none escapes the job."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def handed_over(fd: int) -> int:
    """A descriptor the executor passed: ours alone, never the command's (it could forge the state)."""
    if fd >= 0:
        os.set_inheritable(fd, False)
    return fd


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def confine(sandbox: int) -> None:
    """In the forked child: bind it to the executor's Landlock ruleset `sandbox` (mcpserver/executor/landlock.py
    does the same for the executor's own threads; this file imports nothing of the project). Capabilities go
    first, then no_new_privs, then the ruleset; any refusal raises, and the command is not run."""
    libc = ctypes.CDLL(None, use_errno=True)
    zero, ulong = ctypes.c_ulong(0), ctypes.c_ulong
    libc.prctl(ctypes.c_int(PR_CAP_AMBIENT), ulong(PR_CAP_AMBIENT_CLEAR_ALL), zero, zero, zero)
    for number in range(64):
        if libc.prctl(ctypes.c_int(PR_CAPBSET_DROP), ulong(number), zero, zero, zero) < 0:
            break  # EINVAL past the last capability, or EPERM for a thread with none to drop
    data = (_CapData * 2)()
    steps = (
        ("capset", lambda: libc.capset(ctypes.byref(_CapHeader(CAPABILITY_VERSION_3, 0)), data)),
        ("no_new_privs", lambda: libc.prctl(ctypes.c_int(PR_SET_NO_NEW_PRIVS), ulong(1), zero, zero, zero)),
        ("landlock_restrict_self", lambda: libc.syscall(LANDLOCK_RESTRICT_SELF, sandbox, ctypes.c_uint32(0))),
    )
    for name, step in steps:
        if step() < 0:
            raise OSError(ctypes.get_errno(), f"{name} failed")
    os.close(sandbox)


def exec_command(command: str, stdin: int, output: int, errors: int, sandbox: int = -1) -> None:
    """In the forked child: a session of its own, the given descriptors as 0, 1 and 2, the sandbox of the
    credential's profile (`sandbox` a Landlock ruleset, -1 for none), then bash."""
    try:
        if sandbox >= 0:
            try:
                confine(sandbox)
            except OSError as error:
                os.write(errors, f"sandstorm: the command was not run: its sandbox failed: {error}\n".encode())
                os._exit(126)
        os.setsid()
        if os.isatty(stdin):
            fcntl.ioctl(stdin, termios.TIOCSCTTY, 0)
        os.dup2(stdin, 0)
        os.dup2(output, 1)
        os.dup2(errors, 2)
        for signum in (signal.SIGPIPE, signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)  # Python ignores SIGPIPE; bash must see the defaults
        os.execve("/bin/bash", ["bash", "-c", command], os.environ)
    finally:
        os._exit(127)


class Recorder:
    """The job's events file: output and input with their timing, at most `cap` bytes of output (head and tail)."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd = fd
        self.half = max(cap // 2, 1)
        self.began = time.monotonic()
        self.decoders = {code: codecs.getincrementaldecoder("utf-8")(errors="replace") for code in "oei"}
        self.head = 0
        self.tail: deque[tuple[list[Any], int]] = deque()
        self.tail_bytes = 0
        self.left_out = 0

    def at(self) -> float:
        return round(time.monotonic() - self.began, 3)

    def output(self, code: str, data: bytes) -> None:
        text = self.decoders[code].decode(data)
        if not text or self.fd < 0:
            return
        event = [self.at(), code, text]
        if self.head + len(data) <= self.half and not self.tail:
            self.head += len(data)
            self.write([event])
            return
        self.tail.append((event, len(data)))
        self.tail_bytes += len(data)
        while self.tail_bytes > self.half and len(self.tail) > 1:
            _old, size = self.tail.popleft()
            self.tail_bytes -= size
            self.left_out += size

    def input(self, data: bytes) -> None:
        """Input passed on: written at once, whatever the cap (the agent's input is what a reviewer looks for)."""
        text = self.decoders["i"].decode(data)
        if text:
            self.write([[self.at(), "i", text]])

    def note(self, text: str) -> None:
        self.write([[self.at(), "m", text]])

    def finish(self) -> None:
        for code in "oe":
            rest = self.decoders[code].decode(b"", final=True)
            if rest:
                self.tail.append(([self.at(), code, rest], len(rest.encode())))
        events = [event for event, _size in self.tail]
        if self.left_out:
            first = events[0][0] if events else self.at()
            events.insert(0, [first, "m", f"[{self.left_out} bytes of output left out here]"])
        self.write(events)
        self.tail.clear()
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.write(self.fd, b'{"end": true}\n')

    def write(self, events: list[list[Any]]) -> None:
        if self.fd < 0 or not events:
            return
        data = b"".join(json.dumps(event, ensure_ascii=False).encode() + b"\n" for event in events)
        try:
            os.write(self.fd, data)
        except OSError:  # a full disk: the command runs on, unrecorded from here
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


class Host:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.mode: str = spec["mode"]
        self.cap: int = spec["cap"]
        self.log = handed_over(spec["log_fd"])
        self.state_fd = handed_over(spec["state_fd"])
        self.sandbox = handed_over(spec.get("sandbox_fd", -1))  # the command's Landlock ruleset, -1: none
        self.recorder = Recorder(handed_over(spec.get("events_fd", -1)), spec.get("record_cap", self.cap))
        self.written = 0
        self.cut = False
        # Opened for reading and writing by the executor: it never reads as ended when the executor closes its end.
        self.fifo = handed_over(spec["fifo_fd"]) if self.mode != "none" else -1
        self.frames = b""
        self.pending = b""
        self.eof_asked = False
        self.selector = selectors.DefaultSelector()
        self.status: int | None = None
        self.children_left = True  # until waitpid says there are none: the command, or what it left behind
        self.outputs: dict[int, str] = {}  # the command's output we read: descriptor -> stream code

    def start(self) -> None:
        stdin_target = ""
        if self.mode == "pty":
            master, slave = os.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", PTY_ROWS, PTY_COLUMNS, 0, 0))
            stdin_target = os.ttyname(slave)
            child_in, child_out, child_err = slave, slave, slave
            self.outputs, self.stdin = {master: "o"}, os.dup(master)
        else:
            stdout, child_out = os.pipe()
            stderr, child_err = os.pipe()
            self.outputs = {stdout: "o", stderr: "e"}
            if self.mode == "stdin":
                child_in, self.stdin = os.pipe()
                stdin_target = f"pipe:[{os.fstat(child_in).st_ino}]"
            else:
                child_in, self.stdin = os.open(os.devnull, os.O_RDONLY), -1
        self.recorder.began = time.monotonic()
        self.pid = os.fork()
        if self.pid == 0:
            exec_command(self.spec["command"], child_in, child_out, child_err, self.sandbox)
        for fd in {child_in, child_out, child_err}:
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
        write_state(self.state_fd, self.state)
        os.write(1, f"{self.pid} {self.ticks}\n".encode())
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            os.dup2(devnull, fd)  # the executor reads until end of file: it has its answer
        os.close(devnull)

    def run(self) -> None:
        for fd in self.outputs:
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ, functools.partial(self.copy_output, fd))
        self.selector.register(self.child_signals(), selectors.EVENT_READ, self.reap_children)
        if self.stdin >= 0:
            os.set_blocking(self.stdin, False)
            self.selector.register(self.fifo, selectors.EVENT_READ, self.read_fifo)
        self.reap_children()  # it may have ended before SIGCHLD was caught
        drain_until: float | None = None
        while self.outputs or self.status is None or self.children_left:
            recorded = "exit_code" in self.state
            timeout = None if drain_until is None or recorded else max(0.0, drain_until - time.monotonic())
            for key, _mask in self.selector.select(timeout):
                key.data()
            if self.status is not None and drain_until is None:
                drain_until = time.monotonic() + DRAIN_GRACE
            if drain_until is not None and time.monotonic() >= drain_until and "exit_code" not in self.state:
                self.record_exit()  # the output stays open (something the command left holds it): say so now
        if "exit_code" not in self.state:
            self.record_exit()
        self.recorder.finish()

    def child_signals(self) -> int:
        """A pipe that becomes readable at each SIGCHLD (the command's end, or an adopted orphan's)."""
        readable, writable = os.pipe()
        for fd in (readable, writable):
            os.set_blocking(fd, False)
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)  # caught (not ignored), so the wake-up fd hears it
        signal.set_wakeup_fd(writable)
        self.wakeups = readable
        return readable

    def reap_children(self) -> None:
        """Reap every child that has ended: the command (its status is the job's), and orphans we adopted."""
        with contextlib.suppress(BlockingIOError):
            os.read(self.wakeups, 4096)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children_left = False
                return
            if pid == 0:
                return
            if pid == self.pid:
                self.status = status

    def copy_output(self, fd: int) -> None:
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError as error:
            if error.errno != errno.EIO:  # EIO: every holder of the terminal is gone, as end of file
                raise
            data = b""
        if not data:
            self.selector.unregister(fd)
            os.close(fd)
            del self.outputs[fd]
            return
        self.recorder.output(self.outputs[fd], data)
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
                self.recorder.input(body)
            elif kind == b"E":
                self.eof_asked = True
                self.recorder.note("[end of input]")
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
        if self.stdin < 0 or self.fifo < 0:
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
        if self.fifo >= 0:
            # Before the state says so: whoever reads "exited" finds the FIFO without a reader, not a silent one.
            if self.fifo in self.selector.get_map():
                self.selector.unregister(self.fifo)
            os.close(self.fifo)
            self.fifo = -1
        write_state(self.state_fd, self.state)


def main() -> None:
    spec = json.loads(sys.argv[1])
    for signum in (signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)  # the host ends when its command has, not with a terminal
    become_subreaper()
    host = Host(spec)
    host.start()
    host.run()


if __name__ == "__main__":
    main()
