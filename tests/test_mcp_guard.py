"""The outermost layer at /mcp (mcpserver.guard) and the database's verdict for /health
(mcpserver.database_health): a request that meets a database error gets a JSON-RPC error with 503 and turns /health
503 at once; anything else unexpected is a JSON-RPC 500; never Daphne's HTML page."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import DatabaseError
from starlette.types import Message, Receive, Scope, Send

from mcpserver.database_health import DatabaseHealth
from mcpserver.guard import INTERNAL_ERROR, JsonErrors

pytestmark = [pytest.mark.unit, pytest.mark.anyio]


def failing(error: BaseException, after_start: bool = False) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if after_start:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        raise error

    return app


async def call(app: Any) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app({"type": "http", "method": "POST", "path": "/mcp", "headers": []}, receive, send)
    return sent


def answer(sent: list[Message]) -> tuple[int, dict[str, str], dict[str, Any]]:
    start, body = sent
    headers = {key.decode(): value.decode() for key, value in start["headers"]}
    return start["status"], headers, json.loads(body["body"])


async def test_a_database_error_is_a_json_rpc_503_and_health_says_so_at_once() -> None:
    database = DatabaseHealth(probe=lambda: None, every=3600)
    assert await database.error() is None
    sent = await call(JsonErrors(failing(DatabaseError("database disk image is malformed")), database))
    status, headers, body = answer(sent)
    assert status == 503 and headers["content-type"] == "application/json"
    assert body["jsonrpc"] == "2.0" and body["id"] is None and body["error"]["code"] == INTERNAL_ERROR
    assert "cannot read its database" in body["error"]["message"]
    assert "database disk image is malformed" in (await database.error() or "")


async def test_anything_else_unexpected_is_a_json_rpc_500() -> None:
    sent = await call(JsonErrors(failing(RuntimeError("boom")), DatabaseHealth(probe=lambda: None)))
    status, _, body = answer(sent)
    assert status == 500 and body["error"]["code"] == INTERNAL_ERROR and "boom" not in json.dumps(body)


async def test_an_error_after_the_answer_started_is_left_to_the_server() -> None:
    with pytest.raises(RuntimeError):
        await call(JsonErrors(failing(RuntimeError("late"), after_start=True), DatabaseHealth(probe=lambda: None)))


async def test_the_database_verdict_follows_the_probe() -> None:
    broken = [True]

    def probe() -> None:
        if broken[0]:
            raise DatabaseError("no such table: audit_chainhead")

    database = DatabaseHealth(probe=probe, every=0)
    assert "no such table" in (await database.error() or "")
    broken[0] = False
    assert await database.error() is None
