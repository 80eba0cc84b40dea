"""The credential pages of the console through Django's test client: the token form (defaults, presets, past dates,
unique names), the created page shown once, a token's page and its revoke confirmation, connected apps (titles,
registration tokens hidden, no View on site, approvals, live tokens, revoke), and unique names in the data layer."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application

from audit.log import Actor, call_finished, call_started, event
from audit.models import AuditRecord
from oauth.credential_pages import app_page, app_revoke_page
from oauth.credentials import application_label
from oauth.models import SCOPE_READ, BearerToken, Revocation, hash_token
from oauth.tokens import NameTaken, import_bootstrap_token, issue_token

pytestmark = pytest.mark.django_db

ADD = "/admin/oauth/bearertoken/add/"


@pytest.fixture
def admin_user(django_user_model: type[User]) -> User:
    return django_user_model.objects.create_superuser("boss", password="pw-for-tests-123")


@pytest.fixture
def client_as_admin(client: Client, admin_user: User) -> Client:
    client.force_login(admin_user)
    return client


def token_actor(token: BearerToken, address: str = "198.51.100.7", agent: str = "claude-code/2.1") -> Actor:
    return Actor(
        user_id=token.user_id, username=token.user.get_username(), credential_kind="bearer",
        credential_id=str(token.pk), credential_name=token.name, scope=token.scope, client_address=address,
        user_agent=agent,
    )  # fmt: skip


def add_token(client: Client, user: User, **fields: str) -> Any:
    data = {"name": "laptop", "user": str(user.pk), "scope": SCOPE_READ, "expiry": "30", **fields}
    return client.post(ADD, data)


# --- the form ---------------------------------------------------------------------------------------------------


def test_the_form_defaults_to_the_signed_in_user_read_only_and_a_preset(
    client_as_admin: Client, admin_user: User
) -> None:
    form = client_as_admin.get(ADD).context["adminform"].form
    assert form.initial["user"] == admin_user.pk
    assert form["scope"].value() == SCOPE_READ and form["expiry"].value() == "30"
    content = client_as_admin.get(ADD).content.decode()
    for words in ("read-only tools: read files", "every tool: run commands", "in 7 days", "in 90 days", "never"):
        assert words in content, words
    assert 'type="radio" name="expiry"' in content and 'type="radio" name="scope"' in content


@pytest.mark.parametrize(("choice", "days"), [("7", 7), ("30", 30), ("90", 90), ("never", None)])
def test_each_expiry_preset_sets_the_expiry(client_as_admin: Client, admin_user: User, choice: str,
                                            days: int | None) -> None:  # fmt: skip
    assert add_token(client_as_admin, admin_user, expiry=choice).status_code == 302
    token = BearerToken.objects.get(name="laptop")
    if days is None:
        assert token.expires_at is None
    else:
        assert token.expires_at is not None
        assert abs(token.expires_at - (timezone.now() + timedelta(days=days))) < timedelta(minutes=1)


def test_a_custom_expiry_date_ends_that_day_and_a_past_one_is_refused(
    client_as_admin: Client, admin_user: User
) -> None:
    past = (timezone.localdate() - timedelta(days=1)).isoformat()
    response = add_token(client_as_admin, admin_user, expiry="custom", expires_on=past)
    assert response.status_code == 200 and "in the past" in response.content.decode()
    missing = add_token(client_as_admin, admin_user, expiry="custom")
    assert missing.status_code == 200 and "Give the date" in missing.content.decode()
    assert not BearerToken.objects.exists()
    future = timezone.localdate() + timedelta(days=3)
    assert add_token(client_as_admin, admin_user, expiry="custom", expires_on=future.isoformat()).status_code == 302
    expires = BearerToken.objects.get().expires_at
    assert expires is not None and timezone.localdate(expires) == future


def test_a_name_held_by_an_active_token_is_refused_naming_it(client_as_admin: Client, admin_user: User) -> None:
    holder, _ = issue_token(admin_user, "laptop")
    response = add_token(client_as_admin, admin_user)
    content = response.content.decode()
    assert response.status_code == 200 and "is taken by token" in content and holder.prefix in content
    assert BearerToken.objects.filter(name="laptop").count() == 1


def test_an_expired_unrevoked_token_holds_its_name_and_the_form_says_to_revoke_it(
    client_as_admin: Client, admin_user: User
) -> None:
    holder, _ = issue_token(admin_user, "laptop")
    BearerToken.objects.filter(pk=holder.pk).update(expires_at=timezone.now() - timedelta(days=1))
    content = add_token(client_as_admin, admin_user).content.decode()
    assert "expired but is not revoked" in content and "revoke it" in content
    BearerToken.objects.filter(pk=holder.pk).update(revoked_at=timezone.now())
    assert add_token(client_as_admin, admin_user).status_code == 302  # a revoked token frees its name


# --- unique names below the form ---------------------------------------------------------------------------------


def test_issue_token_raises_name_taken_and_the_database_refuses_a_duplicate(admin_user: User) -> None:
    issue_token(admin_user, "dup")
    with pytest.raises(NameTaken, match="'dup' is taken"):
        issue_token(admin_user, "dup")
    twin = BearerToken(name="dup", user=admin_user)
    twin.set_secret("sst_another-secret-value")
    with pytest.raises(IntegrityError), transaction.atomic():
        twin.save()


def test_create_token_refuses_a_taken_name(admin_user: User) -> None:
    issue_token(admin_user, "dup")
    with pytest.raises(CommandError, match="'dup' is taken"):
        call_command("create_token", "dup", "--user", "boss")
    assert BearerToken.objects.filter(name="dup").count() == 1


def test_the_bootstrap_import_takes_the_next_free_name(admin_user: User) -> None:
    issue_token(admin_user, "bootstrap")
    assert import_bootstrap_token(admin_user, "an-operator-chosen-secret-1234")
    assert BearerToken.objects.filter(name="bootstrap (2)").exists()
    assert not import_bootstrap_token(admin_user, "an-operator-chosen-secret-1234")  # same secret: nothing new


def test_the_migration_renames_duplicate_active_names(admin_user: User) -> None:
    from importlib import import_module

    from django.apps import apps

    migration = import_module("oauth.migrations.0004_active_names_connected_apps")
    with connection.cursor() as cursor:  # the table as it was before the constraint (the test's rollback restores it)
        cursor.execute("DROP INDEX oauth_bearer_active_name")
    rows = [BearerToken(name="same", user=admin_user) for _ in range(3)]
    rows.append(BearerToken(name="same (2)", user=admin_user))  # a name the renaming must not take again
    rows.append(BearerToken(name="same", user=admin_user, revoked_at=timezone.now()))
    for index, token in enumerate(rows):
        token.set_secret(f"sst_secret-{index}-xxxxxxxx")
    BearerToken.objects.bulk_create(rows)
    migration.rename_duplicate_active_names(apps, None)
    names = sorted(BearerToken.objects.filter(revoked_at__isnull=True).values_list("name", flat=True))
    assert names == ["same", "same (2)", "same (3)", "same (4)"]
    assert BearerToken.objects.get(revoked_at__isnull=False).name == "same"


# --- created: POST, redirect, GET once ----------------------------------------------------------------------------


def test_creating_redirects_to_a_page_that_shows_the_secret_once(client_as_admin: Client, admin_user: User) -> None:
    response = add_token(client_as_admin, admin_user)
    assert response.status_code == 302
    token = BearerToken.objects.get(name="laptop")
    created = reverse("admin:oauth_bearertoken_created", args=[token.pk, "x"]).rsplit("x/", 1)[0]
    assert response["Location"].startswith(created)
    page = client_as_admin.get(response["Location"])
    content = page.content.decode()
    secret = re.search(r'<code id="token-secret" class="copyable">(sst_[^<]+)</code>', content)
    assert secret is not None and token.token_hash == hash_token(secret.group(1))
    assert "no-store" in page["Cache-Control"]
    assert "claude mcp remove -s user sandstorm" in content and "oauth/copy.js" in content
    again = client_as_admin.get(response["Location"])
    assert "no-store" in again["Cache-Control"]
    assert secret.group(1) not in again.content.decode() and 'id="already-shown"' in again.content.decode()
    assert reverse("admin:oauth_bearertoken_change", args=[token.pk]) in again.content.decode()
    assert BearerToken.objects.count() == 1


def test_a_ticket_of_another_token_shows_nothing(client_as_admin: Client, admin_user: User) -> None:
    location = add_token(client_as_admin, admin_user)["Location"]
    other, _ = issue_token(admin_user, "other")
    ticket = location.rstrip("/").rsplit("/", 1)[1]
    page = client_as_admin.get(reverse("admin:oauth_bearertoken_created", args=[other.pk, ticket]))
    assert 'id="already-shown"' in page.content.decode() and 'id="token-secret"' not in page.content.decode()


# --- a token's page ----------------------------------------------------------------------------------------------


def test_a_token_page_shows_status_scope_last_use_and_recent_calls(client_as_admin: Client, admin_user: User) -> None:
    token, _ = issue_token(admin_user, "laptop", scope=SCOPE_READ)
    call_started(token_actor(token, "192.0.2.1", "old-agent/1"), "fs_read", {"path": "a.txt"}, "i")
    newest = call_started(token_actor(token), "git_status", {"path": "repo"}, "i")
    call_finished(newest, "error", result_text="boom", exit_code=1, duration_ms=5, reason="")
    content = client_as_admin.get(reverse("admin:oauth_bearertoken_change", args=[token.pk])).content.decode()
    assert "credential-status-active" in content and ">active<" in content
    assert "read-only tools" in content
    assert "198.51.100.7" in content and "claude-code/2.1" in content  # the newest call's, not the older one's
    assert reverse("admin:audit_auditrecord_change", args=[newest.pk]) in content and ">error<" in content
    assert f"?credential=bearer%3A{token.pk}" in content
    assert f"?credential=bearer%3A{token.pk}&amp;outcome=failed&amp;range=yesterday" in content
    assert reverse("admin:oauth_bearertoken_revoke", args=[token.pk]) in content


def test_a_token_page_edits_only_the_name(client_as_admin: Client, admin_user: User) -> None:
    token, _ = issue_token(admin_user, "laptop", scope=SCOPE_READ)
    other = User.objects.create_user("mallory")
    url = reverse("admin:oauth_bearertoken_change", args=[token.pk])
    response = client_as_admin.post(url, {"name": "desk", "user": str(other.pk), "scope": "mcp", "expires_at": ""})
    assert response.status_code == 302
    token.refresh_from_db()
    assert (token.name, token.user_id, token.scope) == ("desk", admin_user.pk, SCOPE_READ)
    issue_token(admin_user, "taken")
    assert "is taken by token" in client_as_admin.post(url, {"name": "taken"}).content.decode()


def test_expired_and_revoked_tokens_say_so_in_words(client_as_admin: Client, admin_user: User) -> None:
    expired, _ = issue_token(admin_user, "old")
    BearerToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(hours=1))
    revoked, _ = issue_token(admin_user, "gone")
    BearerToken.objects.filter(pk=revoked.pk).update(revoked_at=timezone.now())
    page = client_as_admin.get(reverse("admin:oauth_bearertoken_change", args=[expired.pk])).content.decode()
    assert ">expired<" in page
    page = client_as_admin.get(reverse("admin:oauth_bearertoken_change", args=[revoked.pk])).content.decode()
    assert ">revoked<" in page and reverse("admin:oauth_bearertoken_revoke", args=[revoked.pk]) not in page
    assert 'name="name"' not in page  # read-only


def test_revoking_asks_first_and_only_a_post_revokes(client_as_admin: Client, admin_user: User) -> None:
    token, _ = issue_token(admin_user, "laptop")
    call_started(token_actor(token), "terminal_exec", {"command": "sleep 100"}, "i")  # running
    done = call_started(token_actor(token), "terminal_exec", {"command": "true"}, "i")
    call_finished(done, "ok", result_text="", exit_code=0, duration_ms=1, reason="")
    url = reverse("admin:oauth_bearertoken_revoke", args=[token.pk])
    confirm = client_as_admin.get(url)
    content = confirm.content.decode()
    assert confirm.status_code == 200 and "<strong>1</strong> running tool call" in content
    assert "background processes" in content and "csrfmiddlewaretoken" in content
    token.refresh_from_db()
    assert token.revoked_at is None and not Revocation.objects.exists()
    response = client_as_admin.post(url)
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:oauth_bearertoken_change", args=[token.pk])
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert AuditRecord.objects.filter(event="token.revoked").count() == 1
    followed = client_as_admin.get(response["Location"]).content.decode()
    assert "Revoked token “laptop”" in followed


def test_the_revoke_post_needs_the_csrf_token(admin_user: User) -> None:
    token, _ = issue_token(admin_user, "laptop")
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    assert client.post(reverse("admin:oauth_bearertoken_revoke", args=[token.pk])).status_code == 403
    token.refresh_from_db()
    assert token.revoked_at is None


# --- connected apps ----------------------------------------------------------------------------------------------


def make_app(user: User, name: str = "Claude") -> tuple[Application, AccessToken]:
    app = Application.objects.create(
        name=name, client_type="public", authorization_grant_type="authorization-code",
        redirect_uris="https://claude.ai/api/mcp/auth_callback",
    )  # fmt: skip
    live = AccessToken.objects.create(
        application=app, user=user, scope="mcp:read", token="t-" + name, expires=timezone.now() + timedelta(hours=1)
    )
    AccessToken.objects.create(
        application=app, user=None, scope="oauth2_provider:registration", token="r-" + name,
        expires=timezone.now() + timedelta(days=1),
    )  # fmt: skip
    event("oauth.consent", Actor(username=user.get_username(), client_address="203.0.113.5"),
          client=application_label(app.name, app.client_id), client_id=app.client_id, scope="mcp:read",
          decision="approved")  # fmt: skip
    return app, live


def app_actor(app: Application, token: AccessToken) -> Actor:
    return Actor(
        user_id=token.user_id, username="boss", credential_kind="oauth", credential_id=str(token.pk),
        credential_name=application_label(app.name, app.client_id), scope=token.scope, client_address="203.0.113.8",
        user_agent="Claude-User",
    )  # fmt: skip


def test_connected_apps_are_titled_so_and_hide_registration_tokens(client_as_admin: Client, admin_user: User) -> None:
    make_app(admin_user)
    index = client_as_admin.get("/admin/").content.decode()
    assert "Connected apps" in index and "Django OAuth Toolkit" not in index and "DJANGO OAUTH" not in index.upper()
    listing = client_as_admin.get("/admin/oauth/connectedapp/")
    assert listing.status_code == 200 and "Connected apps" in listing.content.decode()
    tokens = client_as_admin.get("/admin/oauth/connectedappaccesstoken/")
    assert [row.scope for row in tokens.context["cl"].result_list] == ["mcp:read"]
    assert client_as_admin.get("/admin/oauth2_provider/application/").status_code == 404


def test_a_connected_app_page_shows_approvals_live_tokens_calls_and_no_view_on_site(
    client_as_admin: Client, admin_user: User
) -> None:
    app, live = make_app(admin_user)
    call = call_started(app_actor(app, live), "fs_read", {"path": "notes.md"}, "i")
    page = client_as_admin.get(reverse("admin:oauth_connectedapp_change", args=[app.pk]))
    content = page.content.decode()
    assert page.status_code == 200
    approvals = content.split('id="app-approvals"')[1].split("</table>")[0]
    assert "boss" in approvals and "approved" in approvals and "mcp:read" in approvals
    live_tokens = content.split('id="app-live-tokens"')[1].split("</table>")[0]
    assert f"#{live.pk}" in live_tokens and "read-only tools" in live_tokens and "registration" not in live_tokens
    assert reverse("admin:audit_auditrecord_change", args=[call.pk]) in content and "203.0.113.8" in content
    assert f"?credential=oauth%3A{live.pk}" in content
    assert "View on site" not in content and "viewsitelink" not in content
    assert reverse("admin:oauth_connectedapp_revoke", args=[app.pk]) in content


def test_a_connected_apps_audit_link_lists_the_calls_of_every_access_token_it_held(
    client_as_admin: Client, admin_user: User
) -> None:
    app, first = make_app(admin_user)
    before = call_started(app_actor(app, first), "fs_read", {"path": "before-refresh"}, "i")
    AccessToken.objects.filter(pk=first.pk).delete()  # a refresh: the next calls are under a new access token
    second = AccessToken.objects.create(
        application=app, user=admin_user, scope="mcp:read", token="t-2", expires=timezone.now() + timedelta(hours=1)
    )
    after = call_started(app_actor(app, second), "fs_read", {"path": "after-refresh"}, "i")
    other, other_token = make_app(admin_user, name=f"Claude (client {app.client_id})")  # a look-alike name
    call_started(app_actor(other, other_token), "fs_read", {"path": "look-alike"}, "i")

    content = client_as_admin.get(reverse("admin:oauth_connectedapp_change", args=[app.pk])).content.decode()
    link = re.search(r'id="app-audit" href="([^"]+)"', content)
    assert link is not None
    listed = client_as_admin.get(link.group(1).replace("&amp;", "&"))
    assert {record.pk for record in listed.context["cl"].result_list} == {before.pk, after.pk}
    failed = re.search(r'id="app-failed-yesterday" href="([^"]+)"', content)
    assert failed is not None and "outcome=failed" in failed.group(1) and "range=yesterday" in failed.group(1)


def test_revoking_a_connected_app_asks_first(client_as_admin: Client, admin_user: User) -> None:
    app, live = make_app(admin_user)
    url = reverse("admin:oauth_connectedapp_revoke", args=[app.pk])
    confirm = client_as_admin.get(url).content.decode()
    assert "1 live access token" in confirm and "background processes" in confirm
    assert AccessToken.objects.filter(pk=live.pk).exists()
    response = client_as_admin.post(url)
    assert response.status_code == 302 and response["Location"] == reverse(
        "admin:oauth_connectedapp_change", args=[app.pk]
    )
    assert not AccessToken.objects.filter(application=app).exists()
    assert AuditRecord.objects.filter(event="oauth.client_revoked").count() == 1


def test_a_staff_user_who_may_only_view_cannot_revoke_anything(
    client: Client, admin_user: User, django_user_model: type[User]
) -> None:
    from django.contrib.auth.models import Permission

    viewer = django_user_model.objects.create_user("viewer", password="pw-for-tests-456", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename__startswith="view_"))
    app, live = make_app(admin_user)
    token, _ = issue_token(admin_user, "laptop")
    client.force_login(viewer)
    app_page_html = client.get(reverse("admin:oauth_connectedapp_change", args=[app.pk])).content.decode()
    assert reverse("admin:oauth_connectedapp_revoke", args=[app.pk]) not in app_page_html
    listed = client.get(reverse("admin:oauth_connectedapp_changelist")).content.decode()
    assert 'value="revoke"' not in listed and 'value="revoke_and_remove"' not in listed
    for url in (
        reverse("admin:oauth_connectedapp_revoke", args=[app.pk]),
        reverse("admin:oauth_bearertoken_revoke", args=[token.pk]),
    ):
        assert client.post(url).status_code == 403
    refused = client.post(
        reverse("admin:oauth_connectedapp_changelist"), {"action": "revoke", "_selected_action": [app.pk]}
    )
    assert refused.status_code in (200, 302)  # the admin says "no action selected"; nothing is revoked
    assert AccessToken.objects.filter(pk=live.pk).exists()
    assert BearerToken.objects.get(pk=token.pk).revoked_at is None


def test_a_call_of_a_connected_app_links_to_its_revocation_even_after_a_refresh(admin_user: User) -> None:
    app, live = make_app(admin_user)
    call_started(app_actor(app, live), "fs_read", {"path": "a"}, "i")
    token_id = str(live.pk)
    assert app_revoke_page(token_id) == reverse("admin:oauth_connectedapp_revoke", args=[app.pk])
    AccessToken.objects.filter(pk=live.pk).delete()  # refreshed away: found through the call's label
    assert app_page(token_id) == reverse("admin:oauth_connectedapp_change", args=[app.pk])
    impostor, _ = make_app(admin_user, name=f"Evil (client {app.client_id})")
    assert app_page("999999") is None and impostor.pk != app.pk


def test_a_call_page_offers_the_token_revoke_confirmation(client_as_admin: Client, admin_user: User) -> None:
    token, _ = issue_token(admin_user, "laptop")
    call = call_started(token_actor(token), "terminal_exec", {"command": "true"}, "i")
    content = client_as_admin.get(reverse("admin:audit_auditrecord_change", args=[call.pk])).content.decode()
    assert f'id="revoke-credential" href="{reverse("admin:oauth_bearertoken_revoke", args=[token.pk])}"' in content
