"""Confinement profiles of credentials, in-process: the installation default from SANDSTORM_CONFINEMENT, each
credential's own choice on the principal at /mcp (bearer tokens, and connected apps per user), the token form and
page, a connected app's page, the consent card, `create_token --confinement`, the warning badge of `host`, and the
audit record of every change."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application, Grant, set_token_value

from audit.event_sentences import event_sentence
from audit.models import AuditRecord
from oauth import agent_identity
from oauth.confinement import change_app_confinement, change_token_confinement
from oauth.credentials import Principal, build_authenticator
from oauth.models import SCOPE_ALL, SCOPE_READ, AppConfinement, BearerToken
from oauth.tokens import issue_token
from tests.database import requires_sqlite
from tests.oauth_flow import (
    HERE,
    AdminHere,
    audit_events_here,
    authorize_url,
    consent_answer,
    pkce,
    post_form,
    query_of,
    register_here,
    web_client,
)

pytestmark = pytest.mark.django_db
REPO = Path(__file__).resolve().parent.parent
ADD = "/admin/oauth/bearertoken/add/"
TOKENS = "/admin/oauth/bearertoken/"
APPS = "/admin/oauth/connectedapp/"
HOST_BADGE = 'class="credential-confinement credential-confinement-host"'


@pytest.fixture
def boss(django_user_model: type[User]) -> User:
    return django_user_model.objects.create_superuser("boss", password="pw-for-tests-123")


@pytest.fixture
def console(client: Client, boss: User) -> Client:
    client.force_login(boss)
    return client


def principal(raw: str) -> Principal | None:
    authenticator = build_authenticator(steady=False)
    try:
        return authenticator.principal_for(raw, "127.0.0.1", "")
    finally:
        authenticator.close()


def events(name: str) -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(event=name).order_by("id"))


def detail_of(record: AuditRecord) -> dict[str, Any]:
    assert isinstance(record.detail, dict)
    return record.detail


def access_token(application: Application, user: User, scope: str = SCOPE_ALL) -> str:
    from django.conf import settings

    raw = f"raw-{application.pk}-{user.pk}-{scope}"
    token = AccessToken(application=application, user=user, scope=scope, resource=[settings.MCP_RESOURCE_URL],
                        expires=timezone.now() + timedelta(hours=1))  # fmt: skip
    set_token_value(token, raw)
    token.save()
    return raw


def new_app(name: str = "Claude") -> Application:
    return Application.objects.create(
        name=name, client_type="public", authorization_grant_type="authorization-code",
        redirect_uris="https://app.example/cb",
    )  # fmt: skip


# --- the installation's default --------------------------------------------------------------------------------------


def settings_in(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SANDSTORM_") and k != "DATABASE_URL"}
    base.update(SANDSTORM_STATE_DIR=str(tmp_path / "state"), SANDSTORM_WORKSPACE_ROOT=str(tmp_path / "ws"), **env)
    code = "from sandstorm_site import settings as s; print(s.CONFINEMENT_DEFAULT, s.CONFINEMENT_DEFAULT_CHOSEN)"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=base, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "workspace False"),  # development: the server starts its own executor
        ({"SANDSTORM_EXECUTOR_SOCKET": "/run/x/executor.sock"}, "host False"),  # production, as installed
        ({"SANDSTORM_CONFINEMENT": "host"}, "host True"),
        (
            {"SANDSTORM_CONFINEMENT": " Workspace ", "SANDSTORM_EXECUTOR_SOCKET": "/run/x/executor.sock"},
            "workspace True",
        ),
    ],
)
def test_the_installation_default_is_workspace_in_development_host_in_production_or_what_the_admin_set(
    tmp_path: Path, env: dict[str, str], expected: str
) -> None:
    result = settings_in(tmp_path, **env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


def test_an_unknown_confinement_setting_stops_start_up_with_one_line_naming_the_variable(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("SANDSTORM_")},
             "SANDSTORM_STATE_DIR": str(tmp_path / "state"), "SANDSTORM_CONFINEMENT": "none"},
    )  # fmt: skip
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "SANDSTORM_CONFINEMENT must be workspace or host, not 'none'" in line


# --- the principal at /mcp ---------------------------------------------------------------------------------------------


def test_a_bearer_principal_carries_its_own_profile_and_a_change_applies_to_the_next_call(boss: User) -> None:
    token, raw = issue_token(boss, "laptop", confinement="host")
    assert (found := principal(raw)) is not None and found.confinement == "host"
    change_token_confinement(token, "", None)
    assert (found := principal(raw)) is not None and found.confinement == ""  # the installation's default


@requires_sqlite
@pytest.mark.django_db(transaction=True)
def test_a_token_in_steady_use_gets_its_new_profile_on_its_next_call_through_the_shortcut_too(
    django_user_model: type[User], monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = django_user_model.objects.create_user("steady-owner")
    token, raw = issue_token(owner, "steady", confinement="host")
    authenticator = build_authenticator()
    assert authenticator.checks_steady_tokens
    try:
        authenticate = async_to_sync(authenticator)
        assert (found := authenticate(raw)) is not None and found.confinement == "host"  # its first use, recorded
        change_token_confinement(token, "workspace", None)
        monkeypatch.setattr(authenticator, "principal_for", lambda *args: pytest.fail("not the shortcut"))
        assert (found := authenticate(raw)) is not None and found.confinement == "workspace"
    finally:
        authenticator.close()


def test_an_oauth_principal_carries_the_apps_profile_for_its_own_user_only(
    boss: User, django_user_model: type[User]
) -> None:
    other = django_user_model.objects.create_user("other", is_staff=True)
    application = new_app()
    mine, theirs = access_token(application, boss), access_token(application, other)
    assert (found := principal(mine)) is not None and found.confinement == ""
    change_app_confinement(application, boss, "host", None)
    assert (found := principal(mine)) is not None and found.confinement == "host"
    assert (found := principal(theirs)) is not None and found.confinement == ""


def test_a_profile_that_is_no_profile_is_refused_and_changes_nothing(boss: User) -> None:
    token, _ = issue_token(boss, "laptop")
    with pytest.raises(ValueError, match="workspace, host or empty"):
        change_token_confinement(token, "root", None)
    with pytest.raises(ValueError, match="workspace, host or empty"):
        issue_token(boss, "other", confinement="none")
    token.refresh_from_db()
    assert token.confinement == "" and not BearerToken.objects.filter(name="other").exists()
    assert not events("token.confinement_changed")


# --- the token form and page -----------------------------------------------------------------------------------------


def add_token(console: Client, user: User, **fields: str) -> Any:
    data = {"name": "laptop", "user": str(user.pk), "scope": SCOPE_ALL, "expiry": "30", "confinement": "", **fields}
    return console.post(ADD, data)


@override_settings(CONFINEMENT_DEFAULT="workspace")
def test_the_token_form_offers_each_profile_in_plain_words_with_the_installation_default_chosen(
    console: Client,
) -> None:
    response = console.get(ADD)
    assert response.context["adminform"].form["confinement"].value() == ""
    content = response.content.decode()
    assert 'type="radio" name="confinement"' in content
    assert "the installation&#x27;s default, now workspace" in content
    assert "write only there and in a private temporary directory" in content
    assert "and sudo where the OS allows it" in content


def test_a_token_made_with_host_keeps_it_and_its_creation_record_says_so(console: Client, boss: User) -> None:
    assert add_token(console, boss, confinement="host").status_code == 302
    assert BearerToken.objects.get(name="laptop").confinement == "host"
    (created,) = events("token.created")
    assert detail_of(created)["confinement"] == "host"
    assert "with scope mcp, confinement host" in str(event_sentence(created))


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"scope": SCOPE_READ, "confinement": "host"}, "A read-only token has no confinement profile"),
        ({"confinement": "root"}, "Select a valid choice"),
    ],
)
def test_a_profile_the_token_cannot_have_is_refused_with_a_clear_error_and_makes_no_token(
    console: Client, boss: User, fields: dict[str, str], error: str
) -> None:
    response = add_token(console, boss, **fields)
    assert response.status_code == 200
    assert any(error in message for message in response.context["adminform"].form.errors.get("confinement", []))
    assert not BearerToken.objects.exists()


def test_changing_a_tokens_profile_on_its_page_records_who_changed_it_from_what_to_what(
    console: Client, boss: User
) -> None:
    token, _ = issue_token(boss, "laptop")
    page = f"{TOKENS}{token.pk}/change/"
    assert console.post(page, {"name": "laptop", "confinement": "host"}).status_code == 302
    token.refresh_from_db()
    assert token.confinement == "host"
    (changed,) = events("token.confinement_changed")
    assert changed.username == "boss" and changed.credential_kind == "session"
    assert (detail_of(changed)["previous"], detail_of(changed)["confinement"]) == ("", "host")
    assert "boss changed the confinement of token laptop" in str(event_sentence(changed))
    assert "to host" in str(event_sentence(changed))
    # Renaming alone records no change of profile.
    assert console.post(page, {"name": "laptop 2", "confinement": "host"}).status_code == 302
    assert len(events("token.confinement_changed")) == 1
    assert BearerToken.objects.get(pk=token.pk).name == "laptop 2"


def test_a_read_only_tokens_page_says_it_needs_no_profile_and_a_posted_one_is_ignored(
    console: Client, boss: User
) -> None:
    token, _ = issue_token(boss, "reader", scope=SCOPE_READ)
    page = f"{TOKENS}{token.pk}/change/"
    content = console.get(page).content.decode()
    assert "always run in the strictest read sandbox" in content and 'name="confinement"' not in content
    console.post(page, {"name": "reader", "confinement": "host"})
    token.refresh_from_db()
    assert token.confinement == "" and not events("token.confinement_changed")


def test_a_host_token_has_a_warning_badge_in_the_list_and_on_its_page(console: Client, boss: User) -> None:
    with override_settings(CONFINEMENT_DEFAULT="workspace"):
        confined, _ = issue_token(boss, "confined")
        assert HOST_BADGE not in console.get(TOKENS).content.decode()
        assert HOST_BADGE not in console.get(f"{TOKENS}{confined.pk}/change/").content.decode()
        wide, _ = issue_token(boss, "wide", confinement="host")
        assert console.get(TOKENS).content.decode().count(HOST_BADGE) == 1
        page = console.get(f"{TOKENS}{wide.pk}/change/").content.decode()
        assert HOST_BADGE in page and "the full reach of" in page
    with override_settings(CONFINEMENT_DEFAULT="host"):  # a token left to a `host` default warns too
        assert console.get(TOKENS).content.decode().count(HOST_BADGE) == 2


@override_settings(CONFINEMENT_DEFAULT="workspace", CONFINEMENT_DEFAULT_CHOSEN=False)
def test_where_the_kernel_cannot_enforce_workspace_the_token_pages_say_what_happens_instead(
    console: Client, boss: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_identity, "_confinement", {"profiles": {"workspace": "Landlock is not available"}})
    chosen, _ = issue_token(boss, "chosen", confinement="workspace")
    left, _ = issue_token(boss, "left")
    page = console.get(f"{TOKENS}{chosen.pk}/change/").content.decode()
    assert "this credential&#x27;s calls are refused" in page and HOST_BADGE not in page
    page = console.get(f"{TOKENS}{left.pk}/change/").content.decode()  # the unchosen default falls back to host
    assert HOST_BADGE in page and "calls are refused" not in page
    with override_settings(CONFINEMENT_DEFAULT_CHOSEN=True):  # a default the admin chose does not fall back
        page = console.get(f"{TOKENS}{left.pk}/change/").content.decode()
        assert HOST_BADGE not in page and "calls are refused" in page


# --- create_token ----------------------------------------------------------------------------------------------------


def test_create_token_takes_a_confinement_and_refuses_one_for_a_read_only_token(boss: User) -> None:
    call_command("create_token", "cli", "--user", "boss", "--confinement", "host")
    assert BearerToken.objects.get(name="cli").confinement == "host"
    with pytest.raises(CommandError, match="full-scope tokens"):
        call_command("create_token", "cli-read", "--user", "boss", "--scope", SCOPE_READ, "--confinement", "host")
    with pytest.raises(CommandError, match="invalid choice"):
        call_command("create_token", "cli-bad", "--user", "boss", "--confinement", "root")
    assert not BearerToken.objects.filter(name__startswith="cli-").exists()


# --- a connected app's page ------------------------------------------------------------------------------------------


def test_a_connected_apps_page_changes_a_users_profile_and_the_audit_log_says_who(console: Client, boss: User) -> None:
    application = new_app()
    access_token(application, boss)
    page = f"{APPS}{application.pk}/change/"
    assert 'id="app-confinement"' in console.get(page).content.decode()
    response = console.post(f"{APPS}{application.pk}/confinement/", {"user": boss.pk, "confinement": "host"})
    assert response.status_code == 302
    assert AppConfinement.objects.get(application=application, user=boss).confinement == "host"
    (changed,) = events("oauth.confinement_changed")
    assert changed.username == "boss" and detail_of(changed)["owner"] == "boss"
    assert "for boss from the installation" in str(event_sentence(changed))
    assert HOST_BADGE in console.get(page).content.decode()
    assert HOST_BADGE in console.get(APPS).content.decode()
    assert HOST_BADGE in console.get("/admin/oauth/connectedappaccesstoken/").content.decode()


@pytest.mark.parametrize(
    ("data", "why"), [({"confinement": "root"}, "bad profile"), ({"user": "999999"}, "a user it does not act as")]
)
def test_a_bad_change_of_an_apps_profile_is_refused_and_changes_nothing(
    console: Client, boss: User, data: dict[str, str], why: str
) -> None:
    application = new_app()
    access_token(application, boss)
    response = console.post(
        f"{APPS}{application.pk}/confinement/", {"user": str(boss.pk), "confinement": "host", **data}, follow=True
    )
    assert "Nothing changed" in response.content.decode(), why
    assert not AppConfinement.objects.exists() and not events("oauth.confinement_changed")


def test_a_staff_user_who_may_only_view_apps_cannot_change_a_profile(django_user_model: type[User]) -> None:
    viewer = django_user_model.objects.create_user("viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_connectedapp"))
    application = new_app()
    access_token(application, viewer)
    browser = Client()
    browser.force_login(viewer)
    page = browser.get(f"{APPS}{application.pk}/change/").content.decode()
    assert 'id="app-confinement"' in page and "app-confinement-form" not in page
    response = browser.post(f"{APPS}{application.pk}/confinement/", {"user": viewer.pk, "confinement": "host"})
    assert response.status_code == 403
    assert not AppConfinement.objects.exists()


# --- the consent card ------------------------------------------------------------------------------------------------


def consent_url(scope: str = SCOPE_ALL) -> tuple[str, Any]:
    client = register_here()
    _, challenge = pkce()
    return authorize_url(HERE, client, challenge, scope=scope), client


@override_settings(CONFINEMENT_DEFAULT="workspace")
def test_an_admin_chooses_the_profile_on_the_consent_card_and_the_approval_keeps_it() -> None:
    admin = AdminHere()
    url, client = consent_url()
    page = admin.consent_page(url).content.decode()
    assert 'id="confinement"' in page and "Confinement:</span> workspace (the installation&#x27;s default), or" in page
    assert 'type="radio" name="confinement" value="" checked' in page
    assert 'type="radio" name="confinement" value="host">' in page
    answer = {**consent_answer(page, approve=True), "confinement": "host"}
    location = post_form(admin.http, url, answer, HTTP_REFERER=url)["Location"]
    assert "code" in query_of(location)
    application = Application.objects.get(client_id=client.client_id)
    assert AppConfinement.objects.get(application=application, user=admin.user).confinement == "host"
    (consent,) = audit_events_here("oauth.consent")
    assert consent["detail"]["confinement"] == "host"
    assert [detail_of(e)["confinement"] for e in events("oauth.confinement_changed")] == ["host"]


@override_settings(CONFINEMENT_DEFAULT="host")
def test_a_staff_approver_who_may_not_change_apps_sees_the_default_and_cannot_post_another(
    django_user_model: type[User],
) -> None:
    approver = django_user_model.objects.create_user("approver", is_staff=True)
    browser = web_client()
    browser.force_login(approver)
    url, client = consent_url()
    page = browser.get(url).content.decode()
    assert "host (the installation&#x27;s default): the full reach of" in page
    assert 'name="confinement"' not in page and "an admin can change it" in page
    answer = {**consent_answer(page, approve=True), "confinement": "workspace"}
    assert "code" in query_of(post_form(browser, url, answer, HTTP_REFERER=url)["Location"])
    application = Application.objects.get(client_id=client.client_id)
    assert AppConfinement.objects.get(application=application, user=approver).confinement == ""
    assert not events("oauth.confinement_changed")


def test_a_read_only_consent_says_no_profile_is_needed() -> None:
    admin = AdminHere()
    url, _ = consent_url(SCOPE_READ)
    page = admin.consent_page(url).content.decode()
    assert "always run in the strictest read sandbox" in page and 'name="confinement"' not in page


def test_a_bad_profile_on_the_consent_form_is_refused_and_issues_no_code() -> None:
    admin = AdminHere()
    url, _ = consent_url()
    page = admin.consent_page(url).content.decode()
    answer = {**consent_answer(page, approve=True), "confinement": "root"}
    response = post_form(admin.http, url, answer, HTTP_REFERER=url)
    assert response.status_code == 400 and b"The confinement profile must be" in response.content
    assert not Grant.objects.exists() and not AppConfinement.objects.exists()
