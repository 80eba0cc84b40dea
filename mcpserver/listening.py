"""The TCP socket `manage.py serve` and `manage.py run` listen on, bound here before Daphne starts and handed to it
by file descriptor: a port that is taken is found first, and said in one line naming the variable that moves it."""

from __future__ import annotations

import contextlib
import errno
import socket

from django.core.management.base import CommandError

BACKLOG = 128
# How far past a taken port to look for a free one to suggest.
SUGGEST_WITHIN = 20


def _address(host: str, port: int) -> tuple[socket.AddressFamily, tuple[str, int] | tuple[str, int, int, int]]:
    family, _, _, _, address = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    return family, address  # type: ignore[return-value]  # AF_INET and AF_INET6 addresses only, for a TCP host


def _bound(host: str, port: int) -> socket.socket:
    family, address = _address(host, port)
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        # As Twisted sets it on its own listeners: a restart is not refused for connections still in TIME_WAIT.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        listener.bind(address)
    except OSError:
        listener.close()
        raise
    return listener


def free_port_after(host: str, port: int) -> int | None:
    """The first port above `port` that can be bound on `host` now, if one is near."""
    for candidate in range(port + 1, min(port + 1 + SUGGEST_WITHIN, 65536)):
        with contextlib.suppress(OSError):
            _bound(host, candidate).close()
            return candidate
    return None


def listen_tcp(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, inheritable (for Daphne); CommandError in one line if it cannot be had."""
    try:
        listener = _bound(host, port)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            other = free_port_after(host, port)
            hint = f"set SANDSTORM_MCP_PORT={other}" if other else "set SANDSTORM_MCP_PORT to a free port"
            raise CommandError(f"Port {port} on {host} is in use: {hint} (or stop the other server).") from None
        if error.errno == errno.EACCES:
            raise CommandError(
                f"Port {port} on {host} needs privileges this user lacks: set SANDSTORM_MCP_PORT above 1023."
            ) from None
        raise CommandError(
            f"Cannot listen on {host} port {port} ({error.strerror}): check SANDSTORM_MCP_HOST and SANDSTORM_MCP_PORT."
        ) from None
    listener.listen(BACKLOG)
    listener.set_inheritable(True)
    return listener


def daphne_endpoint(listener: socket.socket, host: str, port: int) -> list[str]:
    """Daphne's arguments to serve on `listener`: adopted by file descriptor (a Twisted `fd:` endpoint).

    Twisted's `fd:` endpoint takes IPv4 sockets only (its `domain` option arrives as a string it does not convert),
    so an IPv6 listener is closed again and Daphne binds host and port itself: the check was still made first.
    """
    if listener.family == socket.AF_INET:
        return ["-e", f"fd:fileno={listener.fileno()}"]
    listener.close()
    return ["-b", host, "-p", str(port)]
