"""A suspended connected app (oauth.suspension) at the OAuth endpoints, in-process with Django's test client: the token
endpoint refuses its refresh tokens and codes with `invalid_grant` saying so (audited, at most once a minute), with
nothing revoked or used up, so the same refresh token and code work once it is resumed; the consent page does not
offer it for approval, says who suspended it and when, and lets the user tell the client no."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.cache import cache
from django.urls import reverse
from oauth2_provider.models import AccessToken, Application, Grant, RefreshToken

from audit.log import Actor
from oauth.models import Revocation
from oauth.policy import SUSPENDED_DESCRIPTION
from oauth.suspension import resume_app, suspend_app, suspension_of
from tests.oauth_flow import (
    HERE,
    AdminHere,
    Client,
    audit_events_here,
    authorize_url,
    consent_answer,
    exchange_here,
    obtain_tokens_here,
    pkce,
    post_form,
    query_of,
    refresh_here,
    register_here,
    web_client,
)

pytestmark = pytest.mark.django_db
ALICE = Actor(username="alice", credential_kind="session", client_address="10.0.0.5")
# RFC 6749 section 5.2: error_description is printable ASCII without '"' and '\'.
DESCRIPTION_CHARS = re.compile(r"[\x20-\x21\x23-\x5b\x5d-\x7e]+")


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    """The refusals' once-a-minute audit is counted in the cache: each test starts with none counted."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def admin(db: None) -> AdminHere:
    return AdminHere()


@pytest.fixture
def registered(db: None) -> Client:
    return register_here()


def app_of(client: Client) -> Application:
    return Application.objects.get(client_id=client.client_id)


def refused_as_suspended(response: Any) -> bool:
    expected = {"error": "invalid_grant", "error_description": SUSPENDED_DESCRIPTION}
    return response.status_code == 400 and response.json() == expected


def page_text(response: Any) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", response.content.decode())))


# --- the token endpoint ----------------------------------------------------------------------------------------------


def test_the_refusal_says_suspended_in_the_characters_rfc_6749_allows() -> None:
    assert DESCRIPTION_CHARS.fullmatch(SUSPENDED_DESCRIPTION)
    assert "suspended by an administrator" in SUSPENDED_DESCRIPTION


def test_a_suspended_apps_refresh_token_is_refused_then_works_once_resumed(
    admin: AdminHere, registered: Client
) -> None:
    tokens = obtain_tokens_here(admin, registered)
    suspend_app(app_of(registered), None, ALICE)
    kept = (AccessToken.objects.count(), RefreshToken.objects.filter(revoked__isnull=True).count())
    for _ in range(2):  # refused as often as asked, and nothing is used up meanwhile
        assert refused_as_suspended(refresh_here(registered, tokens["refresh_token"]))
    assert (AccessToken.objects.count(), RefreshToken.objects.filter(revoked__isnull=True).count()) == kept
    assert not Revocation.objects.exclude(reason=Revocation.REASON_SUSPENSION).exists()

    resume_app(app_of(registered), None, ALICE)
    renewed = refresh_here(registered, tokens["refresh_token"])
    assert renewed.status_code == 200 and renewed.json()["refresh_token"] != tokens["refresh_token"]


def test_an_app_suspended_for_one_user_still_renews_another_users_tokens(admin: AdminHere, registered: Client) -> None:
    other = AdminHere("other-admin")
    mine, theirs = obtain_tokens_here(admin, registered), obtain_tokens_here(other, registered)
    suspend_app(app_of(registered), admin.user, ALICE)
    assert refused_as_suspended(refresh_here(registered, mine["refresh_token"]))
    assert refresh_here(registered, theirs["refresh_token"]).status_code == 200


def test_a_code_issued_before_the_suspension_is_refused_and_kept(admin: AdminHere, registered: Client) -> None:
    verifier, challenge = pkce()
    code = query_of(admin.decide(authorize_url(HERE, registered, challenge)))["code"]
    suspend_app(app_of(registered), None, ALICE)
    assert refused_as_suspended(exchange_here(registered, code, verifier))
    assert Grant.objects.filter(code=code).exists() and not AccessToken.objects.filter(user__isnull=False).exists()
    resume_app(app_of(registered), None, ALICE)
    assert exchange_here(registered, code, verifier).status_code == 200


def test_refusals_are_audited_once_a_minute_per_app_user_and_grant(admin: AdminHere, registered: Client) -> None:
    tokens = obtain_tokens_here(admin, registered)
    suspend_app(app_of(registered), admin.user, ALICE)
    for _ in range(3):
        refresh_here(registered, tokens["refresh_token"])
    [refused] = audit_events_here("oauth.token_refused")
    assert refused["detail"] == {
        "client_id": registered.client_id,
        "client": f"Test client (client {registered.client_id})",
        "owner": "admin",
        "grant_type": "refresh_token",
        "reason": "suspended",
        "for_every_user": False,
    }
    assert refused["client_address"] == "127.0.0.1"


# --- the consent page ------------------------------------------------------------------------------------------------


