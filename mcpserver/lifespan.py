"""Keeps the SDK's session manager running for the life of the server process.

Daphne sends no ASGI lifespan events, so `session_manager.run()` (an async context manager, enterable once) is
held open by one long-lived task on Daphne's event loop: started when Twisted's reactor runs (and, as a fallback,
by the first /mcp request), stopped from a reactor "before shutdown" trigger so open sessions close cleanly on
SIGTERM. Under a server that does send lifespan events (uvicorn), LifespanApp drives the same runner.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

logger = logging.getLogger(__name__)


Hook = Callable[[], Awaitable[None]]


class SessionManagerRunner:
    """Holds the session manager open; runs `on_start` before serving and `on_stop` after the last session closed."""

    def __init__(self, manager: StreamableHTTPSessionManager, on_start: Hook | None = None, on_stop: Hook | None = None) -> None:
        self.manager = manager
        self.on_start = on_start
        self.on_stop = on_stop
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None

    @property
    def running(self) -> bool:
        return self._ready is not None and self._ready.is_set() and self._task is not None and not self._task.done()

    async def ensure_started(self) -> None:
        if self._task is None:
            self._ready, self._stop = asyncio.Event(), asyncio.Event()
            # A fresh context: the task must not inherit the contextvars of whichever request happened to start it.
            self._task = asyncio.get_running_loop().create_task(self._hold(), context=contextvars.Context())
        assert self._ready is not None and self._task is not None
        if self._ready.is_set():
            return
        waiter = asyncio.ensure_future(self._ready.wait())
        await asyncio.wait([waiter, self._task], return_when=asyncio.FIRST_COMPLETED)
        if not self._ready.is_set():
            waiter.cancel()
            self._task.result()  # start-up failed: raise its error here instead of waiting forever
            raise RuntimeError("the MCP session manager stopped before it started")

    async def _hold(self) -> None:
        assert self._ready is not None and self._stop is not None
        if self.on_start is not None:
            await self.on_start()
        try:
            async with self.manager.run():
                self._ready.set()
                await self._stop.wait()
            logger.info("MCP session manager stopped")
        finally:
            if self.on_stop is not None:
                await self.on_stop()

    async def stop(self) -> None:
        if self._task is None or self._stop is None:
            return
        self._stop.set()
        await self._task


def install_reactor_hooks(runner: SessionManagerRunner) -> bool:
    """Start and stop the runner with Daphne's reactor. False when not running under Twisted (e.g. uvicorn)."""
    if "twisted.internet.reactor" not in sys.modules:
        return False  # importing the reactor here would install the wrong one
    from twisted.internet import defer, reactor

    def start() -> None:
        asyncio.ensure_future(runner.ensure_started())

    def stop() -> defer.Deferred[Any]:
        return defer.Deferred.fromFuture(asyncio.ensure_future(runner.stop()))

    reactor.callWhenRunning(start)  # type: ignore[attr-defined]
    reactor.addSystemEventTrigger("before", "shutdown", stop)  # type: ignore[attr-defined]
    return True


class LifespanApp:
    """ASGI lifespan handling for servers that send it; Daphne does not."""

    def __init__(self, runner: SessionManagerRunner) -> None:
        self.runner = runner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.runner.ensure_started()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.runner.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return
