"""Why a call was stopped (mcpserver.stop_reasons): each way of cancelling a running call notes its reason, the first
one holds, and a call cancelled with none was cancelled by its client."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from django.utils import timezone

from mcpserver.inflight import InFlightCalls
from mcpserver.live import LiveCall, LiveFeed
from mcpserver.stop_reasons import REVOCATION, ROTATION, StopNote, Stopped

pytestmark = pytest.mark.anyio  # a cancel scope needs a running event loop


async def test_each_way_of_cancelling_a_call_notes_why() -> None:
    calls = InFlightCalls()
    notes = [StopNote() for _ in range(3)]
    scopes = [anyio.CancelScope() for _ in range(3)]
    calls.register("bearer:1", "s1", "7", scopes[0], notes[0])
    calls.register("bearer:2", "s2", "8", scopes[1], notes[1])
    calls.register("bearer:3", "s3", "9", scopes[2], notes[2])
    assert calls.cancel_request("s1", {"7"}) == 1
    later = timezone.now() + timedelta(seconds=1)
    assert calls.cancel_credentials(lambda key: key == "bearer:2", later, Stopped(REVOCATION, "admin", "bearer")) == 1
    assert calls.cancel_all() == 3
    assert all(scope.cancel_called for scope in scopes)
    assert [note.why().sentence() for note in notes] == [
        "cancelled: the client hung up before the answer",  # the first reason holds, not the shutdown after it
        "cancelled: its credential was revoked by admin (bearer)",
        "cancelled: the server was stopping",
    ]
    assert notes[1].why().as_detail() == {"channel": "revocation", "by": "admin", "detail": "bearer"}


async def test_the_consoles_stop_names_the_staff_user_and_a_call_stopped_by_nobody_was_its_clients_doing() -> None:
    feed, note, scope = LiveFeed(), StopNote(), anyio.CancelScope()
    feed.calls["c" * 32] = LiveCall("c" * 32, "terminal_exec", "sleep 9", "alice", "laptop", "bearer:1", "", scope=scope,
                                    note=note)  # fmt: skip
    assert feed.stop("c" * 32, "admin") and not feed.stop("d" * 32, "admin")
    assert note.why().sentence() == "stopped by admin from the console's Live view" and scope.cancel_called
    assert StopNote().why().sentence() == "cancelled by the client (it cancelled the request or ended its session)"
    assert Stopped(ROTATION, "root").sentence() == "cancelled: all credentials were rotated by root"
