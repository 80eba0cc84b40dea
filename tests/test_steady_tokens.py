"""Bearer tokens in steady use, checked on the event loop's thread (SQLite): accepted only while the database says
they are active, and every other case decided by the authoritative lookup."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from oauth.bearer_lookup import DIGEST_STAND_IN, compile_lookup
from oauth.credentials import Authenticator, Principal, build_authenticator
from oauth.models import BearerToken
from oauth.steady_tokens import SteadyTokens
from oauth.tokens import issue_token
from tests.database import requires_sqlite

pytestmark = [requires_sqlite, pytest.mark.django_db(transaction=True)]
Authenticate = Callable[..., Principal | None]
UsedToken = tuple[BearerToken, str]


class Lookups:
    """Counts the calls that reached the authoritative lookup (its thread)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, authenticator: Authenticator) -> None:
        self.count = 0
        real = authenticator.principal_for

        def counted(*args: Any) -> Any:
            self.count += 1
            return real(*args)

        monkeypatch.setattr(authenticator, "principal_for", counted)


@pytest.fixture
def authenticator() -> Iterator[Authenticator]:
    built = build_authenticator()  # of this test's database, SQLite: with the shortcut
    assert built.checks_steady_tokens
    yield built
    built.close()


@pytest.fixture
def authenticate(authenticator: Authenticator) -> Authenticate:
    return async_to_sync(authenticator)


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch, authenticator: Authenticator) -> Lookups:
    return Lookups(monkeypatch, authenticator)


@pytest.fixture
def owner() -> Any:
    return get_user_model().objects.create_user("agent-owner", password="correct horse battery")


@pytest.fixture
def used_token(owner: Any, authenticate: Authenticate) -> UsedToken:
    token, raw = issue_token(owner, "laptop", scope="mcp:read")
    assert authenticate(raw) is not None  # the first use, written by the authoritative lookup
    return token, raw


def test_a_token_used_a_moment_ago_is_accepted_without_the_lookup_thread(
    used_token: UsedToken, lookups: Lookups, authenticate: Authenticate
) -> None:
    token, raw = used_token
    principal = authenticate(raw, client_address="10.0.0.9", user_agent="agent/1")
    assert lookups.count == 0
    assert principal is not None
    assert (principal.credential_kind, principal.credential_id, principal.credential_name) == (
        "bearer",
        token.pk,
        "laptop",
    )
    assert (principal.username, principal.scopes, principal.client_address, principal.user_agent) == (
        "agent-owner", frozenset({"mcp:read"}), "10.0.0.9", "agent/1"
    )  # fmt: skip


def test_a_first_use_goes_to_the_lookup_that_records_it(
    owner: Any, lookups: Lookups, authenticate: Authenticate
) -> None:
    token, raw = issue_token(owner, "fresh")
    assert authenticate(raw) is not None
    assert lookups.count == 1
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_a_last_use_older_than_the_precision_goes_to_the_lookup_that_updates_it(
    used_token: UsedToken, lookups: Lookups, authenticate: Authenticate
) -> None:
    token, raw = used_token
    long_ago = timezone.now() - timedelta(minutes=5)
    BearerToken.objects.filter(pk=token.pk).update(last_used_at=long_ago)
    assert authenticate(raw) is not None
    assert lookups.count == 1
    token.refresh_from_db()
    assert token.last_used_at is not None and token.last_used_at > long_ago


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            lambda token: BearerToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now()), id="revoked"
        ),
        pytest.param(
            lambda token: BearerToken.objects.filter(pk=token.pk).update(
                expires_at=timezone.now() - timedelta(seconds=1)
            ),
            id="expired",
        ),
        pytest.param(
            lambda token: get_user_model().objects.filter(pk=token.user_id).update(is_active=False),
            id="owner-deactivated",
        ),
        pytest.param(lambda token: BearerToken.objects.filter(pk=token.pk).update(scope="openid"), id="no-mcp-scope"),
        pytest.param(lambda token: BearerToken.objects.filter(pk=token.pk).delete(), id="deleted"),
    ],
)
def test_a_token_in_steady_use_is_refused_from_the_request_after_it_stops_being_valid(
    used_token: UsedToken, change: Callable[[BearerToken], Any], authenticate: Authenticate
) -> None:
    token, raw = used_token
    assert authenticate(raw) is not None  # in steady use: checked on the caller's thread
    change(token)
    assert authenticate(raw) is None


