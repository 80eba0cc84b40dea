"""`manage.py serve --systemd-socket` as systemd runs it: the listening socket is handed over as file descriptor 3
and stays the holder's. A server that stops leaves it listening with its file in place, so a request that arrives
before the next server starts waits in its queue and is answered by that server (Twisted's own `systemd:` endpoint
shut the socket down and removed its file: systemd failed the socket unit, and a restart refused requests)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.live import REPO, LiveServer, make_server, poll

pytestmark = [pytest.mark.live]


@pytest.fixture
def held_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, Path]]:
    """A listening Unix socket this test holds, as systemd holds sandstorm-mcp.socket."""
    path = tmp_path / "run" / "worker-1.sock"
    path.parent.mkdir()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    try:
        yield listener, path
    finally:
        listener.close()


def serve_on(server: LiveServer, listener: socket.socket) -> subprocess.Popen[bytes]:
    """The server, given `listener` as its file descriptor 3."""
    with server.log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--systemd-socket"],
            cwd=REPO,
            env=server.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(3,),
            preexec_fn=lambda: os.dup2(listener.fileno(), 3),  # noqa: PLW1509 - before exec, as systemd does
        )


def healthy(path: Path, server: LiveServer) -> bool:
    try:
        transport = httpx2.HTTPTransport(uds=str(path))
        with httpx2.Client(transport=transport, base_url=server.url, timeout=5) as client:
            return client.get("/health").status_code == 200
    except httpx2.TransportError:
        return False


def test_a_stopped_server_leaves_the_socket_listening_and_the_next_one_answers_what_waited(
    tmp_path: Path, held_socket: tuple[socket.socket, Path]
) -> None:
    listener, path = held_socket
    server = make_server(tmp_path / "server")
    server.manage("bootstrap")
    first = serve_on(server, listener)
    try:
        poll(lambda: healthy(path, server), 60, what="the first server")
        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == 0
    finally:
        if first.poll() is None:
            first.kill()
    assert path.is_socket()  # still there, and still listening:
    waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    waiting.settimeout(60)
    waiting.connect(str(path))
    host = server.url.removeprefix("http://")
    waiting.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    second = serve_on(server, listener)
    try:
        answer = b""
        while chunk := waiting.recv(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert healthy(path, server)
    finally:
        waiting.close()
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    assert "Listen failure" not in server.log()
