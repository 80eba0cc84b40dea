"""The /mcp body gate in process: strict JSON passes unchanged, anything else is a 400 parse error."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.types import Message

from mcpserver.bodies import PARSE_ERROR, JsonBodyGate, parse_error

pytestmark = [pytest.mark.anyio]


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'"\\udc00"',
        b'"\xff"',
        b"1" * 5000,
        b"",
        b"{",
    ],
)
def test_what_is_not_strict_json_is_refused(body: bytes) -> None:
    assert parse_error(body) is not None


def test_strict_json_is_accepted() -> None:
    assert (
        parse_error(
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"x": [1.5, "é"]}}).encode()
        )
        is None
    )


async def run_gate(chunks: list[bytes], limit: int = 1000) -> tuple[list[Message], bytes | None]:
    """Drive the gate with a body in `chunks`; what it sent, and the body the app behind it read (None: not called)."""
    incoming = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[Message] = []
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen["body"] = body

    async def receive() -> Message:
        return incoming.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    await JsonBodyGate(app, max_body_bytes=limit)({"type": "http", "method": "POST"}, receive, send)
    return sent, seen.get("body")


async def test_a_valid_body_in_pieces_reaches_the_app_whole() -> None:
    sent, body = await run_gate([b'{"jsonrpc": "2.0",', b' "id": 1, "method": "ping"}'])
    assert sent == [] and body == b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}'


async def test_a_nested_body_is_answered_with_a_parse_error_and_never_reaches_the_app() -> None:
    sent, body = await run_gate([b"[" * 400, b"]" * 400])
    assert body is None and sent[0]["status"] == 400
    assert json.loads(sent[1]["body"])["error"]["code"] == PARSE_ERROR


async def test_a_body_over_the_limit_is_handed_on_for_the_sdks_413() -> None:
    sent, body = await run_gate([b"x" * 600, b"y" * 600, b"z" * 10], limit=1000)
    assert sent == [] and body == b"x" * 600 + b"y" * 600 + b"z" * 10
