"""A graceful stop of /mcp: every client gets an answer, none a bare disconnect.

When the server stops (SIGTERM under Daphne, lifespan shut-down elsewhere), before the session manager closes its
sessions: new requests at /mcp are answered 503 with a JSON-RPC error; the calls running are stopped, each through its
own cancel scope, so that its request lives on to answer a JSON-RPC error ("the server is stopping; the command was
stopped", raised by dispatch); answers that were ready are delivered; then the stop waits, up to STOP_GRACE seconds,
until every POST already in has had its answer written. Only then are the sessions closed.

GET streams (a 2025-11-25 session's standalone stream) are not waited for: they carry no answer and end with the
sessions.
"""

from __future__ import annotations

import asyncio
import json
import logging

from starlette.types import ASGIApp, Receive, Scope, Send

from mcpserver.inflight import InFlightCalls

logger = logging.getLogger(__name__)
STOP_GRACE = 10.0  # seconds the stop waits for the answers of requests already in
STOPPING_CODE = -32000  # a JSON-RPC "server error": the request was not carried out, or not to its end
CALL_STOPPED = "the server is stopping; the command was stopped"
NOT_ACCEPTED = "the server is stopping; try again in a moment"


class ServerStop:
    """Whether /mcp is stopping, and the POSTs it still has to answer. Used on the event loop's thread only."""

    def __init__(self) -> None:
        self.stopping = False
        self._open = 0
        self._answered = asyncio.Event()

    def opened(self) -> None:
        self._open += 1
        self._answered.clear()

    def closed(self) -> None:
        self._open -= 1
        if self._open == 0:
            self._answered.set()

    async def stop(self, in_flight: InFlightCalls, grace: float = STOP_GRACE) -> None:
        """Refuse what comes next, stop the calls running, and wait for the answers of the requests already in."""
        self.stopping = True
        stopped = in_flight.cancel_all()
        if self._open == 0:
            return
        logger.info("stopping: %d call(s) stopped, waiting for %d request(s) to be answered", stopped, self._open)
        try:
            async with asyncio.timeout(grace):
                await self._answered.wait()
        except TimeoutError:
            logger.warning("stopping: %d request(s) not answered within %.0f s; closing them", self._open, grace)


class StopGate:
    """The ASGI layer of ServerStop: counts the POSTs in, and answers 503 to any request once stopping."""

    def __init__(self, app: ASGIApp, stop: ServerStop) -> None:
        self.app = app
        self.stop = stop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.stop.stopping:
            await _refuse(send)
            return
        if scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        self.stop.opened()
        try:
            await self.app(scope, receive, send)
        finally:
            self.stop.closed()


async def _refuse(send: Send) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": STOPPING_CODE, "message": NOT_ACCEPTED}})
    headers = [(b"content-type", b"application/json"), (b"retry-after", b"5"), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body.encode()})
