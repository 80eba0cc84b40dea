"""The development child's side of its channel: connections the server hands over, instead of a socket file.

The server (child.py) sends one end of a fresh socket pair per connection down the channel, a SEQPACKET socket
this process inherited; each is then served exactly like an accepted connection. A socket file would let any
process of the same user in (the development child runs as the server's user, and so do the agent's commands);
a descriptor only the server and this process hold does not.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from mcpserver.executor.service import ExecutorService

logger = logging.getLogger("sandstorm.executor")

READY = b"r"  # sent once on the channel: the server's start() waits for it
MAX_FDS = 16  # per message; the server sends one


class HandedOver:
    """Serves the connections that arrive on `channel`; sets `stop` when the server's end closes."""

    def __init__(self, service: ExecutorService, channel: socket.socket, stop: asyncio.Event) -> None:
        self._service = service
        self._channel = channel
        self._stop = stop
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        os.set_inheritable(channel.fileno(), False)  # no tool process may hold it: it would be a way in
        channel.setblocking(False)
        self._loop.add_reader(channel.fileno(), self._receive)
        channel.send(READY)

    def _receive(self) -> None:
        try:
            message, fds, _flags, _address = socket.recv_fds(self._channel, 16, MAX_FDS, socket.MSG_CMSG_CLOEXEC)
        except BlockingIOError:
            return
        except ConnectionError:
            message, fds = b"", []
        if not message and not fds:  # the server's end is closed (it stopped or died): nothing can come any more
            self.close()
            self._stop.set()
            return
        for fd in fds:
            try:
                connection = socket.socket(fileno=fd)
            except OSError:  # not a socket: only the server writes here, so a bug; drop it
                logger.exception("the server handed over a descriptor that is not a socket")
                os.close(fd)
                continue
            task = self._loop.create_task(self._serve(connection))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, connection: socket.socket) -> None:
        reader, writer = await asyncio.open_unix_connection(sock=connection)
        await self._service.handle(reader, writer)

    def close(self) -> None:
        if self._channel.fileno() >= 0:
            self._loop.remove_reader(self._channel.fileno())
            self._channel.close()
