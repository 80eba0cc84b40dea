"""Development mode: the server runs the executor as its own child process, under the same OS user.

Same code path as production (a separate process, the same socket protocol), minus the second user. The child is
restarted when it has died, and exits by itself when the server does (it watches its stdin, a pipe from us).

It has no socket file: a process of the same user (any command an agent runs) could connect to one, and the peer
check cannot tell it from the server. Instead the child inherits one end of a socket pair, its channel; each
connection is a fresh socket pair whose other end the server sends down the channel (SCM_RIGHTS). Nothing in the
filesystem or the abstract namespace leads to it, and no tool process inherits the channel (close-on-exec). Only
a process that can take descriptors from the server or the child (ptrace, pidfd_getfd: the same user can) gets in.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from mcpserver.executor import wire
from mcpserver.executor.handover import READY
from mcpserver.executor.remote import RemoteExecutor

logger = logging.getLogger(__name__)

START_DEADLINE = 20.0
START_POLL = 0.01  # seconds between checks that a starting child listens
LOST_WAIT = 2.0  # how long a child that stopped serving may take to exit before it is killed (the next call waits)
EXIT_POLL = 0.02  # seconds between checks that such a child has exited
ADDRESS = "the development executor's private channel"  # named in messages where a socket path would be


class ExecutorChild:
    def __init__(self, workspace: str, env_allow: Iterable[str] = (), limits: Iterable[str] = ()) -> None:
        self.workspace = workspace
        self._allowed = tuple(env_allow)
        self.env_allow = ",".join(self._allowed)
        self.limits = tuple(limits)  # e.g. ("--max-processes", "1024"): __main__'s options, from the settings
        self._process: subprocess.Popen[bytes] | None = None
        self._channel: socket.socket | None = None  # our end; connections go down it
        self._lock = threading.Lock()
        self._listening = False  # whether the current child has answered once
        self._losses = 0  # calls that lost their connection
        self._settled = 0  # of those, how many the next call has looked into (_settle)
        self.restarts = 0
        atexit.register(self.stop)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _spawn(self) -> bool:
        """Start the child unless one is running. True if it was (re)started."""
        with self._lock:
            if self.alive():
                return False
            if self._process is not None:
                self.restarts += 1
                logger.warning(
                    "the tool executor (pid %d) exited with %s; restarting it",
                    self._process.pid,
                    self._process.returncode,
                )
            self._listening = False
            if self._channel is not None:
                self._channel.close()
            # SEQPACKET: one message per handed-over connection, never merged or split.
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            argv = [
                sys.executable, "-m", "mcpserver.executor",
                "--channel-fd", str(theirs.fileno()), "--workspace", self.workspace,
                "--allow-uid", str(os.getuid()), "--env-allow", self.env_allow, *self.limits, "--watch-stdin",
            ]  # fmt: skip
            try:
                self._process = self._popen(argv, theirs.fileno())
            finally:
                theirs.close()  # the child's now; holding it would keep the channel open after the child died
            ours.setblocking(False)
            self._channel = ours
            return True

    def _popen(self, argv: list[str], channel: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            cwd=str(Path(__file__).resolve().parents[2]),
            env=self._child_env(),
            pass_fds=(channel,),
        )

    def _child_env(self) -> dict[str, str]:
        """Not the server's environment, which holds tokens and passwords: only what the executor and tools need."""
        names = {"PATH", "LANG", "LC_ALL", "TZ", "SANDSTORM_LOG_FORMAT", *self._allowed}
        return {name: value for name, value in os.environ.items() if name in names}

    def _answers(self) -> bool:
        """Whether the child said on the channel that it serves (it does so once, when it is ready)."""
        channel = self._channel
        if channel is None:
            return False
        poller = select.poll()
        poller.register(channel.fileno(), select.POLLIN)
        if not poller.poll(0):
            return False
        try:
            return channel.recv(1) == READY
        except (BlockingIOError, ConnectionError):
            return False

    def connect(self) -> socket.socket:
        """A new connection to the child: one end of a fresh socket pair, the other sent down the channel.

        Never blocks. ConnectionRefusedError if there is no child to take it (the caller starts one first).
        """
        with self._lock:
            channel = self._channel
            if channel is None or not self.alive():
                raise ConnectionRefusedError("the development executor is not running")
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                socket.send_fds(channel, [b"c"], [theirs.fileno()])
            except (BlockingIOError, ConnectionError) as error:
                ours.close()
                raise ConnectionRefusedError(f"the development executor does not take connections: {error}") from error
            finally:
                theirs.close()  # the child holds its copy now
        return ours

    def remote(self) -> RemoteExecutor:
        """The server's client to this child, connections made with `connect`."""
        return RemoteExecutor(
            ADDRESS, self.workspace, ensure_running=self.ensure_running, on_lost=self.lost, dial=self.connect
        )

    def _launch(self) -> float | None:
        """Start the child unless it is up and listening; the deadline to wait for it, or None if it is up."""
        if self._listening and self.alive():
            return None
        self._spawn()
        return time.monotonic() + START_DEADLINE

    def _listening_now(self, deadline: float) -> bool:
        """Whether the child answers yet; raises if it died while starting or the deadline passed."""
        if self._listening or self._answers():  # another waiter may have taken the child's one READY
            self._listening = True
            return True
        assert self._process is not None
        if self._process.poll() is not None:
            raise RuntimeError(f"the tool executor exited with {self._process.returncode} while starting")
        if time.monotonic() > deadline:
            raise RuntimeError("the tool executor did not start listening in time")
        return False

    def start(self) -> None:
        """Start it (if needed) and wait until it answers; for start-up and synchronous code."""
        deadline = self._launch()
        while deadline is not None and not self._listening_now(deadline):
            time.sleep(START_POLL)

    async def ensure_running(self) -> None:
        """Before each call: after a lost call, let a dying child finish dying; restart the child if it died; wait
        (without blocking the loop) until it answers."""
        if self._settled != self._losses:
            await self._settle()
        deadline = self._launch()
        while deadline is not None and not self._listening_now(deadline):
            await asyncio.sleep(START_POLL)

    def lost(self) -> None:
        """A call lost its connection. Only noted: that call fails at once, and the next one looks into it first."""
        self._losses += 1

    async def _settle(self) -> None:
        """After a lost call: a child that answers a ping dropped only that call (or is slow) and is kept. One that
        drops the ping is dying (killed, or stopping) and must not be handed the next call: wait for it to exit, and
        kill it if it has not within LOST_WAIT; `_launch` then starts a new one."""
        losses, process = self._losses, self._process
        deadline = time.monotonic() + LOST_WAIT
        if process is not None and process.poll() is None and await self._drops_a_ping(deadline):
            if not await _exited(process, deadline):
                logger.warning("the tool executor (pid %d) stopped serving but did not exit; killing it", process.pid)
                process.kill()
                await _exited(process, time.monotonic() + LOST_WAIT)
        self._settled = max(self._settled, losses)

    async def _drops_a_ping(self, deadline: float) -> bool:
        """Whether the child drops a ping instead of answering it: it is going away. Answering late is not dropping."""
        try:
            reader, writer = await asyncio.open_unix_connection(sock=self.connect())
        except ConnectionRefusedError:  # it is gone, or its end of the channel is closed: it takes no connection
            return True
        try:
            writer.write(wire.encode({"op": "ping", "args": {}}))
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                return await wire.read_frame(reader) is None
        except TimeoutError:
            return False
        except (ConnectionError, wire.FrameError):
            return True
        finally:
            writer.close()

    def stop(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None


async def _exited(process: subprocess.Popen[bytes], deadline: float) -> bool:
    """Whether `process` has exited by `deadline` (a time.monotonic() value), checked without blocking the loop."""
    while process.poll() is None:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(EXIT_POLL)
    return True
