"""Suspending and resuming credentials (oauth.suspension) in the data layer and the lookup at /mcp: a suspended
bearer token or connected app is told apart from an unknown one by the query that finds it (no second query), its
use is not recorded, its running calls are cancelled through a Revocation row that revokes nothing, and resuming
makes the same token work again."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application, set_token_value

from audit.models import AuditRecord
from oauth.credentials import KIND_BEARER, KIND_OAUTH, Authenticator, CredentialSuspended, build_authenticator
from oauth.models import SCOPE_ALL, AppSuspension, BearerToken, Revocation
from oauth.steady_tokens import SteadyTokens
from oauth.suspension import resume_app, resume_token, suspend_app, suspend_token
from oauth.tokens import issue_token
from tests.database import requires_sqlite

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(django_user_model: type[User]) -> User:
    return django_user_model.objects.create_user("agent-owner")


@pytest.fixture
def authenticator() -> Iterator[Authenticator]:
    built = build_authenticator(steady=False)  # the authoritative lookup alone, on this thread
    yield built
    built.close()


def new_app(name: str = "Claude") -> Application:
    return Application.objects.create(
        name=name, client_type="public", authorization_grant_type="authorization-code",
        redirect_uris="https://app.example/cb",
    )  # fmt: skip


def access_token(application: Application, user: User) -> str:
    raw = f"raw-{application.pk}-{user.pk}"
    token = AccessToken(application=application, user=user, scope=SCOPE_ALL, resource=[settings.MCP_RESOURCE_URL],
                        expires=timezone.now() + timedelta(hours=1))  # fmt: skip
    set_token_value(token, raw)
    token.save()
    return raw


def details(name: str) -> list[dict[str, object]]:
    return [dict(record.detail or {}) for record in AuditRecord.objects.filter(event=name).order_by("id")]


# --- bearer tokens ---------------------------------------------------------------------------------------------------


def test_a_suspended_token_is_in_force_but_not_valid_and_says_so(owner: User) -> None:
    token, _ = issue_token(owner, "laptop")
    assert suspend_token(token, None)
    token.refresh_from_db()
    assert token.status == "suspended" and token.suspended_at is not None
    assert list(BearerToken.objects.in_force()) == [token]
    assert not BearerToken.objects.valid().exists()
    BearerToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    token.refresh_from_db()
    assert token.status == "expired", "an expired token cannot be resumed into use: it says expired"


def test_a_suspended_token_is_refused_in_the_one_lookup_query_and_its_use_is_not_recorded(
    owner: User, authenticator: Authenticator
) -> None:
    token, raw = issue_token(owner, "laptop")
    suspend_token(token, None)
    with CaptureQueriesContext(connection) as queries, pytest.raises(CredentialSuspended) as refused:
        authenticator.principal_for(raw, "127.0.0.1", "")
    assert refused.value.kind == KIND_BEARER
    assert len(queries) == 1, [query["sql"] for query in queries]
    token.refresh_from_db()
    assert token.last_used_at is None and not AuditRecord.objects.filter(event="token.first_used").exists()


@requires_sqlite
@pytest.mark.django_db(transaction=True)  # the shortcut reads through a connection of its own
def test_the_event_loop_shortcut_leaves_a_suspended_token_to_the_authoritative_lookup(
    owner: User, authenticator: Authenticator
) -> None:
    token, raw = issue_token(owner, "laptop")
    assert authenticator.principal_for(raw, "127.0.0.1", "") is not None  # in steady use from now on
    shortcut = SteadyTokens()
    try:
        assert shortcut.find(raw) is not None
        suspend_token(token, None)
        assert shortcut.find(raw) is None
    finally:
        shortcut.close()
    with pytest.raises(CredentialSuspended):
        authenticator.principal_for(raw, "127.0.0.1", "")


def test_resuming_makes_the_same_token_work_again(owner: User, authenticator: Authenticator) -> None:
    token, raw = issue_token(owner, "laptop")
    suspend_token(token, None)
    assert resume_token(token, None)
    principal = authenticator.principal_for(raw, "127.0.0.1", "")
    assert principal is not None and principal.credential_id == token.pk
    assert not resume_token(token, None), "resuming twice changes nothing"


def test_suspending_cancels_running_calls_through_a_revocation_row_that_revokes_nothing(owner: User) -> None:
    token, _ = issue_token(owner, "laptop")
    assert suspend_token(token, None)
    assert not suspend_token(token, None), "suspending twice records nothing more"
    [revocation] = Revocation.objects.all()
    assert revocation.reason == Revocation.REASON_SUSPENSION and revocation.keys == [f"bearer:{token.pk}"]
    assert revocation.stop_background is False, "background processes keep running unless asked"
    token.refresh_from_db()
    assert token.revoked_at is None
    assert details("token.suspended") == [
        {"token_id": token.pk, "name": "laptop", "prefix": token.prefix, "owner": "agent-owner", "scope": "mcp",
         "stop_background": False},
    ]  # fmt: skip
    resume_token(token, None)
    assert details("token.resumed") == [
        {"token_id": token.pk, "name": "laptop", "prefix": token.prefix, "owner": "agent-owner", "scope": "mcp"}
    ]


def test_a_revoked_token_cannot_be_suspended(owner: User) -> None:
    token, _ = issue_token(owner, "laptop")
    BearerToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    assert not suspend_token(token, None) and not Revocation.objects.exists()


# --- connected apps --------------------------------------------------------------------------------------------------


def test_an_app_suspended_for_every_user_is_refused_in_the_one_lookup_query(
    owner: User, authenticator: Authenticator, django_user_model: type[User]
) -> None:
    app = new_app()
    raw = access_token(app, owner)
    other = access_token(new_app("Other"), owner)
    assert suspend_app(app, None, None, stop_background=True)
    with CaptureQueriesContext(connection) as queries, pytest.raises(CredentialSuspended) as refused:
        authenticator.principal_for(raw, "127.0.0.1", "")
    assert refused.value.kind == KIND_OAUTH
    assert len(queries) == 2, "the bearer lookup, then the access token's: nothing more"
    assert authenticator.principal_for(other, "127.0.0.1", "") is not None, "another app is not touched"
    [revocation] = Revocation.objects.all()
    assert revocation.prefixes == [f"oauth:{app.pk}:"] and revocation.keys == []
    assert revocation.stop_background is True
    assert resume_app(app, None, None)
    assert authenticator.principal_for(raw, "127.0.0.1", "") is not None


def test_an_app_suspended_for_one_user_still_works_for_another(
    owner: User, authenticator: Authenticator, django_user_model: type[User]
) -> None:
    app = new_app()
    bob = django_user_model.objects.create_user("bob")
    mine, bobs = access_token(app, owner), access_token(app, bob)
    assert suspend_app(app, bob, None)
    assert not suspend_app(app, bob, None), "suspended so already"
    assert authenticator.principal_for(mine, "127.0.0.1", "") is not None
    with pytest.raises(CredentialSuspended):
        authenticator.principal_for(bobs, "127.0.0.1", "")
    assert [revocation.keys for revocation in Revocation.objects.all()] == [[f"oauth:{app.pk}:{bob.pk}"]]
    assert details("oauth.client_suspended")[0]["owner"] == "bob"


def test_lifting_one_suspension_of_an_app_leaves_the_other(owner: User, authenticator: Authenticator) -> None:
    app = new_app()
    raw = access_token(app, owner)
    suspend_app(app, None, None)
    suspend_app(app, owner, None)
    assert AppSuspension.objects.count() == 2
    assert resume_app(app, owner, None)
    with pytest.raises(CredentialSuspended):
        authenticator.principal_for(raw, "127.0.0.1", "")
    assert resume_app(app, None, None) and not resume_app(app, None, None)
    assert authenticator.principal_for(raw, "127.0.0.1", "") is not None
    assert [detail["owner"] for detail in details("oauth.client_resumed")] == ["agent-owner", ""]


def test_an_expired_access_token_of_a_suspended_app_is_refused_as_unknown(
    owner: User, authenticator: Authenticator
) -> None:
    app = new_app()
    raw = access_token(app, owner)
    AccessToken.objects.update(expires=timezone.now() - timedelta(seconds=1))
    suspend_app(app, None, None)
    assert authenticator.principal_for(raw, "127.0.0.1", "") is None  # 401 as before: it would not work anyway
