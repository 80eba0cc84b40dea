"""Approval requests in the database (mcpserver/approvals/requests.py): decided exactly once, bound to the
credential that asked when its client's user answers, grants only with an approval and within bounds, and the
requests of server processes that are gone cancelled when another starts."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import ServerInstance
from mcpserver.approvals.requests import (
    MAX_GRANT_MINUTES,
    DecisionRefused,
    cancel_orphaned,
    decide,
    end_request,
    request_of,
)
from mcpserver.models import ApprovalGrant, ApprovalRequest

pytestmark = [pytest.mark.inprocess, pytest.mark.django_db]


def pending(instance_id: str = "i" * 32, **fields: object) -> ApprovalRequest:
    values: dict[str, object] = {
        "expires_at": timezone.now() + timedelta(minutes=5), "call_id": "c" * 32, "instance_id": instance_id,
        "tool": "terminal_exec", "arguments": {"command": "sudo true"}, "arguments_sha256": "0" * 64,
        "shape": "sudo", "username": "agent", "credential_key": "bearer:3", "credential_kind": "bearer",
        "credential_id": "3", "credential_name": "laptop", "rule_id": "privilege",
    }  # fmt: skip
    return ApprovalRequest.objects.create(**{**values, **fields})


def test_the_first_decision_wins_and_the_second_is_told_who_took_it() -> None:
    request = pending()
    first = decide(request.pk, True, "alice", "console")
    assert (first.state, first.decided_by, first.call_id) == ("approved", "alice", "c" * 32)
    with pytest.raises(DecisionRefused, match=f"R-{request.pk} was already decided: approved by alice"):
        decide(request.pk, False, "bob", "console", "no")
    assert end_request(request.pk, "timed_out", "timeout") is None  # the timeout comes too late, changes nothing
    assert ApprovalRequest.objects.get(pk=request.pk).state == "approved"


def test_an_expired_or_unknown_request_cannot_be_approved() -> None:
    request = pending(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(DecisionRefused, match="has expired"):
        decide(request.pk, True, "alice", "console")
    with pytest.raises(DecisionRefused, match="there is no request R-999999"):
        decide(999999, True, "alice", "console")


def test_the_clients_user_decides_only_the_requests_of_their_own_credential() -> None:
    request = pending(user_may_approve=True)
    with pytest.raises(DecisionRefused):
        decide(request.pk, True, "mallory", "elicitation", credential_key="bearer:4")
    assert decide(request.pk, True, "agent", "elicitation", credential_key="bearer:3").state == "approved"


def test_the_clients_user_cannot_decide_a_request_that_needs_staff() -> None:
    request = pending()  # user_may_approve is False: a rule that needs staff asked
    with pytest.raises(DecisionRefused, match=f"R-{request.pk} needs staff"):
        decide(request.pk, True, "agent", "elicitation", credential_key="bearer:3")
    assert ApprovalRequest.objects.get(pk=request.pk).state == "pending"
    assert decide(request.pk, False, "alice", "console", "no").state == "denied"


@pytest.mark.parametrize(("approve", "minutes"), [(True, 0), (True, MAX_GRANT_MINUTES + 1), (False, 10)])
def test_a_grant_comes_with_an_approval_and_within_bounds(approve: bool, minutes: int) -> None:
    request = pending()
    with pytest.raises(DecisionRefused, match="a grant lasts"):
        decide(request.pk, approve, "alice", "console", grant_minutes=minutes)
    assert ApprovalRequest.objects.get(pk=request.pk).state == "pending" and not ApprovalGrant.objects.exists()


def test_a_grant_covers_the_requests_credential_tool_and_shape_for_its_minutes() -> None:
    request = pending()
    decide(request.pk, True, "alice", "console", grant_minutes=15)
    grant = ApprovalGrant.objects.get()
    assert (grant.credential_key, grant.tool, grant.shape, grant.granted_by) == (
        "bearer:3",
        "terminal_exec",
        "sudo",
        "alice",
    )
    assert timedelta(minutes=14) < grant.expires_at - timezone.now() <= timedelta(minutes=15)


def test_requests_are_found_by_label_for_their_own_credential_only() -> None:
    request = pending()
    assert request_of("bearer:3", request.label) == request
    assert request_of("bearer:4", request.label) is None
    assert request_of("bearer:3", "R-x") is None and request_of("bearer:3", "R-" + "9" * 40) is None


def test_a_starting_server_cancels_the_requests_of_processes_that_are_gone_only() -> None:
    now = timezone.now()
    ServerInstance.objects.create(id="g" * 32, hostname=socket.gethostname(), pid=os.getpid(), stopped_at=now)
    ServerInstance.objects.create(id="l" * 32, hostname=socket.gethostname(), pid=os.getpid(), last_seen=now)
    gone, unknown, live = pending("g" * 32), pending("u" * 32), pending("l" * 32)
    assert cancel_orphaned("c" * 32) == 2
    states = {row.pk: (row.state, row.channel) for row in ApprovalRequest.objects.all()}
    assert states[gone.pk] == states[unknown.pk] == ("cancelled", "ended")
    assert states[live.pk] == ("pending", "")
