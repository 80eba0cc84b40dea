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
            log_request(scope, status, sent, (time.monotonic() - started) * 1000)


def log_request(scope: Scope, status: int, sent: int, elapsed_ms: float) -> None:
    """One line per request. `path` is the ASGI path, which never holds the query string; that is never logged."""
    client = scope.get("client")
    fields = {
        "method": scope["method"],
        "path": scope["path"],
        "status": status or None,
        "duration_ms": round(elapsed_ms, 1),
        "client": client[0] if client else None,
        "bytes": sent,
    }
    msg = f'{fields["client"] or "-"} "{fields["method"]} {fields["path"]}" {status or "-"} {sent} {elapsed_ms:.1f}ms'
    logger.info(msg, extra=fields)