def test_the_consent_page_of_a_suspended_app_says_who_suspended_it_and_offers_no_approval(
    admin: AdminHere, registered: Client
) -> None:
    suspend_app(app_of(registered), None, ALICE)
    _, challenge = pkce()
    page = admin.consent_page(authorize_url(HERE, registered, challenge))
    text = page_text(page)
    assert page.status_code == 403 and 'id="suspended-card"' in page.content.decode()
    assert "Test client is suspended on this server" in text
    when = f"{app_of(registered).sandstorm_suspensions.get().suspended_at:%Y-%m-%d %H:%M:%S} UTC"
    assert f"alice, an administrator of this server, suspended it for every user on {when}." in text
    assert "Approving it here would not resume it" in text and "until an administrator resumes it" in text
    assert 'id="approve"' not in page.content.decode() and 'id="approve-read-only"' not in page.content.decode()
    assert page["X-Frame-Options"] == "DENY" and "frame-ancestors 'none'" in page["Content-Security-Policy"]
    assert 'id="app-page"' in page.content.decode()  # a superuser may resume it there


def test_an_app_suspended_for_the_signed_in_user_says_for_you_and_one_suspended_for_another_is_offered(
    admin: AdminHere, registered: Client
) -> None:
    other = AdminHere("other-admin")
    suspend_app(app_of(registered), admin.user, None)
    _, challenge = pkce()
    mine = admin.consent_page(authorize_url(HERE, registered, challenge))
    assert mine.status_code == 403
    assert "An administrator of this server suspended it for you (admin) on " in page_text(mine)
    theirs = other.consent_page(authorize_url(HERE, registered, challenge))
    assert theirs.status_code == 200 and 'id="approve"' in theirs.content.decode()


def test_an_approval_posted_after_the_suspension_issues_no_code(admin: AdminHere, registered: Client) -> None:
    _, challenge = pkce()
    url = authorize_url(HERE, registered, challenge)
    card = admin.consent_page(url).content.decode()
    suspend_app(app_of(registered), None, ALICE)
    for answer in (consent_answer(card, approve=True), {**consent_answer(card, approve=False), "read_only": "1"}):
        refused = post_form(admin.http, url, answer, HTTP_REFERER=url)
        assert refused.status_code == 403 and 'id="suspended-card"' in refused.content.decode()
    assert not Grant.objects.exists()
    assert audit_events_here("oauth.consent") == []  # nothing was decided


def test_telling_the_client_no_from_the_suspended_page_sends_access_denied(
    admin: AdminHere, registered: Client
) -> None:
    suspend_app(app_of(registered), None, ALICE)
    _, challenge = pkce()
    url = authorize_url(HERE, registered, challenge, state="st-9")
    page = admin.consent_page(url).content.decode()
    answer = post_form(admin.http, url, consent_answer(page, approve=False), HTTP_REFERER=url)
    assert answer.status_code == 302
    sent = query_of(answer["Location"])
    assert answer["Location"].startswith(registered.redirect_uri)
    assert sent["error"] == "access_denied" and sent["state"] == "st-9" and "code" not in sent
    assert not Grant.objects.exists()


def test_only_who_may_resume_the_app_is_sent_to_its_page(django_user_model: type[User], registered: Client) -> None:
    viewer = django_user_model.objects.create_user("viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_connectedapp"))
    suspend_app(app_of(registered), None, ALICE)
    browser = web_client()
    browser.force_login(viewer)
    _, challenge = pkce()
    page = browser.get(authorize_url(HERE, registered, challenge))
    assert page.status_code == 403 and 'id="app-page"' not in page.content.decode()
    assert "Ask alice or another administrator of this server to resume it" in page_text(page)


def test_suspending_an_app_says_beforehand_that_it_gets_no_new_tokens(admin: AdminHere, registered: Client) -> None:
    app = app_of(registered)
    page = admin.http.get(reverse("admin:oauth_connectedapp_suspend", args=[app.pk])).content.decode()
    assert 'id="suspend-no-new-tokens"' in page and "refuses its refresh tokens and codes" in page


# --- its registration ------------------------------------------------------------------------------------------------


def test_a_suspended_client_cannot_delete_its_registration_and_with_it_its_suspension(registered: Client) -> None:
    """RFC 7592's DELETE would take the suspension with the client, which could then register afresh."""
    application = app_of(registered)
    suspend_app(application, None, ALICE)
    registration = registered.registration

    def delete() -> Any:
        return web_client().delete(
            str(registration["registration_client_uri"]),
            HTTP_AUTHORIZATION=f"Bearer {registration['registration_access_token']}",
        )

    refused = delete()
    assert refused.status_code == 403 and refused.json()["error"] == "access_denied"
    assert "suspended by an administrator" in refused.json()["error_description"]
    assert Application.objects.filter(pk=application.pk).exists()
    assert suspension_of(application, None) is not None
    stranger = web_client().delete(str(registration["registration_client_uri"]), HTTP_AUTHORIZATION="Bearer nope")
    assert stranger.status_code == 401, "who may not manage it learns nothing of its suspension"
    resume_app(application, None, ALICE)
    assert delete().status_code == 204
    assert not Application.objects.filter(pk=application.pk).exists()
