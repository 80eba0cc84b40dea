"""Rotating all credentials: the confirmation page, the result and `rotate_tokens` count the same, exact things,
and name what will be cut off."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.core.management import call_command
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application, Grant, RefreshToken

from audit.log import Actor
from oauth import rotation
from oauth.models import BearerToken
from oauth.rotation import NAMED_AT_MOST, REGISTRATION_SCOPE, RotationCounts, describe, preview, rotate_all
from oauth.tokens import issue_token

pytestmark = pytest.mark.django_db
ADMIN = Actor(username="admin", credential_kind="session")


@pytest.fixture
def admin_user() -> Any:
    return get_user_model().objects.create_superuser("admin", password="correct horse battery")


def client(name: str) -> Application:
    return Application.objects.create(
        name=name,
        client_type="public",
        authorization_grant_type="authorization-code",
        redirect_uris="https://c.example/cb",
    )


def access_token(application: Application, user: Any, scope: str = "mcp", hours: float = 1) -> AccessToken:
    return AccessToken.objects.create(
        application=application, user=user, scope=scope, token=f"t-{AccessToken.objects.count()}-{scope}-{hours}",
        expires=timezone.now() + timedelta(hours=hours),
    )  # fmt: skip


@pytest.fixture
def the_issues_server(admin_user: Any) -> dict[str, Any]:
    """What the issue saw: 3 working bearer tokens beside 2 expired ones and a revoked one; one real OAuth client
    with an access and a refresh token; 6 clients that only registered (a registration token each, no user)."""
    for name in ("laptop", "ci", "phone"):
        issue_token(admin_user, name)
    for name in ("old-1", "old-2"):
        token, _ = issue_token(admin_user, name)
        BearerToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(days=1))
    gone, _ = issue_token(admin_user, "gone")
    BearerToken.objects.filter(pk=gone.pk).update(revoked_at=timezone.now())
    claude = client("Claude")
    real = access_token(claude, admin_user)
    RefreshToken.objects.create(application=claude, user=admin_user, token="r-1", access_token=real)
    access_token(claude, admin_user, hours=-1)  # expired: nothing to cut off
    Grant.objects.create(application=claude, user=admin_user, code="old-code", expires=timezone.now() - timedelta(1),
                         redirect_uri="https://c.example/cb", code_challenge="x" * 43, code_challenge_method="S256")  # fmt: skip
    for number in range(6):
        access_token(client(f"registered only {number}"), None, scope=REGISTRATION_SCOPE)
    other = SessionStore()
    other["x"] = 1
    other.create()
    return {"claude": claude}


def test_the_preview_counts_what_works_now_and_the_rotation_reports_the_same(
    admin_user: Any, the_issues_server: dict[str, Any]
) -> None:
    cut_off = preview()
    expected = RotationCounts(
        bearer_tokens=3, access_tokens=1, registration_tokens=6, refresh_tokens=1, grants=0, clients=1, sessions=1
    )
    assert cut_off.counts == expected
    assert sorted(label.split(" (")[0] for label in cut_off.bearer_tokens) == ["ci", "laptop", "phone"]
    assert all("owner admin" in label and "sst_" in label for label in cut_off.bearer_tokens)
    assert cut_off.clients == [f"Claude (client {the_issues_server['claude'].client_id})"]

    result = rotate_all(by=ADMIN, new_owner=admin_user)
    assert result.counts == expected
    # Everything went all the same, dead or alive; only the new token is left.
    assert list(BearerToken.objects.filter(revoked_at__isnull=True)) == [result.new_token]
    assert not AccessToken.objects.exists() and not Grant.objects.exists()
    assert not RefreshToken.objects.filter(revoked__isnull=True).exists()


def test_the_result_sentence_names_the_same_numbers_and_registration_tokens_apart() -> None:
    counts = RotationCounts(
        bearer_tokens=3, access_tokens=1, registration_tokens=6, refresh_tokens=1, grants=0, clients=1, sessions=2
    )
    assert describe(counts) == (
        "Revoked 3 bearer tokens, 1 OAuth access token, 1 refresh token and 0 pending authorization codes of "
        "1 OAuth client, and 6 client registration tokens; signed out 2 other admin sessions."
    )
    assert "registration" not in describe(RotationCounts(1, 0, 0, 0, 0, 0, 0))


def test_the_command_prints_the_exact_counts(admin_user: Any, the_issues_server: dict[str, Any]) -> None:
    counts = preview().counts
    err, out = StringIO(), StringIO()
    call_command("rotate_tokens", stdout=out, stderr=err)
    assert describe(counts) in err.getvalue()
    assert "Revoked 3 bearer tokens, 1 OAuth access token" in err.getvalue()
    assert out.getvalue().strip().startswith("sst_")


def test_the_confirmation_names_at_most_twenty_of_each_then_says_how_many_more(admin_user: Any) -> None:
    for number in range(NAMED_AT_MOST + 3):
        issue_token(admin_user, f"token {number}")
    cut_off = preview()
    assert len(cut_off.bearer_tokens) == NAMED_AT_MOST and cut_off.more_bearer_tokens == 3
    assert preview(keep_bearer=True).bearer_tokens == []


def test_the_new_tokens_name_is_unique_among_unrevoked_tokens(admin_user: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    moment = timezone.localtime()
    monkeypatch.setattr(rotation.timezone, "localtime", lambda *args: moment)
    first = rotate_all(by=ADMIN, new_owner=admin_user, keep_bearer=True).new_token
    second = rotate_all(by=ADMIN, new_owner=admin_user, keep_bearer=True).new_token
    third = rotate_all(by=ADMIN, new_owner=admin_user, keep_bearer=True).new_token
    base = f"rotation {moment:%Y-%m-%d %H:%M:%S}"
    assert (first.name, second.name, third.name) == (base, f"{base} (2)", f"{base} (3)")
    BearerToken.objects.filter(pk=second.pk).update(revoked_at=timezone.now())
    assert rotation.unique_token_name(base) == f"{base} (2)", "a revoked token's name is free again"
