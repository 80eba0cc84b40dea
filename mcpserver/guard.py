"""The outermost layer at /mcp: an exception raised before the answer started becomes a JSON-RPC error, never
Daphne's HTML error page, which an MCP client cannot read.

A database that cannot be read (a credential lookup or an audit write failing) is a 503 and marks /health failed
(mcpserver.database_health); anything else unexpected is a 500. Both are logged with their traceback.
"""

from __future__ import annotations

import logging
import sqlite3

from django.db import DatabaseError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcpserver.database_health import DatabaseHealth
from mcpserver.responses import send_json

logger = logging.getLogger(__name__)
INTERNAL_ERROR = -32603  # JSON-RPC's


def error_body(message: str) -> dict[str, object]:
    return {"jsonrpc": "2.0", "id": None, "error": {"code": INTERNAL_ERROR, "message": message}}


class JsonErrors:
    def __init__(self, app: ASGIApp, database: DatabaseHealth) -> None:
        self.app = app
        self.database = database

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def noting_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, noting_send)
        except (DatabaseError, sqlite3.Error) as error:
            self.database.failed(error)
            if started:
                raise
            logger.exception("a request at /mcp failed: the database cannot be read")
            message = "the server cannot read its database, so it cannot serve this request; see /health"
            await send_json(send, 503, error_body(message), [])
        except Exception:  # the boundary of /mcp: whatever else escaped is a JSON-RPC error, logged, not HTML
            if started:
                raise
            logger.exception("a request at /mcp failed")
            await send_json(send, 500, error_body("internal error; the server's log has the details"), [])
