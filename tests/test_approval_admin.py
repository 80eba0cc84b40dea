"""The console's record of approval requests and timed grants: both listed read-only, and a grant revoked from its
list stops covering calls (they ask again), recorded in the audit log."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from audit.models import AuditRecord
from mcpserver.approvals.requests import covering_grant
from mcpserver.models import ApprovalGrant, ApprovalRequest

pytestmark = [pytest.mark.inprocess, pytest.mark.django_db]


def approved_request(**fields: object) -> ApprovalRequest:
    now = timezone.now()
    return ApprovalRequest.objects.create(
        expires_at=now + timedelta(minutes=5), state="approved", call_id="c" * 32, instance_id="i" * 32,
        tool="terminal_exec", arguments={"command": "git push --force <b>origin</b>"}, arguments_sha256="0" * 64,
        shape="git --force", username="agent", credential_key="bearer:3", credential_kind="bearer",
        credential_id="3", credential_name="laptop", rule_id="force-push", decided_by="admin", channel="console",
        decided_at=now, **fields,
    )  # fmt: skip


def test_requests_are_listed_with_their_command_escaped_and_cannot_be_changed(admin_client: Client) -> None:
    request = approved_request()
    page = admin_client.get("/admin/mcpserver/approvalrequest/").content.decode()
    assert request.label in page and "git push --force &lt;b&gt;origin&lt;/b&gt;" in page
    assert admin_client.post(f"/admin/mcpserver/approvalrequest/{request.pk}/delete/").status_code == 403


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
