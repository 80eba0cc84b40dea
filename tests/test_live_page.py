"""The console's Live page (mcpserver/live_views.py), the approval cards' script on every console page
(templates/admin/base_site.html), the policy decision on an audit call's page (audit.views.policy_detail) and a Live
row's "Revoke credential" (its confirmation returns to Live), through Django's test client."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application

from audit.log import Actor, call_started, event
from mcpserver.console_socket import revoke_url
from mcpserver.models import APPROVAL_DENIED, APPROVAL_PENDING, ApprovalRequest
from oauth.tokens import issue_token
from tests.oauth_flow import hidden_inputs

if TYPE_CHECKING:
    from django.test.client import _MonkeyPatchedWSGIResponse as TestResponse

pytestmark = pytest.mark.django_db
LIVE = "/admin/live/"
SCRIPT = re.compile(r'<script src="[^"]*mcpserver/console_live\.js" data-socket="/admin/live/socket" defer>')
XSS = "<img src=x onerror=alert(1)>"


def request_row(**fields: Any) -> ApprovalRequest:
    values: dict[str, Any] = {
        "expires_at": timezone.now() + timedelta(minutes=5),
        "call_id": "c" * 32,
        "instance_id": "i" * 32,
        "tool": "terminal_exec",
        "arguments": {"command": "git push --force"},
        "arguments_sha256": "0" * 64,
        "shape": "git push --force",
        "username": "agent",
        "credential_key": "bearer:5",
        "credential_kind": "bearer",
        "credential_id": "5",
        "rule_id": "force-push",
        **fields,
    }
    return ApprovalRequest.objects.create(**values)


def test_the_live_page_is_a_frame_the_socket_fills(admin_client: Client) -> None:
    page = admin_client.get(LIVE).content.decode()
    for part in ('id="live-page"', 'id="live-status"', 'id="live-approvals-cards"', 'id="live-calls"'):
        assert part in page
    assert 'id="live-background-rows"' in page and SCRIPT.search(page)
    assert "<script>" not in page  # no inline script


def test_every_console_page_loads_the_cards_and_links_the_live_page(admin_client: Client) -> None:
    for url in ("/admin/", "/admin/audit/auditrecord/", "/admin/oauth/bearertoken/"):
        page = admin_client.get(url).content.decode()
        assert SCRIPT.search(page), url
        assert f'<a href="{LIVE}" id="nav-live">Live</a>' in page, url


def test_a_session_that_may_not_use_the_console_gets_neither(client: Client) -> None:
    assert client.get(LIVE)["Location"].startswith("/admin/login/")
    page = client.get("/admin/login/").content.decode()
    assert "console_live.js" not in page and 'id="nav-live"' not in page
    visitor = User.objects.create_user("visitor", password="a password that is long")
    client.force_login(visitor)
    assert client.get(LIVE)["Location"].startswith("/admin/login/")


def test_a_linked_request_still_waiting_is_the_card_to_show(admin_client: Client) -> None:
    waiting = request_row()
    page = admin_client.get(f"{LIVE}?request={waiting.pk}").content.decode()
    assert f'data-focus="{waiting.pk}"' in page and 'id="live-focus"' not in page


def test_a_linked_request_decided_meanwhile_says_by_whom(admin_client: Client) -> None:
    decided = request_row(
        state=APPROVAL_DENIED, decided_by="alice", channel="console", decided_at=timezone.now(), reason=XSS
    )
    page = admin_client.get(f"{LIVE}?request={decided.pk}").content.decode()
    note = html.unescape(re.sub(r"\s+", " ", page.split('id="live-focus"', 1)[1].split("</p>", 1)[0]))
    assert f"{decided.label} no longer waits: denied by alice (console)" in note and note.endswith(f": {XSS}. ")
    assert XSS not in page  # escaped
    expired = request_row(state=APPROVAL_PENDING, expires_at=timezone.now() - timedelta(seconds=1))
    assert (
        f"{expired.label} no longer waits: expired" in admin_client.get(f"{LIVE}?request={expired.pk}").content.decode()
    )
    assert "There is no approval request R-987654." in admin_client.get(f"{LIVE}?request=987654").content.decode()
    for junk in ("abc", "-1", "9" * 30):
        assert 'id="live-focus"' not in admin_client.get(f"{LIVE}?request={junk}").content.decode()


# --- the audit call page ---------------------------------------------------------------------------------------------


def agent() -> Actor:
    return Actor(user_id=1, username="agent", credential_kind="bearer", credential_id="5", credential_name="laptop")


def call_page(client: Client, policy: dict[str, Any] | None) -> str:
    started = call_started(agent(), "terminal_exec", {"command": "git push --force"}, "test-instance", policy)
    return html.unescape(client.get(f"/admin/audit/auditrecord/{started.pk}/change/").content.decode())


def test_a_call_page_says_what_the_policy_decided_and_who_approved(admin_client: Client) -> None:
    approved = {"by": "alice", "through": "grant", "request": "R-17"}
    policy = {"decision": "ask", "rule": "force-push", "reason": "rewrites history", "approved": approved}
    started = call_started(agent(), "terminal_exec", {"command": "git push --force"}, "test-instance", policy)
    admin = Actor(user_id=2, username="alice", credential_kind="session")
    event("approval.decided", admin, request="R-16", decision="denied", channel="console", latency_ms=1)
    event(
        "approval.decided", admin, request="R-17", decision="approved", channel="console", latency_ms=12345,
        reason="", grant_minutes=10,
    )  # fmt: skip
    page = html.unescape(admin_client.get(f"/admin/audit/auditrecord/{started.pk}/change/").content.decode())
    assert "Policy: ask (rule force-push) — rewrites history" in re.sub(r"<[^>]+>", "", page)
    approval = page.split('id="call-approval">', 1)[1].split("</p>", 1)[0]
    assert (
        approval.startswith("R-17 approved by alice, ") and ", through console, 12.3 s after it was asked" in approval
    )
    assert approval.endswith(", with a 10-minute grant for this credential.")


def test_a_call_page_without_a_recorded_decision_says_only_the_policy(admin_client: Client) -> None:
    page = call_page(admin_client, {"decision": "allow", "rule": "default", "reason": "no rule matched"})
    assert 'id="call-policy"' in page and 'id="call-approval"' not in page
    page = call_page(admin_client, {"decision": "ask", "rule": "r", "reason": "", "request": "R-99"})
    assert "R-99: no decision recorded." in page
    assert 'id="call-policy"' not in call_page(admin_client, None)


# --- "Revoke credential" on a Live row: the confirmation, then back to Live saying what was revoked -----------------


def staff_client(user: User) -> Client:
    """A browser's session: CSRF checked as a browser's form would be."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def confirm_from_live(client: Client, credential_key: str) -> TestResponse:
    """Open the link a Live row carries for `credential_key` and submit its confirmation as the browser would (its
    hidden fields: the CSRF token and where to return), following the redirect."""
    link = revoke_url(credential_key)
    page = client.get(link)
    assert page.status_code == 200, link
    return client.post(link.split("?")[0], hidden_inputs(page.content.decode(), "revoke-form"), follow=True)


