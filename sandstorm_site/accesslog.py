"""An HTTP access log that never records query strings (a client may put a token there; we must not keep it)."""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("sandstorm.access")


class AccessLogMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = 0
        sent = 0

        async def watch(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            client = scope.get("client") or ("-", 0)
            elapsed_ms = (time.monotonic() - started) * 1000
            logger.info('%s "%s %s" %s %s %.1fms', client[0], scope["method"], scope["path"], status or "-", sent, elapsed_ms)