def test_a_token_that_expires_later_is_still_accepted(
    used_token: UsedToken, lookups: Lookups, authenticate: Authenticate
) -> None:
    token, raw = used_token
    BearerToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() + timedelta(hours=1))
    assert authenticate(raw) is not None
    assert lookups.count == 0


def test_an_unknown_token_is_left_to_the_lookup(lookups: Lookups, authenticate: Authenticate) -> None:
    assert authenticate("sst_" + "y" * 43) is None
    assert lookups.count == 1


def test_a_write_lock_held_elsewhere_does_not_hold_the_check_up(
    used_token: UsedToken, lookups: Lookups, authenticate: Authenticate
) -> None:
    _, raw = used_token
    with sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None) as other:
        other.execute("BEGIN IMMEDIATE")  # a writer (the audit log, the admin) in the middle of a transaction
        try:
            assert authenticate(raw) is not None
        finally:
            other.execute("ROLLBACK")
    assert lookups.count == 0


def _set(field: str, offset: timedelta | None) -> Callable[[BearerToken], Any]:
    """Set the token's `field` to the moment of the change plus `offset` (None: empty)."""
    return lambda token: BearerToken.objects.filter(pk=token.pk).update(
        **{field: None if offset is None else timezone.now() + offset}
    )


# (what happens to a token in steady use, the shortcut accepts it, the authoritative lookup accepts it)
AGREEMENT = [
    pytest.param(lambda token: None, True, True, id="in-steady-use"),
    pytest.param(_set("expires_at", timedelta(hours=1)), True, True, id="expires-later"),
    pytest.param(_set("revoked_at", timedelta(0)), False, False, id="revoked"),
    pytest.param(_set("expires_at", -timedelta(seconds=1)), False, False, id="expired"),
    pytest.param(
        lambda token: get_user_model().objects.filter(pk=token.user_id).update(is_active=False),
        False,
        False,
        id="owner-deactivated",
    ),
    pytest.param(_set("last_used_at", -timedelta(minutes=5)), False, True, id="last-used-long-ago"),
    pytest.param(_set("last_used_at", None), False, True, id="never-used"),
]


@pytest.mark.parametrize(("change", "shortcut_accepts", "valid"), AGREEMENT)
def test_the_shortcut_accepts_only_tokens_the_authoritative_lookup_accepts(
    used_token: UsedToken,
    authenticator: Authenticator,
    change: Callable[[BearerToken], Any],
    shortcut_accepts: bool,
    valid: bool,
) -> None:
    token, raw = used_token
    change(token)
    shortcut = SteadyTokens()
    try:
        steady = shortcut.find(raw)
    finally:
        shortcut.close()
    assert BearerToken.objects.valid().filter(pk=token.pk).exists() is valid  # the definition itself
    principal = authenticator.principal_for(raw, "", "")  # the authoritative lookup, on this thread
    assert (principal is not None) is valid
    assert (steady is not None) is shortcut_accepts
    if steady is not None:
        assert principal is not None
        assert steady == (
            principal.credential_id,
            principal.credential_name,
            "mcp:read",
            principal.user_id,
            principal.username,
            principal.confinement,
        )


def test_built_without_the_shortcut_a_token_in_steady_use_goes_to_the_authoritative_lookup(
    used_token: UsedToken, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, raw = used_token
    authenticator = build_authenticator(steady=False)  # as for PostgreSQL
    try:
        lookups = Lookups(monkeypatch, authenticator)
        assert not authenticator.checks_steady_tokens
        assert async_to_sync(authenticator)(raw) is not None
        assert lookups.count == 1
    finally:
        authenticator.close()


def test_a_token_query_without_a_place_for_the_present_moment_is_refused_at_start_up() -> None:
    with pytest.raises(RuntimeError, match="expected parameters"):
        compile_lookup(BearerToken.objects.filter(token_hash=DIGEST_STAND_IN), connection, frozenset({"digest", "now"}))
