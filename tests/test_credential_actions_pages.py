"""The console's pages to regenerate, suspend and resume credentials, through Django's test client: confirmations
before anything changes, POST and CSRF, the new secret shown once after a redirect (reload and a second POST make
nothing), statuses and list filters saying "suspended", and who may do what."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application

from audit.models import AuditRecord
from oauth.models import AppSuspension, BearerToken, Revocation, hash_token
from oauth.suspension import suspend_app, suspend_token
from oauth.tokens import issue_token

pytestmark = pytest.mark.django_db
SECRET = re.compile(r'<code id="token-secret" class="copyable">(sst_[^<]+)</code>')


@pytest.fixture
def boss(django_user_model: type[User]) -> User:
    return django_user_model.objects.create_superuser("boss", password="pw-for-tests-123")


@pytest.fixture
def console(client: Client, boss: User) -> Client:
    client.force_login(boss)
    return client


def token_url(token: BearerToken, action: str = "change") -> str:
    return reverse(f"admin:oauth_bearertoken_{action}", args=[token.pk])


def app_url(app: Application, action: str = "change") -> str:
    return reverse(f"admin:oauth_connectedapp_{action}", args=[app.pk])


def new_app(user: User) -> Application:
    app = Application.objects.create(
        name="Claude", client_type="public", authorization_grant_type="authorization-code",
        redirect_uris="https://claude.ai/api/mcp/auth_callback",
    )  # fmt: skip
    AccessToken.objects.create(application=app, user=user, scope="mcp", token="t-1",
                               expires=timezone.now() + timedelta(hours=1))  # fmt: skip
    return app


# --- regenerate ------------------------------------------------------------------------------------------------------


def test_regenerating_asks_first_then_shows_the_new_secret_once(console: Client, boss: User) -> None:
    old, _ = issue_token(boss, "laptop", expires_days=30)
    confirm = console.get(token_url(old, "regenerate"))
    content = confirm.content.decode()
    assert confirm.status_code == 200 and 'id="regenerate-form"' in content and "csrfmiddlewaretoken" in content
    assert 'name="stop_background"' in content and " checked" not in content.split('id="stop-background"')[1][:20]
    assert BearerToken.objects.count() == 1
    response = console.post(token_url(old, "regenerate"))
    new = BearerToken.objects.get(revoked_at__isnull=True)
    assert response.status_code == 302 and response["Location"].startswith(
        token_url(new).replace("change/", "created/")
    )
    page = console.get(response["Location"])
    shown = page.content.decode()
    secret = SECRET.search(shown)
    assert secret is not None and new.token_hash == hash_token(secret.group(1))
    assert (
        "Token “laptop” regenerated" in shown and old.prefix in shown and "claude mcp remove -s user sandstorm" in shown
    )
    assert "no-store" in page["Cache-Control"]
    again = console.get(response["Location"]).content.decode()
    assert 'id="already-shown"' in again and secret.group(1) not in again
    assert (new.name, new.expires_at, new.user_id) == ("laptop", old.expires_at, boss.pk)
    old.refresh_from_db()
    assert old.revoked_at is not None


def test_a_second_post_regenerates_nothing_and_the_old_page_leads_to_the_new_token(console: Client, boss: User) -> None:
    old, _ = issue_token(boss, "laptop")
    console.post(token_url(old, "regenerate"))
    again = console.post(token_url(old, "regenerate"), follow=True)
    assert BearerToken.objects.count() == 2 and Revocation.objects.count() == 1
    assert "Nothing was regenerated" in again.content.decode()
    back = console.get(token_url(old, "regenerate")).content.decode()
    current = BearerToken.objects.get(revoked_at__isnull=True)
    assert 'id="regenerate-already"' in back and token_url(current) in back


def test_the_regenerate_post_needs_the_csrf_token(boss: User) -> None:
    token, _ = issue_token(boss, "laptop")
    client = Client(enforce_csrf_checks=True)
    client.force_login(boss)
    assert client.post(token_url(token, "regenerate")).status_code == 403
    assert BearerToken.objects.count() == 1 and BearerToken.objects.get().revoked_at is None


def test_an_expired_token_offers_no_regeneration(console: Client, boss: User) -> None:
    token, _ = issue_token(boss, "old")
    BearerToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(hours=1))
    assert token_url(token, "regenerate") not in console.get(token_url(token)).content.decode()
    assert 'id="regenerate-expired"' in console.get(token_url(token, "regenerate")).content.decode()
    console.post(token_url(token, "regenerate"))
    assert BearerToken.objects.count() == 1


def test_staff_who_may_only_view_can_neither_regenerate_nor_suspend(django_user_model: type[User], boss: User) -> None:
    viewer = django_user_model.objects.create_user("viewer", is_staff=True)
    viewer.user_permissions.add(*Permission.objects.filter(codename__in=["view_bearertoken", "view_connectedapp"]))
    token, _ = issue_token(boss, "laptop")
    app = new_app(boss)
    client = Client()
    client.force_login(viewer)
    page = client.get(token_url(token)).content.decode()
    assert token_url(token, "regenerate") not in page and token_url(token, "suspend") not in page
    for url in (token_url(token, "regenerate"), token_url(token, "suspend"), app_url(app, "suspend")):
        assert client.post(url).status_code == 403, url
    assert BearerToken.objects.count() == 1 and not AppSuspension.objects.exists()
    assert BearerToken.objects.get().suspended_at is None


# --- suspend and resume a token --------------------------------------------------------------------------------------


def test_suspending_a_token_asks_first_and_its_page_and_list_say_suspended(console: Client, boss: User) -> None:
    token, _ = issue_token(boss, "laptop")
    other, _ = issue_token(boss, "desk")
    page = console.get(token_url(token)).content.decode()
    assert token_url(token, "suspend") in page and token_url(token, "resume") not in page
    confirm = console.get(token_url(token, "suspend")).content.decode()
    assert 'id="suspend-form"' in confirm and "revokes and deletes nothing" in confirm
    assert BearerToken.objects.get(pk=token.pk).suspended_at is None
    followed = console.post(token_url(token, "suspend"), follow=True).content.decode()
    assert "Token “laptop” is suspended" in followed
    page = console.get(token_url(token)).content.decode()
    assert "credential-status-suspended" in page and token_url(token, "resume") in page
    suspended = console.get("/admin/oauth/bearertoken/?status=suspended").content.decode()
    active = console.get("/admin/oauth/bearertoken/?status=active").content.decode()
    assert token_url(token) in suspended and token_url(other) not in suspended
    assert token_url(token) not in active and token_url(other) in active
    assert ">suspended<" in console.get("/admin/oauth/bearertoken/").content.decode()
    assert AuditRecord.objects.filter(event="token.suspended").count() == 1


def test_resuming_a_token_asks_first(console: Client, boss: User) -> None:
    token, _ = issue_token(boss, "laptop")
    suspend_token(token, None)
    assert 'id="resume-form"' in console.get(token_url(token, "resume")).content.decode()
    assert BearerToken.objects.get().suspended_at is not None
    console.post(token_url(token, "resume"))
    assert BearerToken.objects.get().suspended_at is None
    assert AuditRecord.objects.filter(event="token.resumed").count() == 1


def test_the_stop_background_box_is_passed_on(console: Client, boss: User) -> None:
    token, _ = issue_token(boss, "laptop")
    console.post(token_url(token, "suspend"), {"stop_background": "on"})
    assert Revocation.objects.get().stop_background is True


# --- suspend and resume a connected app ------------------------------------------------------------------------------


def test_an_app_suspended_for_every_user_says_so_in_its_page_and_the_list(console: Client, boss: User) -> None:
    app = new_app(boss)
    page = console.get(app_url(app)).content.decode()
    assert app_url(app, "suspend") in page and 'id="app-user-suspensions"' in page
    assert 'id="suspend-form"' in console.get(app_url(app, "suspend")).content.decode()
    console.post(app_url(app, "suspend"))
    assert AppSuspension.objects.get().user_id is None
    page = console.get(app_url(app)).content.decode()
    assert 'id="app-suspended"' in page and "credential-status-suspended" in page and app_url(app, "resume") in page
    listing = console.get("/admin/oauth/connectedapp/").content.decode()
    assert ">suspended<" in listing
    assert app_url(app) in console.get("/admin/oauth/connectedapp/?suspended=every").content.decode()
    assert app_url(app) not in console.get("/admin/oauth/connectedapp/?suspended=no").content.decode()
    console.post(app_url(app, "resume"))
    assert not AppSuspension.objects.exists()
    assert [r.event for r in AuditRecord.objects.filter(event__startswith="oauth.client_").order_by("id")] == [
        "oauth.client_suspended", "oauth.client_resumed",
    ]  # fmt: skip


def test_an_app_is_suspended_for_one_user_from_its_page(console: Client, boss: User) -> None:
    app = new_app(boss)
    per_user = f"{app_url(app, 'suspend')}?user={boss.pk}"
    assert per_user in console.get(app_url(app)).content.decode()
    confirm = console.get(per_user).content.decode()
    assert f'name="user" value="{boss.pk}"' in confirm and "for boss" in confirm
    console.post(app_url(app, "suspend"), {"user": str(boss.pk)})
    assert AppSuspension.objects.get().user_id == boss.pk
    page = console.get(app_url(app)).content.decode()
    assert f"{app_url(app, 'resume')}?user={boss.pk}" in page and 'id="app-suspended"' not in page
    suspend_app(app, None, None)
    resume = console.get(f"{app_url(app, 'resume')}?user={boss.pk}").content.decode()
    assert 'id="resume-still-every"' in resume


def test_a_user_that_is_not_found_never_means_every_user(console: Client, boss: User) -> None:
    app = new_app(boss)
    assert console.post(app_url(app, "suspend"), {"user": "999999"}).status_code == 404
    assert console.post(app_url(app, "suspend"), {"user": "x"}).status_code == 404
    assert not AppSuspension.objects.exists()
