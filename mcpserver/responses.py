"""A JSON answer sent straight from pure-ASGI code at /mcp (refusals before the SDK sees the request)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from starlette.types import Send


async def send_json(send: Send, status: int, body: Mapping[str, object], headers: list[tuple[bytes, bytes]]) -> None:
    payload = json.dumps(body).encode()
    base = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": base + headers})
    await send({"type": "http.response.body", "body": payload})
