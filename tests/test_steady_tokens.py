"""Bearer tokens in steady use, checked on the event loop's thread (SQLite): accepted only while the database says
they are active, and every other case decided by the authoritative lookup."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from oauth import credentials
from oauth.inline import SteadyTokens
from oauth.models import BearerToken
from oauth.tokens import issue_token
from tests.database import requires_sqlite

pytestmark = [requires_sqlite, pytest.mark.django_db(transaction=True)]

authenticate = async_to_sync(credentials.authenticate)


class Lookups:
    """Counts the calls that reached the authoritative lookup (its thread)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = credentials._principal_for

        def counted(*args: Any) -> Any:
            self.count += 1
            return real(*args)

        monkeypatch.setattr(credentials, "_principal_for", counted)


@pytest.fixture
def steady(monkeypatch: pytest.MonkeyPatch) -> Iterator[SteadyTokens]:
    tokens = SteadyTokens()  # of this test's database
    monkeypatch.setattr(credentials, "_STEADY", tokens)
    yield tokens
    tokens.close()


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch, steady: SteadyTokens) -> Lookups:
    return Lookups(monkeypatch)


@pytest.fixture
def owner():  # type: ignore[no-untyped-def]
    return get_user_model().objects.create_user("agent-owner", password="correct horse battery")


@pytest.fixture
def used_token(owner) -> tuple[BearerToken, str]:  # type: ignore[no-untyped-def]
    token, raw = issue_token(owner, "laptop", scope="mcp:read")
    assert authenticate(raw) is not None  # the first use, written by the authoritative lookup
    return token, raw


def test_a_token_used_a_moment_ago_is_accepted_without_the_lookup_thread(used_token, lookups: Lookups) -> None:  # type: ignore[no-untyped-def]
    token, raw = used_token
    principal = authenticate(raw, client_address="10.0.0.9", user_agent="agent/1")
    assert lookups.count == 0
    assert principal is not None
    assert (principal.credential_kind, principal.credential_id, principal.credential_name) == ("bearer", token.pk, "laptop")
    assert (principal.username, principal.scopes, principal.client_address, principal.user_agent) == (
        "agent-owner", frozenset({"mcp:read"}), "10.0.0.9", "agent/1"
    )  # fmt: skip


def test_a_first_use_goes_to_the_lookup_that_records_it(owner, lookups: Lookups) -> None:  # type: ignore[no-untyped-def]
    token, raw = issue_token(owner, "fresh")
    assert authenticate(raw) is not None
    assert lookups.count == 1
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_a_last_use_older_than_the_precision_goes_to_the_lookup_that_updates_it(used_token, lookups: Lookups) -> None:  # type: ignore[no-untyped-def]
    token, raw = used_token
    long_ago = timezone.now() - timedelta(minutes=5)
    BearerToken.objects.filter(pk=token.pk).update(last_used_at=long_ago)
    assert authenticate(raw) is not None
    assert lookups.count == 1
    token.refresh_from_db()
    assert token.last_used_at > long_ago


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda token: BearerToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now()), id="revoked"),
        pytest.param(lambda token: BearerToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1)), id="expired"),
        pytest.param(lambda token: get_user_model().objects.filter(pk=token.user_id).update(is_active=False), id="owner-deactivated"),
        pytest.param(lambda token: BearerToken.objects.filter(pk=token.pk).update(scope="openid"), id="no-mcp-scope"),
        pytest.param(lambda token: BearerToken.objects.filter(pk=token.pk).delete(), id="deleted"),
    ],
)
def test_a_token_in_steady_use_is_refused_from_the_request_after_it_stops_being_valid(used_token, change) -> None:  # type: ignore[no-untyped-def]
    token, raw = used_token
    assert authenticate(raw) is not None  # in steady use: checked on the caller's thread
    change(token)
    assert authenticate(raw) is None


def test_a_token_that_expires_later_is_still_accepted(used_token, lookups: Lookups) -> None:  # type: ignore[no-untyped-def]
    token, raw = used_token
    BearerToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() + timedelta(hours=1))
    assert authenticate(raw) is not None
    assert lookups.count == 0


def test_an_unknown_token_is_left_to_the_lookup(lookups: Lookups) -> None:
    assert authenticate("sst_" + "y" * 43) is None
    assert lookups.count == 1


def test_a_write_lock_held_elsewhere_does_not_hold_the_check_up(used_token, lookups: Lookups) -> None:  # type: ignore[no-untyped-def]
    _, raw = used_token
    with sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None) as other:
        other.execute("BEGIN IMMEDIATE")  # a writer (the audit log, the admin) in the middle of a transaction
        try:
            assert authenticate(raw) is not None
        finally:
            other.execute("ROLLBACK")
    assert lookups.count == 0
