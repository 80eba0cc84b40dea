"""The messages by which the console's sessions page reaches every worker (mcpserver.workers), over Channels'
in-memory layer standing in for Redis's: a worker answers with the sessions it holds and ends one it holds when
asked; the asking side gathers every other worker's answer and names those that stay silent."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest
from channels.layers import BaseChannelLayer, get_channel_layer
from django.test import override_settings

from mcpserver import workers
from mcpserver.sessions import OpenSession, SessionLedger
from mcpserver.workers import GROUP, WorkerBus, ask_worker_to_end_session, ask_workers_for_sessions, worker_group
from oauth.credentials import Principal

pytestmark = [pytest.mark.anyio]


class FakeTransport:
    def __init__(self, session_id: str) -> None:
        self.mcp_session_id: str | None = session_id
        self.idle_scope = anyio.CancelScope()
        self.terminated = False

    async def terminate(self) -> None:
        self.terminated = True


def held(ledger: SessionLedger, session_id: str) -> OpenSession:
    entry = ledger.add("bearer:7", 3)
    entry.principal = Principal(
        user_id=3, username="alice", credential_kind="bearer", credential_id=7, credential_name="laptop",
        scopes=frozenset({"mcp"}), client_address="203.0.113.9", user_agent="agent/1",
    )  # fmt: skip
    entry.bind(FakeTransport(session_id))
    return entry


def ledger() -> SessionLedger:
    return SessionLedger(per_credential=4, per_user=8, unused_timeout=60)


async def answer_to(bus: WorkerBus, layer: BaseChannelLayer, message: dict[str, Any]) -> dict[str, Any]:
    reply_to = await layer.new_channel()
    await bus.handle({**message, "reply_to": reply_to})
    answer = await layer.receive(reply_to)
    assert isinstance(answer, dict)
    return answer


async def test_a_worker_answers_with_the_sessions_it_holds_and_ends_one_when_asked() -> None:
    layer = get_channel_layer()
    sessions = ledger()
    entry = held(sessions, "w2-abc")
    bus = WorkerBus(on_revocation=lambda: None, sessions=sessions)
    bus._layer = layer  # as start() sets it, without the receive loop
    with override_settings(WORKER=2):
        listed = await answer_to(bus, layer, {"type": "workers.list_sessions", "from": "another-process"})
        [row] = listed["sessions"]
        assert (listed["worker"], row["session_id"], row["worker"], row["credential_name"]) == (
            2, "w2-abc", 2, "laptop",
        )  # fmt: skip
        assert (row["client_address"], row["user_agent"], row["username"]) == ("203.0.113.9", "agent/1", "alice")
        ended = await answer_to(bus, layer, {"type": "workers.end_session", "session_id": "w2-abc", "by": "boss"})
    assert ended["session"]["session_id"] == "w2-abc"
    assert isinstance(entry.transport, FakeTransport) and entry.transport.terminated
    assert entry.transport.idle_scope.cancel_called and sessions.made() == []
    again = await answer_to(bus, layer, {"type": "workers.end_session", "session_id": "w2-abc", "by": "boss"})
    assert again["session"] is None


async def joined(layer: BaseChannelLayer, number: int) -> str:
    """A channel of worker `number`, in the groups a worker joins."""
    channel = await layer.new_channel()
    await layer.group_add(GROUP, channel)
    await layer.group_add(worker_group(number), channel)
    return channel


async def fake_worker(layer: BaseChannelLayer, channel: str, number: int, rows: list[dict[str, Any]]) -> None:
    """Worker `number`: answers requests for its sessions and to end one, as WorkerBus does."""
    while True:
        message = await layer.receive(channel)
        if message["type"] == "workers.list_sessions":
            await layer.send(message["reply_to"], {"type": "workers.sessions", "worker": number, "sessions": rows})
        elif message["type"] == "workers.end_session":
            ended = next((row for row in rows if row["session_id"] == message["session_id"]), None)
            await layer.send(message["reply_to"], {"type": "workers.session_ended", "session": ended})


@override_settings(REDIS_URL="redis://stand-in", WORKERS=3, WORKER=1)  # shared(): the in-memory layer
async def test_the_asking_worker_gathers_the_others_sessions_and_names_the_silent_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers, "ANSWER_SECONDS", 0.3)
    layer = get_channel_layer()
    rows = [{"session_id": "w2-one", "worker": 2}, {"session_id": "w2-two", "worker": 2}]
    second = asyncio.ensure_future(fake_worker(layer, await joined(layer, 2), 2, rows))  # worker 3 never answers
    try:
        found, silent = await ask_workers_for_sessions()
        assert [row["session_id"] for row in found] == ["w2-one", "w2-two"] and silent == [3]
        assert await ask_worker_to_end_session(2, "w2-two", "boss") == rows[1]
        assert await ask_worker_to_end_session(2, "w2-gone", "boss") is None
        assert await ask_worker_to_end_session(3, "w3-any", "boss") is None, "a silent worker ends nothing"
    finally:
        second.cancel()


async def test_one_worker_alone_asks_nobody() -> None:
    assert await ask_workers_for_sessions() == ([], [])