def test_revoking_a_token_from_a_live_row_returns_to_live_saying_which_token(admin_user: User) -> None:
    token, _ = issue_token(admin_user, "laptop")
    answer = confirm_from_live(staff_client(admin_user), f"bearer:{token.pk}")
    assert answer.redirect_chain == [(LIVE, 302)] and answer.request["PATH_INFO"] == LIVE
    page = html.unescape(answer.content.decode())
    assert 'id="live-page"' in page and "Revoked token “laptop”." in page
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_revoking_an_app_from_a_live_row_returns_to_live_saying_which_app(admin_user: User) -> None:
    app = Application.objects.create(
        name="Claude", client_type="public", authorization_grant_type="authorization-code",
        redirect_uris="https://claude.ai/api/mcp/auth_callback",
    )  # fmt: skip
    AccessToken.objects.create(application=app, user=admin_user, scope="mcp", token="t-1",
                               expires=timezone.now() + timedelta(hours=1))  # fmt: skip
    answer = confirm_from_live(staff_client(admin_user), f"oauth:{app.pk}:{admin_user.pk}")
    assert answer.redirect_chain == [(LIVE, 302)]
    page = html.unescape(answer.content.decode())
    assert 'id="live-page"' in page and "Revoked every token of “Claude”." in page
    assert not AccessToken.objects.filter(application=app).exists()


def test_the_live_revoke_still_asks_first_and_needs_csrf_and_the_change_permission(
    admin_user: User, django_user_model: type[User]
) -> None:
    token, _ = issue_token(admin_user, "laptop")
    link = revoke_url(f"bearer:{token.pk}")
    browser = staff_client(admin_user)
    assert 'id="revoke-form"' in browser.get(link).content.decode()  # a GET only asks
    assert browser.post(link.split("?")[0], {"next": LIVE}).status_code == 403  # no CSRF token
    viewer = django_user_model.objects.create_user("viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_bearertoken"))
    watcher = Client()
    watcher.force_login(viewer)
    assert watcher.get(link).status_code == 403 and watcher.post(link).status_code == 403
    token.refresh_from_db()
    assert token.revoked_at is None


def test_a_revoke_confirmation_never_returns_to_another_site(admin_user: User) -> None:
    token, _ = issue_token(admin_user, "laptop")
    client = staff_client(admin_user)
    url = reverse("admin:oauth_bearertoken_revoke", args=[token.pk])
    page = client.get(f"{url}?next=https://evil.example/admin/live/")
    form = hidden_inputs(page.content.decode(), "revoke-form")
    assert form["next"] == reverse("admin:oauth_bearertoken_change", args=[token.pk])
    answer = client.post(url, {**form, "next": "//evil.example/"})
    assert answer.status_code == 302 and answer["Location"] == form["next"]
