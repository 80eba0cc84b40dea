"""A throwaway redis-server (Debian's package) for the tests of several workers: on a Unix socket in a temporary
directory, nothing saved to disk. Every test names its keys with a prefix of its own, so they may share one."""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests import tiers


def unique_prefix() -> str:
    return f"sandstorm-test-{secrets.token_hex(4)}"


@dataclass
class RedisServer:
    url: str  # unix:///...
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@contextmanager
def running_redis(directory: Path) -> Iterator[RedisServer]:
    """Start redis-server; yields it (its unix:// URL), and stops it afterwards."""
    tiers.require("live", "starts redis-server")
    binary = shutil.which("redis-server")
    if binary is None:
        raise AssertionError("redis-server is not installed (Debian: apt install redis-server; .ci/run installs it)")
    path = directory / "redis.sock"
    process = subprocess.Popen(
        [binary, "--port", "0", "--unixsocket", str(path), "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
         "--dir", str(directory), "--logfile", str(directory / "redis.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while not _answers(path):
            if process.poll() is not None or time.monotonic() > deadline:
                log = (
                    (directory / "redis.log").read_text(errors="replace") if (directory / "redis.log").exists() else ""
                )
                raise AssertionError(f"redis-server did not start: {log[-2000:]}")
            time.sleep(0.02)
        server = RedisServer(f"unix://{path}", process)
        yield server
    finally:
        RedisServer("", process).stop()


def _answers(path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX) as client:
            client.settimeout(1)
            client.connect(str(path))
            client.sendall(b"PING\r\n")
            return client.recv(16).startswith(b"+PONG")
    except OSError:
        return False
