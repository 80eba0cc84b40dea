"""A running command's output, passed on whole and in order as it comes, with its timing: for the call's recording,
the console's Live view and the client's progress notifications (the server does all three with it).

Each event is (seconds since the command started, stream, text): "o" stdout, "e" stderr, "m" a note of ours. The
relay sends what came since its last send, at most once per INTERVAL, and everything left once the command has
ended (`finish`), so the last line before the exit is never lost. At most `cap` bytes are passed on: the first half
as it comes, then only the newest half is kept, which `finish` sends after a note of how much was left out.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import time
from collections import deque

from mcpserver.executor.interface import OutputEvent, OutputListener

logger = logging.getLogger(__name__)

INTERVAL = 0.25  # seconds between sends: at most 4 a second per command
SEND_CHARS = 256 * 1024  # text of one send; more waiting is sent in several
DEFAULT_CAP = 16 * 1024 * 1024
STREAMS = {1: "o", 2: "e"}


class OutputRelay:
    def __init__(self, listener: OutputListener, cap: int = DEFAULT_CAP) -> None:
        self._listener = listener
        self._half = max(cap // 2, 1)
        self._decoders = {fd: codecs.getincrementaldecoder("utf-8")(errors="replace") for fd in STREAMS}
        self._began = time.monotonic()
        self._pending: deque[OutputEvent] = deque()
        self._head = 0  # bytes passed on as they came
        self._tail: deque[tuple[OutputEvent, int]] = deque()  # past the head: the newest events and their bytes
        self._tail_bytes = 0
        self._left_out = 0
        self._ready = asyncio.Event()
        self._gone = False  # the listener's connection is gone: nothing more is sent
        self._task = asyncio.get_running_loop().create_task(self._run())

    def feed(self, fd: int, data: bytes) -> None:
        text = self._decoders[fd].decode(data)
        if text:
            self._take((round(time.monotonic() - self._began, 3), STREAMS[fd], text), len(data))

    def _take(self, event: OutputEvent, size: int) -> None:
        if self._head + size <= self._half and not self._tail:
            self._head += size
            self._pending.append(event)
            self._ready.set()
            return
        self._tail.append((event, size))
        self._tail_bytes += size
        while self._tail_bytes > self._half and len(self._tail) > 1:
            _old, old_size = self._tail.popleft()
            self._tail_bytes -= old_size
            self._left_out += old_size

    def stop(self) -> None:
        """The call was cancelled: send nothing more (not awaited: the caller may itself be a cancelled task)."""
        self._task.cancel()

    async def finish(self) -> None:
        """The command has ended and its output is read: send all that is left, then stop."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        for fd, decoder in self._decoders.items():
            rest = decoder.decode(b"", final=True)
            if rest:
                self._take((round(time.monotonic() - self._began, 3), STREAMS[fd], rest), len(rest.encode()))
        if self._left_out:
            first = self._tail[0][0][0] if self._tail else round(time.monotonic() - self._began, 3)
            self._pending.append((first, "m", f"[{self._left_out} bytes of output left out here]"))
        self._pending.extend(event for event, _size in self._tail)
        self._tail.clear()
        await self._send()

    async def _run(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            await self._send()
            await asyncio.sleep(INTERVAL)

    async def _send(self) -> None:
        while self._pending and not self._gone:
            batch: list[OutputEvent] = []
            size = 0
            while self._pending and (not batch or size + len(self._pending[0][2]) <= SEND_CHARS):
                event = self._pending.popleft()
                batch.append(event)
                size += len(event[2])
            try:
                await self._listener(batch)
            except ConnectionError:
                self._gone = True  # the listener's connection is gone (its call was cancelled, the server stopped)
            except Exception:  # a listener must never kill the command
                logger.exception("output listener failed")
