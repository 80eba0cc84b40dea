"""The stop's ASGI gate: once stopping, a request at /mcp gets 503 and a JSON-RPC error; the POSTs already in are
waited for (up to the grace), the GET streams are not."""

from __future__ import annotations

import asyncio
import json

import anyio
import pytest
from starlette.types import Message, Receive, Scope, Send

from mcpserver.inflight import InFlightCalls
from mcpserver.stopping import NOT_ACCEPTED, STOPPING_CODE, ServerStop, StopGate

pytestmark = [pytest.mark.unit, pytest.mark.anyio]


class Held:
    """An application whose requests stay open until released; notes what it was asked."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.seen: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.seen.append(scope["method"])
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"answered"})


async def request(gate: StopGate, method: str) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await gate({"type": "http", "method": method, "path": "/mcp", "headers": []}, receive, send)
    return sent


async def test_the_stop_waits_for_the_posts_in_and_refuses_what_comes_after() -> None:
    app, stop = Held(), ServerStop()
    gate = StopGate(app, stop)
    post = asyncio.ensure_future(request(gate, "POST"))
    stream = asyncio.ensure_future(request(gate, "GET"))
    await asyncio.sleep(0.01)
    stopping = asyncio.ensure_future(stop.stop(InFlightCalls(), grace=5))
    await asyncio.sleep(0.05)
    assert not stopping.done()  # the POST in has not been answered yet
    late = await request(gate, "POST")
    assert late[0]["status"] == 503 and (b"retry-after", b"5") in late[0]["headers"]
    assert json.loads(late[1]["body"])["error"] == {"code": STOPPING_CODE, "message": NOT_ACCEPTED}
    assert app.seen == ["POST", "GET"]  # the late one never reached the application
    app.release.set()
    await stopping
    assert (await post)[1]["body"] == b"answered"
    await stream


async def test_the_stop_gives_up_on_an_answer_after_its_grace() -> None:
    app, stop = Held(), ServerStop()
    gate = StopGate(app, stop)
    post = asyncio.ensure_future(request(gate, "POST"))
    await asyncio.sleep(0.01)
    with anyio.fail_after(5):
        await stop.stop(InFlightCalls(), grace=0.1)
    app.release.set()
    await post


async def test_the_stop_cancels_every_call_in_flight() -> None:
    calls = InFlightCalls()
    scopes = [anyio.CancelScope() for _ in range(3)]
    for number, scope in enumerate(scopes):
        calls.register(f"key-{number}", "session", str(number), scope)
    await ServerStop().stop(calls, grace=0.1)
    assert all(scope.cancel_called for scope in scopes)
