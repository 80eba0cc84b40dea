"""The consent page as an upgrade (oauth.views.consent): an app that holds read-only access for the signed-in user and
asks for `mcp` (its client stepping up after a 403 `insufficient_scope` at /mcp) is shown as an upgrade of that
connection; approving grants full access, denying leaves the read-only access working; the audit record says it was
an upgrade. In-process, with Django's test client. (The SDK clients doing it end to end:
tests/test_oauth_step_up_live.py.)"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from oauth2_provider.models import AccessToken, RefreshToken

from oauth.credentials import build_authenticator
from tests.oauth_flow import (
    HERE,
    AdminHere,
    Client,
    audit_events_here,
    authorize_url,
    exchange_here,
    obtain_tokens_here,
    pkce,
    query_of,
    refresh_here,
    register_here,
)

pytestmark = pytest.mark.django_db
STEP_UP_SCOPE = "mcp mcp:read"  # what the SDK clients ask for: what they hold, and what the challenge named


@pytest.fixture
def admin(db: None) -> AdminHere:
    return AdminHere()


@pytest.fixture
def read_only(db: None, admin: AdminHere) -> tuple[Client, dict[str, str]]:
    """A client the admin approved read-only, and its token response."""
    client = register_here(client_name="Step-up client")
    tokens = obtain_tokens_here(admin, client, scope="mcp:read")
    assert tokens["scope"] == "mcp:read"
    return client, tokens


def scopes_at_mcp(raw: str) -> frozenset[str] | None:
    """The scopes /mcp sees for this token (None: 401), as the server's authenticator decides."""
    authenticator = build_authenticator(steady=False)
    try:
        principal = authenticator.principal_for(raw, client_address="127.0.0.1", user_agent="")
    finally:
        authenticator.close()
    return None if principal is None else principal.scopes


def consents_of(client: Client) -> list[dict[str, object]]:
    return [e["detail"] for e in audit_events_here("oauth.consent") if e["detail"]["client_id"] == client.client_id]


def test_a_request_for_full_access_by_an_app_holding_read_only_access_is_shown_as_an_upgrade(
    admin: AdminHere, read_only: tuple[Client, dict[str, str]]
) -> None:
    client, _ = read_only
    page = admin.consent_page(authorize_url(HERE, client, pkce()[1], scope=STEP_UP_SCOPE)).content.decode()
    assert 'Give <span id="client-name">Step-up client</span> full access to this server?' in page
    assert 'id="upgrade"' in page and "already has read-only access as you; it asks for" in page
    assert "If you deny, it keeps its read-only access." in page
    assert 'id="approve-read-only"' not in page  # it has that already
    assert "Run any command as" in page  # what full access allows, as on a first approval


def test_approving_the_upgrade_grants_full_access_and_is_audited_as_an_upgrade(
    admin: AdminHere, read_only: tuple[Client, dict[str, str]]
) -> None:
    client, _ = read_only
    verifier, challenge = pkce()
    location = admin.decide(authorize_url(HERE, client, challenge, scope=STEP_UP_SCOPE))
    tokens = exchange_here(client, query_of(location)["code"], verifier).json()
    assert scopes_at_mcp(tokens["access_token"]) == {"mcp", "mcp:read"}
    first, upgrade = consents_of(client)
    assert "upgrade_from" not in first
    assert (upgrade["upgrade_from"], upgrade["decision"], upgrade["scope"]) == ("mcp:read", "approved", STEP_UP_SCOPE)


def test_denying_the_upgrade_leaves_the_read_only_access_working(
    admin: AdminHere, read_only: tuple[Client, dict[str, str]]
) -> None:
    client, tokens = read_only
    location = admin.decide(authorize_url(HERE, client, pkce()[1], scope=STEP_UP_SCOPE), approve=False)
    assert query_of(location)["error"] == "access_denied"
    assert scopes_at_mcp(tokens["access_token"]) == {"mcp:read"}
    renewed = refresh_here(client, tokens["refresh_token"])
    assert renewed.status_code == 200 and renewed.json()["scope"] == "mcp:read"
    denial = consents_of(client)[-1]
    assert (denial["upgrade_from"], denial["decision"], denial["outcome"]) == ("mcp:read", "denied", "access_denied")


def test_it_is_no_upgrade_for_another_staff_user_or_for_an_app_holding_full_access(
    admin: AdminHere, read_only: tuple[Client, dict[str, str]]
) -> None:
    client, _ = read_only
    other = AdminHere("other-admin")
    fresh = other.consent_page(authorize_url(HERE, client, pkce()[1], scope="mcp")).content.decode()
    assert 'id="upgrade"' not in fresh and 'id="approve-read-only"' in fresh
    full = register_here(client_name="Full client")
    obtain_tokens_here(admin, full, scope="mcp")
    again = admin.consent_page(authorize_url(HERE, full, pkce()[1], scope="mcp")).content.decode()
    assert 'id="upgrade"' not in again


def test_an_app_whose_read_only_access_has_lapsed_is_asked_as_a_new_connection(
    admin: AdminHere, read_only: tuple[Client, dict[str, str]]
) -> None:
    client, _ = read_only
    mine = {"application__client_id": client.client_id}
    RefreshToken.objects.filter(**mine).update(revoked=timezone.now())
    AccessToken.objects.filter(**mine).update(expires=timezone.now() - timedelta(seconds=1))
    page = admin.consent_page(authorize_url(HERE, client, pkce()[1], scope="mcp")).content.decode()
    assert 'id="upgrade"' not in page and "Allow <span" in page
