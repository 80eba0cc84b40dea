"""The per-process cache of the command policy (mcpserver/policy_source.py): a version it cannot read (a dropped
database connection fails its query once) leaves the policy read before in force; with none read yet, it raises,
and dispatch refuses the call."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.db import DatabaseError

from mcpserver import policy_source
from mcpserver.policy_source import PolicyCache, replace_policy

pytestmark = [pytest.mark.inprocess, pytest.mark.anyio, pytest.mark.django_db(transaction=True)]


def unreadable() -> int:
    raise DatabaseError("server closed the connection unexpectedly")


async def test_a_version_that_cannot_be_read_leaves_the_policy_read_before(monkeypatch: pytest.MonkeyPatch) -> None:
    await sync_to_async(replace_policy)({"rules": [{"id": "no-sudo", "decision": "deny", "commands": ["sudo"]}]}, "t")
    cache = PolicyCache()
    before = await cache.current()
    monkeypatch.setattr(policy_source, "RECHECK_SECONDS", 0.0)
    monkeypatch.setattr(policy_source, "policy_version", unreadable)
    assert await cache.current() is before and [rule.id for rule in before.policy.rules] == ["no-sudo"]
    with pytest.raises(DatabaseError):
        await PolicyCache().current()  # nothing read yet: no policy to fall back on
