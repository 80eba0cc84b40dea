"""Bearer tokens: stored as a hash, shown once, scoped, expiring, revocable, imported from SANDSTORM_MCP_TOKEN."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application, set_token_value

from oauth.credentials import Principal, build_authenticator
from oauth.models import BearerToken, hash_token
from oauth.tokens import import_bootstrap_token, issue_token

# transaction=True: authentication reads the database from a worker thread, which must see committed rows.
pytestmark = pytest.mark.django_db(transaction=True)
Authenticate = Callable[..., Principal | None]


@pytest.fixture(
    params=[pytest.param(None, id="as-built-for-this-database"), pytest.param(False, id="without-the-steady-shortcut")]
)
def authenticate(request: pytest.FixtureRequest) -> Iterator[Authenticate]:
    """The authenticator as the server builds it for this database, and as for a database other than SQLite."""
    authenticator = build_authenticator(steady=request.param)
    yield async_to_sync(authenticator)
    authenticator.close()


@pytest.fixture
def admin_user() -> Any:
    return get_user_model().objects.create_superuser("admin", password="correct horse battery")


def test_create_token_prints_the_token_alone_on_its_last_line_and_stores_only_its_hash(admin_user: Any) -> None:
    out = StringIO()
    call_command("create_token", "laptop", "--scope", "mcp:read", "--expires-days", "7", stdout=out, stderr=StringIO())
    raw = out.getvalue().strip().splitlines()[-1]
    token = BearerToken.objects.get(name="laptop")
    assert raw.startswith("sst_") and len(raw) > 40
    assert token.token_hash == hash_token(raw) and raw not in token.token_hash
    assert raw.startswith(token.prefix) and len(token.prefix) < 12
    assert token.scope == "mcp:read"
    assert token.expires_at is not None
    assert timedelta(days=6, hours=23) < token.expires_at - timezone.now() <= timedelta(days=7)


def test_create_token_refuses_an_unknown_user(admin_user: Any) -> None:
    with pytest.raises(CommandError, match="no user named 'ghost'"):
        call_command("create_token", "x", "--user", "ghost", stdout=StringIO(), stderr=StringIO())


def test_a_valid_token_authenticates_as_its_owner_with_its_scope(admin_user: Any, authenticate: Authenticate) -> None:
    token, raw = issue_token(admin_user, "reader", scope="mcp:read")
    principal = authenticate(raw, client_address="127.0.0.1", user_agent="pytest")
    assert principal is not None
    assert (principal.username, principal.credential_kind, principal.credential_id) == ("admin", "bearer", token.pk)
    assert principal.read_only and principal.scopes == frozenset({"mcp:read"})
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_revoked_expired_and_unknown_tokens_do_not_authenticate(admin_user: Any, authenticate: Authenticate) -> None:
    revoked, revoked_raw = issue_token(admin_user, "revoked")
    BearerToken.objects.filter(pk=revoked.pk).update(revoked_at=timezone.now())
    expired, expired_raw = issue_token(admin_user, "expired")
    BearerToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert authenticate(revoked_raw) is None
    assert authenticate(expired_raw) is None
    assert authenticate("sst_" + "x" * 43) is None
    assert authenticate("") is None


def test_a_token_of_a_deactivated_user_does_not_authenticate(admin_user: Any, authenticate: Authenticate) -> None:
    _, raw = issue_token(admin_user, "owner-gone")
    admin_user.is_active = False
    admin_user.save()
    assert authenticate(raw) is None


def test_the_bootstrap_token_is_imported_once_and_stays_revoked(admin_user: Any, authenticate: Authenticate) -> None:
    raw = "bootstrap-secret-value-0123456789"
    assert import_bootstrap_token(admin_user, raw) is True
    assert import_bootstrap_token(admin_user, raw) is False
    BearerToken.objects.filter(name="bootstrap").update(revoked_at=timezone.now())
    assert import_bootstrap_token(admin_user, raw) is False
    assert BearerToken.objects.filter(name="bootstrap").count() == 1
    assert authenticate(raw) is None


def test_a_short_bootstrap_token_is_refused(admin_user: Any) -> None:
    with pytest.raises(ValueError, match="at least 16"):
        import_bootstrap_token(admin_user, "short")


def test_revoke_token_by_name(admin_user: Any, authenticate: Authenticate) -> None:
    _, raw = issue_token(admin_user, "ci")
    out = StringIO()
    call_command("revoke_token", "ci", stdout=out)
    assert "Revoked 1 token" in out.getvalue()
    assert authenticate(raw) is None


def test_an_oauth_token_is_held_to_the_resource_of_the_settings_in_force(
    admin_user: Any, authenticate: Authenticate, settings: Any
) -> None:
    application = Application.objects.create(
        name="Claude",
        client_type="public",
        authorization_grant_type="authorization-code",
        redirect_uris="https://claude.ai/cb",
    )
    token = AccessToken(application=application, user=admin_user, scope="mcp", resource=[settings.MCP_RESOURCE_URL],
                        expires=timezone.now() + timedelta(hours=1))  # fmt: skip
    raw = "oauth-access-token-for-the-test-0123456789"
    set_token_value(token, raw)
    token.save()
    principal = authenticate(raw)
    assert principal is not None and principal.credential_kind == "oauth" and principal.application_id == application.pk
    settings.MCP_RESOURCE_URL = "https://elsewhere.example/mcp"  # the same authenticator, other settings
    assert authenticate(raw) is None
