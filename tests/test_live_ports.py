"""tests/live.py's `free_port`: a port handed to one test process is not handed to another, nor taken by a client's
connection, until its server binds it (the race two xdist workers used to lose)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.live import free_port


def listening(port: int) -> socket.socket:
    """A server's socket on `port` as Daphne (mcpserver/listening.py), Caddy and redis-server make it."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen()
    return server


def test_a_held_port_is_refused_to_a_plain_bind_and_to_another_process() -> None:
    port = free_port()
    with socket.socket() as other, pytest.raises(OSError, match="in use"):
        other.bind(("127.0.0.1", port))
    probe = f"import socket; s = socket.socket(); s.bind(('127.0.0.1', {port}))"
    refused = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    assert refused.returncode != 0 and "Address already in use" in refused.stderr


def test_the_server_binds_the_held_port_and_a_second_server_is_refused() -> None:
    port = free_port()
    with listening(port) as server:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            accepted, _ = server.accept()
            accepted.close()
            assert client.getpeername()[1] == port
        with pytest.raises(OSError, match="in use"):
            listening(port)
    with listening(port):  # a restart of the same server on the same port
        pass


def test_no_port_is_handed_out_twice_nor_picked_for_a_connection() -> None:
    held = {free_port() for _ in range(200)}
    assert len(held) == 200
    with listening(0) as server:
        target = server.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", target), timeout=5) for _ in range(100)]  # the backlog's size
        try:
            assert not held & {client.getsockname()[1] for client in clients}
        finally:
            for client in clients:
                client.close()
