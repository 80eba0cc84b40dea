"""The session ledger in process: per-credential and per-user caps, who is pushed out, and unused sessions."""

from __future__ import annotations

import anyio
import pytest

from mcpserver.sessions import OpenSession, SessionLedger, goes_beyond_handshake

pytestmark = [pytest.mark.anyio]


class FakeTransport:
    def __init__(self, name: str) -> None:
        self.mcp_session_id: str | None = name  # as SessionTransport declares it (None before the SDK assigns one)
        self.idle_scope = anyio.CancelScope()

    async def terminate(self) -> None:
        """As SessionTransport declares it; the ledger never calls it (the console's Disconnect does)."""


def was_cancelled(entry: OpenSession) -> bool:
    """Whether the ledger cancelled the session's transport (which ends the session in the SDK)."""
    return isinstance(entry.transport, FakeTransport) and entry.transport.idle_scope.cancel_called


def opened(ledger: SessionLedger, key: str, user_id: int = 1, *, busy: bool = False) -> OpenSession:
    entry = ledger.admit(key, user_id)
    assert entry is not None
    entry.bind(FakeTransport(f"{key}-{ledger.open_count(key)}"))
    if busy:
        entry.request_started()
    return entry


async def test_a_credential_at_its_cap_pushes_out_its_own_least_recently_used_idle_session() -> None:
    ledger = SessionLedger(per_credential=3, per_user=100, unused_timeout=60)
    first, second, third = (opened(ledger, "bearer:1") for _ in range(3))
    first.request_started()  # used most recently
    first.request_ended()
    fourth = opened(ledger, "bearer:1")
    assert second.closed and was_cancelled(second)
    assert not first.closed and not third.closed and not fourth.closed
    assert ledger.open_count("bearer:1") == 3


async def test_a_credential_whose_sessions_are_all_busy_is_refused_and_others_are_not_touched() -> None:
    ledger = SessionLedger(per_credential=2, per_user=100, unused_timeout=60)
    other = opened(ledger, "bearer:2")
    for _ in range(2):
        opened(ledger, "bearer:1", busy=True)
    assert ledger.admit("bearer:1", 1) is None
    assert not other.closed and ledger.admit("bearer:2", 1) is not None


async def test_many_credentials_of_one_user_stop_at_the_users_cap_without_pushing_out_each_other() -> None:
    ledger = SessionLedger(per_credential=4, per_user=10, unused_timeout=60)
    sessions = [opened(ledger, f"bearer:{token}", user_id=7) for token in range(5) for _ in range(2)]
    assert ledger.admit("bearer:99", 7) is None, "a sixth token of the user gets no session"
    assert not any(entry.closed for entry in sessions)
    assert opened(ledger, "bearer:0", user_id=7) is not None, "a token of the user may still replace its own idle one"
    assert sum(entry.closed for entry in sessions) == 1
    assert ledger.admit("bearer:1000", 8) is not None, "another user is not affected"


async def test_a_reservation_that_made_no_session_frees_its_place() -> None:
    ledger = SessionLedger(per_credential=1, per_user=1, unused_timeout=60)
    entry = ledger.admit("bearer:1", 1)
    assert entry is not None and ledger.admit("bearer:1", 1) is None, "a pending opening request is busy"
    entry.release()
    entry.release()
    assert ledger.admit("bearer:1", 1) is not None


async def test_a_session_without_a_request_beyond_the_handshake_is_closed_after_the_unused_timeout() -> None:
    ledger = SessionLedger(per_credential=5, per_user=5, unused_timeout=0.2)
    unused, used = opened(ledger, "bearer:1"), opened(ledger, "bearer:1")
    unused.note_body(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')
    used.note_body(b'{"jsonrpc": "2.0", "id": 2, "method": "tools/list"}')
    with anyio.fail_after(30):  # a deadline for a loaded machine; the timeout is 0.2 s
        while not unused.closed:
            await anyio.sleep(0.01)
    assert unused.closed and was_cancelled(unused)
    assert not used.closed and ledger.open_count("bearer:1") == 1


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}', False),
        (b'{"jsonrpc": "2.0", "method": "notifications/initialized"}', False),
        (
            b'[{"jsonrpc": "2.0", "method": "notifications/initialized"}, {"jsonrpc": "2.0", "id": 3, "method": "ping"}]',
            True,
        ),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {}}', True),
        (b"[" * 5000, False),
    ],
)
def test_only_requests_beyond_the_handshake_count_as_use(body: bytes, expected: bool) -> None:
    assert goes_beyond_handshake(body) is expected
