"""The server process's life: the SDK's session manager held open, and the housekeeping around it.

Daphne sends no ASGI lifespan events, so `session_manager.run()` (an async context manager, enterable once) is
held open by one long-lived task on Daphne's event loop: started when Twisted's reactor runs (and, as a fallback,
by the first /mcp request), stopped from a reactor "before shutdown" trigger so open sessions close cleanly on
SIGTERM. Under a server that does send lifespan events (uvicorn), LifespanApp drives the same runner.

Around it (Housekeeping): register this process's instance, finish calls a killed predecessor left open, heartbeat
and anchor the audit chain head (the anchor file and the log) every minute and at shut-down.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

from audit.anchor import append_anchor
from audit.budget import AuditBudget
from audit.failures import FailureAggregator
from audit.instances import heartbeat, mark_stopped, recover_interrupted, register_instance
from audit.log import Actor, chain_head, event
from audit.log.held import held, replay_spill
from mcpserver.process import INSTANCE_ID

logger = logging.getLogger(__name__)
TICK_SECONDS = 60.0


Hook = Callable[[], Awaitable[None]]


class SessionManagerRunner:
    """Holds the session manager open; runs `on_start` before serving, `before_stop` before closing the sessions and
    `on_stop` after the last session closed."""

    def __init__(
        self,
        manager: StreamableHTTPSessionManager,
        on_start: Hook | None = None,
        on_stop: Hook | None = None,
        before_stop: Hook | None = None,
    ) -> None:
        self.manager = manager
        self.on_start = on_start
        self.on_stop = on_stop
        self.before_stop = before_stop  # while the sessions are still open: answer every request (mcpserver.stopping)
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._drained = False

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

    async def drain(self) -> None:
        """Run `before_stop` (once) while the sessions are still open."""
        if self.before_stop is not None and self.running and not self._drained:
            self._drained = True
            await self.before_stop()

    async def stop(self) -> None:
        if self._task is None or self._stop is None:
            return
        await self.drain()
        self._stop.set()
        await self._task


def install_reactor_hooks(runner: SessionManagerRunner) -> bool:
    """Start and stop the runner with Daphne's reactor. False when not running under Twisted (e.g. uvicorn)."""
    if "twisted.internet.reactor" not in sys.modules:
        return False  # importing the reactor here would install the wrong one
    from twisted.internet import defer, reactor

    def start() -> None:
        asyncio.ensure_future(runner.ensure_started())
        # After Twisted's own handlers (callWhenRunning runs once they are installed): a stop signal first lets
        # every request in be answered, then stops the reactor. Twisted's handler would stop it at once, and
        # Daphne's shut-down trigger cancels every request it still has, answered or not.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, on_stop_signal)

    draining: list[asyncio.Task[None]] = []
    # Twisted declares its interfaces' methods without `self` (zope.interface); see the trigger below.
    stop_reactor: Callable[[], None] = reactor.stop  # type: ignore[misc]

    def on_stop_signal(signum: int, frame: object) -> None:
        reactor.callFromThread(begin_stop)  # out of the signal handler, onto the reactor's loop

    def begin_stop() -> None:
        if draining:  # a second signal: stop now
            stop_reactor()
            return
        task = asyncio.ensure_future(runner.drain())
        task.add_done_callback(lambda _: stop_reactor())
        draining.append(task)

    def stop() -> defer.Deferred[Any]:
        return defer.Deferred.fromFuture(asyncio.ensure_future(runner.stop()))

    reactor.callWhenRunning(start)
    # Twisted declares its interfaces' methods without `self` (zope.interface), so mypy takes "before" for `self`.
    reactor.addSystemEventTrigger("before", "shutdown", stop)  # type: ignore[arg-type]  # see the line above
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


# --- housekeeping ----------------------------------------------------------------------------------------------------

_anchored: dict[str, tuple[int, str]] = {}  # the head this process last anchored, by anchor file


def log_chain_head() -> None:
    """Anchor the chain head outside the database: in the anchor file, which audit_verify checks, and the log.

    An idle server's head does not move: it is anchored again only when it has (a line a minute would otherwise
    grow the anchor file for as long as the server runs)."""
    mac, record_id = chain_head()
    logger.info("audit chain head: record %d mac %s", record_id, mac)
    path = str(settings.AUDIT_ANCHOR_FILE)
    if _anchored.get(path) == (record_id, mac):
        return
    try:
        append_anchor(settings.AUDIT_ANCHOR_FILE, settings.AUDIT_HMAC_KEY, record_id, mac)
    except OSError:
        logger.exception("audit: could not append the chain head to %s", settings.AUDIT_ANCHOR_FILE)
        return
    _anchored[path] = (record_id, mac)


def flush_failures(failures: FailureAggregator) -> None:
    for address, count, reasons in failures.drain():
        if count:
            actor = Actor(client_address=address)
            event("auth.failed", actor, instance_id=INSTANCE_ID, count=count, reasons=reasons, aggregated=True)


def flush_budget_refusals(budget: AuditBudget) -> None:
    """One event for the tool calls refused because the audit log is full, instead of a record each."""
    count, state = budget.drain_refused()
    if count:
        detail = state.as_json() if state else {}
        event("audit.full", instance_id=INSTANCE_ID, calls_refused=count, **detail)


class Housekeeping:
    """The audit log's housekeeping for this server process, from its start to its stop."""

    def __init__(self, failures: FailureAggregator, budget: AuditBudget) -> None:
        self.failures = failures
        self.budget = budget
        self._ticker: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await sync_to_async(register_instance, thread_sensitive=False)(INSTANCE_ID)
        # First the finished records the last run held in its spill file: their calls were not interrupted.
        await sync_to_async(replay_spill, thread_sensitive=False)(
            Path(settings.STATE_DIR), settings.WORKER, settings.WORKERS
        )
        held().prepare()
        await sync_to_async(recover_interrupted, thread_sensitive=False)(INSTANCE_ID)
        await sync_to_async(log_chain_head, thread_sensitive=False)()
        self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        held().cancel_retries()
        await sync_to_async(self._final, thread_sensitive=False)()

    def _final(self) -> None:
        held().stop()
        flush_failures(self.failures)
        flush_budget_refusals(self.budget)
        mark_stopped(INSTANCE_ID)
        log_chain_head()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            try:
                await sync_to_async(self._every_minute, thread_sensitive=False)()
            except DatabaseError:
                logger.exception("audit housekeeping failed; retrying in a minute")

    def _every_minute(self) -> None:
        heartbeat(INSTANCE_ID)
        flush_failures(self.failures)
        flush_budget_refusals(self.budget)
        log_chain_head()
