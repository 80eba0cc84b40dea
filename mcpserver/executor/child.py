"""Development mode: the server runs the executor as its own child process, under the same OS user.

Same code path as production (a separate process behind a Unix socket), minus the second user. The child is
restarted when it has died, and exits by itself when the server does (it watches its stdin, a pipe from us).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

START_DEADLINE = 20.0
START_POLL = 0.01  # seconds between checks that a starting child listens
LOST_WAIT = 2.0  # how long a child that dropped a call may take to exit before we look again


class ExecutorChild:
    def __init__(self, workspace: str, env_allow: Iterable[str] = (), limits: Iterable[str] = ()) -> None:
        self.workspace = workspace
        self._allowed = tuple(env_allow)
        self.env_allow = ",".join(self._allowed)
        self.limits = tuple(limits)  # e.g. ("--max-processes", "1024"): __main__'s options, from the settings
        # A short private directory: socket paths are limited to 107 bytes, and only we should see this one.
        self._dir = Path(tempfile.mkdtemp(prefix="sandstorm-exec-"))
        self.socket_path = str(self._dir / "executor.sock")
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._listening = False  # whether the current child has answered once
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
                logger.warning("the tool executor (pid %d) exited with %s; restarting it", self._process.pid, self._process.returncode)
            argv = [
                sys.executable, "-m", "mcpserver.executor",
                "--socket", self.socket_path, "--workspace", self.workspace,
                "--allow-uid", str(os.getuid()), "--env-allow", self.env_allow, *self.limits, "--watch-stdin",
            ]  # fmt: skip
            self._listening = False
            self._process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, cwd=str(Path(__file__).resolve().parents[2]), env=self._child_env()
            )
            return True

    def _child_env(self) -> dict[str, str]:
        """Not the server's environment, which holds tokens and passwords: only what the executor and tools need."""
        names = {"PATH", "LANG", "LC_ALL", "TZ", "SANDSTORM_LOG_FORMAT", *self._allowed}
        return {name: value for name, value in os.environ.items() if name in names}

    def _answers(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(self.socket_path)
            except (FileNotFoundError, ConnectionRefusedError):
                return False
        return True

    def _launch(self) -> float | None:
        """Start the child unless it is up and listening; the deadline to wait for it, or None if it is up."""
        if self._listening and self.alive():
            return None
        self._spawn()
        return time.monotonic() + START_DEADLINE

    def _listening_now(self, deadline: float) -> bool:
        """Whether the child answers yet; raises if it died while starting or the deadline passed."""
        if self._answers():
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
        """Before each call: restart the child if it died, and wait (without blocking the loop) until it answers."""
        deadline = self._launch()
        while deadline is not None and not self._listening_now(deadline):
            await asyncio.sleep(START_POLL)

    async def lost(self) -> None:
        """A call lost its connection: wait briefly for the child to be gone, then check it before the next call."""
        deadline = time.monotonic() + LOST_WAIT
        while self.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self._listening = False

    def stop(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self._dir, ignore_errors=True)
