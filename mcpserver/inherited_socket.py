"""The listening socket systemd passes (sandstorm-mcp.socket), served without taking it over.

Twisted's `systemd:` endpoint adopts the socket as a port of its own (adoptStreamPort), and a Unix port that stops
calls shutdown(2) on its socket and unlinks its path: the socket systemd still holds stops listening and its file is
gone, so systemd fails the socket unit, the next server cannot listen, and requests are refused until both are made
again. Here the socket is only read from: each connection is accepted and handed to the reactor
(`adoptStreamConnection`, public API), and stopping removes the reader and closes this process's descriptor. The
socket stays listening with its file in place, and connections that arrive while no server runs wait in its queue
for the next one.

Daphne reaches it through an endpoint string, `sandstorm-inherited:fd=3`, whose parser is a Twisted plugin
(mcpserver/twisted_plugins/twisted/plugins/sandstorm_inherited_socket.py; `manage.py serve --systemd-socket` puts
that directory on the exec'd Daphne's PYTHONPATH).
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any

from twisted.internet import address, defer
from twisted.internet.interfaces import (
    IListeningPort,
    IReadDescriptor,
    IStreamServerEndpoint,
    IStreamServerEndpointStringParser,
)
from twisted.internet.protocol import Factory
from twisted.plugin import IPlugin
from twisted.python.failure import Failure
from zope.interface import implementer

logger = logging.getLogger(__name__)
PREFIX = "sandstorm-inherited"
ACCEPTS_PER_WAKE = 100  # as Twisted's own ports: a flood of connections cannot keep the reactor on this socket
# accept(2) failures that pass: out of descriptors or memory for now (the connection waits in the queue), or a client
# that left before it was accepted.
TRANSIENT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED, errno.EPROTO})


@implementer(IListeningPort, IReadDescriptor)
class InheritedUnixPort:
    """Accepts connections on a listening Unix socket this process was handed and does not own."""

    def __init__(self, reactor: Any, fd: int, factory: Factory) -> None:
        self._reactor = reactor
        self._socket = socket.socket(fileno=fd)
        if self._socket.family != socket.AF_UNIX:
            raise ValueError(f"file descriptor {fd} is not a Unix socket")
        self._socket.setblocking(False)
        self._factory = factory
        self._listening = False

    def startListening(self) -> None:
        self._factory.doStart()
        self._reactor.addReader(self)
        self._listening = True

    def doRead(self) -> None:
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                connection, _ = self._socket.accept()
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            except OSError as error:
                if error.errno in TRANSIENT:
                    logger.warning("could not accept a connection: %s", error)
                    return
                raise
            with connection:  # the reactor takes a descriptor of its own: this one is closed
                connection.setblocking(False)
                self._reactor.adoptStreamConnection(connection.fileno(), socket.AF_UNIX, self._factory)

    def fileno(self) -> int:
        return self._socket.fileno()

    def logPrefix(self) -> str:
        return PREFIX

    def connectionLost(self, reason: Failure) -> None:
        """The reactor is stopping (or accept failed for good)."""
        self._close()

    def stopListening(self) -> defer.Deferred[None]:
        self._close()
        return defer.succeed(None)

    def getHost(self) -> address.UNIXAddress:
        return address.UNIXAddress(self._socket.getsockname())

    def _close(self) -> None:
        """Stop accepting; this descriptor is closed, never shut down, and the socket's file is left where it is."""
        if not self._listening:
            return
        self._listening = False
        self._reactor.removeReader(self)
        self._socket.close()
        self._factory.doStop()


@implementer(IStreamServerEndpoint)
class InheritedSocketEndpoint:
    def __init__(self, reactor: Any, fd: int) -> None:
        self._reactor = reactor
        self._fd = fd

    def listen(self, factory: Factory) -> defer.Deferred[InheritedUnixPort]:
        def start() -> InheritedUnixPort:
            port = InheritedUnixPort(self._reactor, self._fd, factory)
            port.startListening()
            return port

        return defer.execute(start)


@implementer(IPlugin, IStreamServerEndpointStringParser)
class InheritedSocketParser:
    """`sandstorm-inherited:fd=3`: the listening Unix socket on that descriptor (systemd's first is 3)."""

    prefix = PREFIX

    def parseStreamServer(self, reactor: Any, *args: str, **kwargs: str) -> InheritedSocketEndpoint:
        return InheritedSocketEndpoint(reactor, int(kwargs.get("fd", "3")))
