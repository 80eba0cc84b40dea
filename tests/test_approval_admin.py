"""The console's record of approval requests and timed grants: both listed read-only, a page for each that a person
reads (the call linked, who asked, the rule, who decided, when and through which channel), and a grant revoked from
its list or its page stops covering calls (they ask again), recorded in the audit log."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from audit.log import Actor, call_started
from audit.models import AuditRecord
from mcpserver.approvals.requests import covering_grant
from mcpserver.models import ApprovalGrant, ApprovalRequest
from oauth.tokens import issue_token

pytestmark = [pytest.mark.inprocess, pytest.mark.django_db]


def approved_request(**fields: object) -> ApprovalRequest:
    now = timezone.now()
    approved = dict(
        expires_at=now + timedelta(minutes=5), state="approved", call_id="c" * 32, instance_id="i" * 32,
        tool="terminal_exec", arguments={"command": "git push --force <b>origin</b>"}, arguments_sha256="0" * 64,
        shape="git --force", username="agent", credential_key="bearer:3", credential_kind="bearer",
        credential_id="3", credential_name="laptop", rule_id="force-push", decided_by="admin", channel="console",
        decided_at=now,
    )  # fmt: skip
    return ApprovalRequest.objects.create(**{**approved, **fields})


def test_requests_are_listed_with_their_command_escaped_and_cannot_be_changed(admin_client: Client) -> None:
    request = approved_request()
    page = admin_client.get("/admin/mcpserver/approvalrequest/").content.decode()
    assert request.label in page and "git push --force &lt;b&gt;origin&lt;/b&gt;" in page
    assert admin_client.post(f"/admin/mcpserver/approvalrequest/{request.pk}/delete/").status_code == 403


def section(page: str, element_id: str) -> str:
    """The text of the element with this id, up to the end of its line (the pages keep each fact on one line)."""
    return page.split(f'id="{element_id}"', 1)[1].split("\n", 1)[0]


def grant_of(asked: ApprovalRequest, shape: str = "git --force", minutes: int = 10) -> ApprovalGrant:
    return ApprovalGrant.objects.create(
        credential_key="bearer:3", tool="terminal_exec", shape=shape, granted_by="admin", request=asked,
        expires_at=timezone.now() + timedelta(minutes=minutes),
    )  # fmt: skip


def test_a_revoked_grant_no_longer_covers_the_credentials_calls(admin_client: Client) -> None:
    request = approved_request(grant_minutes=10)
    grant = ApprovalGrant.objects.create(
        credential_key="bearer:3", tool="terminal_exec", shape="git --force",
        expires_at=timezone.now() + timedelta(minutes=10), granted_by="admin", request=request,
    )  # fmt: skip
    assert covering_grant("bearer:3", "terminal_exec", "git --force") == grant
    listed = admin_client.get("/admin/mcpserver/approvalgrant/").content.decode()
    assert "active" in listed and "git --force" in listed
    response = admin_client.post(
        "/admin/mcpserver/approvalgrant/", {"action": "revoke", "_selected_action": [grant.pk]}, follow=True
    )
    assert "Revoked 1 grant." in response.content.decode()
    assert covering_grant("bearer:3", "terminal_exec", "git --force") is None
    record = AuditRecord.objects.filter(event="approval.grants_revoked").get()
    assert record.detail == {"requests": [request.label], "shapes": ["terminal_exec: git --force"]}


# --- the pages of a request and a grant, for people ----------------------------------------------------------------


def test_a_request_page_links_its_call_and_says_who_asked_what_under_which_rule_and_who_decided_how_and_when(
    admin_client: Client,
) -> None:
    token, _ = issue_token(User.objects.get(username="admin"), "laptop")
    actor = Actor(user_id=token.user_id, username="agent", credential_kind="bearer", credential_id=str(token.pk),
                  credential_name="laptop")  # fmt: skip
    call = call_started(actor, "terminal_exec", {"command": "git push --force origin main"}, "i" * 32)
    asked = approved_request(
        call_id=call.call_id, credential_id=str(token.pk), rule_reason="force pushes rewrite history", grant_minutes=10,
        cwd="/srv/work/repo",
    )  # fmt: skip
    grant = ApprovalGrant.objects.create(
        credential_key=f"bearer:{token.pk}", tool="terminal_exec", shape="git --force", granted_by="admin",
        expires_at=timezone.now() + timedelta(minutes=10), request=asked,
    )  # fmt: skip
    page = admin_client.get(f"/admin/mcpserver/approvalrequest/{asked.pk}/change/").content.decode()
    assert f"<h1>Approval request {asked.label}</h1>" in page
    assert section(page, "request-call").count(f'href="/admin/audit/auditrecord/{call.pk}/change/"') == 1
    who = section(page, "request-who")
    assert "agent" in who and f'href="/admin/oauth/bearertoken/{token.pk}/change/"' in who and "laptop" in who
    assert "git push --force &lt;b&gt;origin&lt;/b&gt;" in section(page, "request-command")
    assert "force-push" in section(page, "request-rule") and "force pushes rewrite history" in page
    decided = section(page, "request-decided")
    assert "approved by <code>admin</code> through the console" in decided
    assert re.search(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} UTC", decided), decided
    assert re.search(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} UTC", section(page, "request-asked"))
    assert f'href="/admin/mcpserver/approvalgrant/{grant.pk}/change/"' in section(page, "request-grant")
    assert "<form" not in page.split('id="content-main"')[1]  # nothing to submit: a record, read-only


def test_a_pending_request_page_says_until_when_it_waits_and_links_to_the_live_page(admin_client: Client) -> None:
    asked = approved_request(state="pending", decided_by="", channel="", decided_at=None)
    page = admin_client.get(f"/admin/mcpserver/approvalrequest/{asked.pk}/change/").content.decode()
    assert f'href="/admin/live/?request={asked.pk}"' in section(page, "request-state")
    assert "not yet" in section(page, "request-decided")
    assert "not in the audit log" in section(page, "request-call")  # no call of that id was recorded


def test_requests_and_grants_cannot_be_changed_in_the_admin(admin_client: Client) -> None:
    asked = approved_request(grant_minutes=10)
    grant = grant_of(asked)
    for url, data in (
        (f"/admin/mcpserver/approvalrequest/{asked.pk}/change/", {"state": "denied"}),
        (f"/admin/mcpserver/approvalgrant/{grant.pk}/change/", {"expires_at": "2099-01-01 00:00:00"}),
    ):
        assert admin_client.post(url, data).status_code == 403, url
    assert admin_client.get("/admin/mcpserver/approvalgrant/add/").status_code == 403
    grant.refresh_from_db()
    assert grant.expires_at < timezone.now() + timedelta(minutes=11)


def test_a_grant_page_says_what_it_covers_and_its_button_revokes_that_grant_alone(admin_client: Client) -> None:
    asked = approved_request(grant_minutes=10)
    grants = [grant_of(asked, shape) for shape in ("git --force", "git --mirror")]
    page = admin_client.get(f"/admin/mcpserver/approvalgrant/{grants[0].pk}/change/").content.decode()
    assert "<h1>Grant of R-" in page and "ApprovalGrant object" not in page
    assert "git --force" in section(page, "grant-covers") and "laptop" in section(page, "grant-credential")
    assert f'href="/admin/mcpserver/approvalrequest/{asked.pk}/change/"' in section(page, "grant-request")
    assert re.search(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} UTC", section(page, "grant-expires"))
    form = page.split('id="grant-revoke-form"')[1].split("</form>")[0]
    posted = {name: value for name, value in re.findall(r'name="([^"]+)" value="([^"]*)"', form)}
    response = admin_client.post("/admin/mcpserver/approvalgrant/", posted, follow=True)
    assert "Revoked 1 grant." in response.content.decode()
    assert [grant.pk for grant in ApprovalGrant.objects.filter(revoked_at__isnull=False)] == [grants[0].pk]
    revoked = admin_client.get(f"/admin/mcpserver/approvalgrant/{grants[0].pk}/change/").content.decode()
    assert "revoked" in section(revoked, "grant-status") and 'id="grant-revoke-form"' not in revoked


def test_a_staff_user_who_may_only_view_is_offered_no_revoke(client: Client, django_user_model: type[User]) -> None:
    viewer = django_user_model.objects.create_user("viewer", password="pw-for-tests-456", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename__in=["view_approvalgrant", "view_approvalrequest"]))
    client.force_login(viewer)
    grant = grant_of(approved_request(grant_minutes=10))
    page = client.get(f"/admin/mcpserver/approvalgrant/{grant.pk}/change/").content.decode()
    assert "git --force" in page and 'id="grant-revoke-form"' not in page
    assert 'value="revoke"' not in client.get("/admin/mcpserver/approvalgrant/").content.decode()
    client.post("/admin/mcpserver/approvalgrant/", {"action": "revoke", "_selected_action": [grant.pk]})
    grant.refresh_from_db()
    assert grant.revoked_at is None


def test_the_lists_show_state_and_status_as_coloured_words(admin_client: Client) -> None:
    approved_request(state="timed_out", decided_by="", channel="timeout")
    listed = admin_client.get("/admin/mcpserver/approvalrequest/").content.decode()
    assert '<span class="credential-status credential-status-timed_out">timed out</span>' in listed
    grant = grant_of(approved_request(grant_minutes=10), minutes=-1)
    listed = admin_client.get("/admin/mcpserver/approvalgrant/?status=expired").content.decode()
    assert '<span class="credential-status credential-status-expired">expired</span>' in listed
    assert f"/admin/mcpserver/approvalgrant/{grant.pk}/change/" in listed
    assert f"/admin/mcpserver/approvalgrant/{grant.pk}/change/" not in admin_client.get(
        "/admin/mcpserver/approvalgrant/?status=active").content.decode()  # fmt: skip
