"""Every POST body at /mcp must be JSON before anything else reads it; anything else is a 400 JSON-RPC parse error.

The SDK's parser (pydantic_core) handles what it refuses, but other readers of the same bytes do not all do the
same (Python's `json` raises RecursionError on deep nesting, which became a 500 with a traceback), and it accepts
`NaN` and `Infinity`, which JSON does not have and which reached the tools as floats. So one strict parse — the
SDK's own parser, with `NaN`/`Infinity` refused; deep nesting, invalid UTF-8, lone surrogates and out-of-range
numbers are refused by it already — decides for every era (a session's opening request, its later ones,
2026-07-28 requests). A body larger than the limit is handed on unread past the limit, for the SDK's 413. A strict
body is also left in the scope (BODY_KEY), so that nothing behind the gate reads the request a second time.
"""

from __future__ import annotations

import json
import logging
from collections import deque

import pydantic_core
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)
PARSE_ERROR = -32700
MAX_DETAIL = 200  # characters of the parser's message echoed to the client
# Where a POST's whole body, found strict JSON, is left in the ASGI scope for what behind the gate looks at it before
# the SDK (mcpserver.step_up); the body is still replayed to the app as it came.
BODY_KEY = "sandstorm.body"


def parse_error(body: bytes) -> str | None:
    """Why `body` is not strict JSON, or None if it is."""
    try:
        pydantic_core.from_json(body, allow_inf_nan=False)
    except ValueError as error:  # pydantic_core reports every refusal (depth, encoding, numbers) as ValueError
        return str(error)[:MAX_DETAIL]
    return None


class JsonBodyGate:
    """Answers a POST whose body is not strict JSON with 400 and a JSON-RPC parse error; passes everything else on."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        read: deque[Message] = deque()
        body = bytearray()
        complete = False
        while len(body) <= self.max_body_bytes:
            message = await receive()
            read.append(message)
            if message["type"] != "http.request":
                break  # a disconnect: the SDK sees it too
            body += message.get("body", b"")
            if not message.get("more_body", False):
                complete = True
                break
        if complete and len(body) <= self.max_body_bytes:
            whole = bytes(body)
            if (reason := parse_error(whole)) is not None:
                await refuse(send, reason)
                return
            scope = {**scope, BODY_KEY: whole}

        async def replay() -> Message:
            return read.popleft() if read else await receive()

        await self.app(scope, replay, send)


async def refuse(send: Send, reason: str) -> None:
    payload = json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": PARSE_ERROR, "message": f"Parse error: {reason}"}}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
