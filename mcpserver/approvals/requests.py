"""Approval requests and timed grants in the database: creating a request, deciding it exactly once, and finding
a grant that covers a call.

A request changes state once, from pending, by a conditional UPDATE: whoever updates the row first (an
administrator, the client's user through elicitation, the timeout, the call's end) decides it, and everyone else
learns that they came too late. An approval is bound to the request, and the request to its call's exact
arguments (their SHA-256) and credential: it lets that one call run, nothing else.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.instances import is_alive
from audit.models import ServerInstance
from mcpserver.models import (
    APPROVAL_APPROVED,
    APPROVAL_CANCELLED,
    APPROVAL_DENIED,
    APPROVAL_PENDING,
    APPROVAL_TIMED_OUT,
    ApprovalGrant,
    ApprovalRequest,
)

CHANNEL_CONSOLE = "console"
CHANNEL_ELICITATION = "elicitation"
CHANNEL_TIMEOUT = "timeout"
CHANNEL_ENDED = "ended"  # the call ended first (client gone, server stopping)
MAX_GRANT_MINUTES = 24 * 60
MAX_REASON = 2000
DESCRIPTION_CHARS = 500  # as terminal_exec takes it


class DecisionRefused(Exception):
    """The decision cannot be taken (already decided, unknown request, bad input); the message says why."""


@dataclass(frozen=True)
class Decided:
    """What a decided request says to the call waiting for it."""

    request_id: int
    call_id: str
    state: str
    decided_by: str
    channel: str
    reason: str
    latency_ms: int


def arguments_digest(arguments: dict[str, Any]) -> str:
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def create_request(**fields: Any) -> ApprovalRequest:
    return ApprovalRequest.objects.create(**fields)


def decide(
    request_id: int,
    approve: bool,
    by: str,
    channel: str,
    reason: str = "",
    grant_minutes: int | None = None,
    credential_key: str | None = None,
) -> Decided:
    """Approve or deny a pending request. `credential_key`, for elicitation: the request must be that
    credential's. Through elicitation only a request the client's user may answer is decided. Raises
    DecisionRefused when it is not pending (someone else decided first) or input is bad."""
    reason = reason.strip()[:MAX_REASON]
    if grant_minutes is not None and not (approve and 1 <= grant_minutes <= MAX_GRANT_MINUTES):
        raise DecisionRefused(f"a grant lasts 1 to {MAX_GRANT_MINUTES} minutes and comes with an approval")
    now = timezone.now()
    state = APPROVAL_APPROVED if approve else APPROVAL_DENIED
    with transaction.atomic():
        pending = ApprovalRequest.objects.filter(pk=request_id, state=APPROVAL_PENDING, expires_at__gt=now)
        if credential_key is not None:
            pending = pending.filter(credential_key=credential_key)
        if channel == CHANNEL_ELICITATION:
            pending = pending.filter(user_may_approve=True)
        changed = pending.update(
            state=state,
            decided_at=now,
            decided_by=by[:150],
            channel=channel,
            reason=reason,
            grant_minutes=grant_minutes,
        )
        if not changed:
            raise DecisionRefused(_why_not(request_id))
        request = ApprovalRequest.objects.get(pk=request_id)
        if grant_minutes:
            ApprovalGrant.objects.create(
                credential_key=request.credential_key,
                tool=request.tool,
                shape=request.shape,
                expires_at=now + timedelta(minutes=grant_minutes),
                granted_by=by[:150],
                request=request,
            )
    return _decided(request)


def end_request(request_id: int, state: str, channel: str) -> Decided | None:
    """Close a pending request without a person's answer (timeout, or the call ended); None if it was decided."""
    assert state in (APPROVAL_TIMED_OUT, APPROVAL_CANCELLED)
    now = timezone.now()
    changed = ApprovalRequest.objects.filter(pk=request_id, state=APPROVAL_PENDING).update(
        state=state, decided_at=now, decided_by="", channel=channel
    )
    return _decided(ApprovalRequest.objects.get(pk=request_id)) if changed else None


def decision_of(request_id: int) -> Decided | None:
    """The decision on a request, or None while it is pending."""
    request = ApprovalRequest.objects.filter(pk=request_id).first()
    if request is None or request.state == APPROVAL_PENDING:
        return None
    return _decided(request)


def covering_grant(credential_key: str, tool: str, shape: str) -> ApprovalGrant | None:
    return (
        ApprovalGrant.objects.filter(
            credential_key=credential_key, tool=tool, shape=shape, expires_at__gt=timezone.now(), revoked_at=None
        )
        .select_related("request")
        .first()
    )


def cancel_orphaned(current_instance: str) -> int:
    """End the pending requests of server processes that are gone: the calls they held are gone with them (and
    the exact arguments of a held command, which only the waiting process kept)."""
    pending = ApprovalRequest.objects.filter(state=APPROVAL_PENDING).exclude(instance_id=current_instance)
    holders = {i.pk: i for i in ServerInstance.objects.filter(pk__in=pending.values("instance_id"))}
    gone = [name for name in pending.values_list("instance_id", flat=True).distinct()
            if name not in holders or not is_alive(holders[name])]  # fmt: skip
    return pending.filter(instance_id__in=gone).update(
        state=APPROVAL_CANCELLED, decided_at=timezone.now(), channel=CHANNEL_ENDED
    )


def expire_overdue(now: datetime | None = None) -> int:
    """Pending requests past their time whose process is gone (nobody is left to time them out)."""
    return ApprovalRequest.objects.filter(state=APPROVAL_PENDING, expires_at__lte=now or timezone.now()).update(
        state=APPROVAL_TIMED_OUT, decided_at=timezone.now(), channel=CHANNEL_TIMEOUT
    )


def _why_not(request_id: int) -> str:
    request = ApprovalRequest.objects.filter(pk=request_id).first()
    if request is None:
        return f"there is no request R-{request_id}"
    if request.state != APPROVAL_PENDING:
        who = f" by {request.decided_by}" if request.decided_by else ""
        return f"R-{request_id} was already decided: {request.state.replace('_', ' ')}{who} ({request.channel})"
    if not request.user_may_approve and request.expires_at > timezone.now():
        return f"R-{request_id} needs staff: the client's user cannot answer it"
    return f"R-{request_id} has expired"


def _decided(request: ApprovalRequest) -> Decided:
    latency = int((request.decided_at - request.created_at).total_seconds() * 1000) if request.decided_at else 0
    return Decided(
        request.pk, request.call_id, request.state, request.decided_by, request.channel, request.reason, latency
    )


def describe(request: ApprovalRequest) -> dict[str, Any]:
    """A request as the console's card and the live view show it (plain data, escaped where it is shown)."""
    return {
        "id": request.pk,
        "label": request.label,
        "state": request.state,
        "created_at": request.created_at.isoformat(),
        "expires_at": request.expires_at.isoformat(),
        "tool": request.tool,
        "summary": summary_of(request.tool, request.arguments),
        "description": description_of(request.arguments),
        "arguments": request.arguments,
        "cwd": request.cwd,
        "username": request.username,
        "credential_name": request.credential_name,
        "credential_key": request.credential_key,
        "client": request.client_id,
        "address": request.client_address,
        "rule_id": request.rule_id,
        "rule_reason": request.rule_reason,
        "user_may_approve": request.user_may_approve,
        "held": request.held,
        "decided_by": request.decided_by,
        "channel": request.channel,
        "reason": request.reason,
        "grant_minutes": request.grant_minutes,
    }


def description_of(arguments: Any) -> str:
    """What the agent said its command is for (terminal_exec's `description`): its words, to be shown as such."""
    described = arguments.get("description") if isinstance(arguments, dict) else None
    return described[:DESCRIPTION_CHARS] if isinstance(described, str) else ""


def summary_of(tool: str, arguments: Any) -> str:
    """The exact command of a command tool, else the arguments as compact JSON."""
    if isinstance(arguments, dict) and isinstance(arguments.get("command"), str):
        return str(arguments["command"])
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True, default=str)


def consume_approved(credential_key: str, tool: str, digest: str) -> ApprovalRequest | None:
    """An approved, held request for exactly this call, not used yet: used now, by this call (once)."""
    since = timezone.now() - timedelta(seconds=settings.APPROVAL_TIMEOUT)
    with transaction.atomic():
        found = (
            ApprovalRequest.objects.select_for_update()
            .filter(
                state=APPROVAL_APPROVED,
                held=True,
                outcome="",
                credential_key=credential_key,
                tool=tool,
                arguments_sha256=digest,
                decided_at__gte=since,
            )
            .order_by("id")
            .first()
        )
        if found is None:
            return None
        found.outcome = "run when the agent called again"
        found.save(update_fields=["outcome"])
    return found


def request_of(credential_key: str, label: str) -> ApprovalRequest | None:
    """A request of this credential by its label (`R-17`), else None."""
    number = label.removeprefix("R-").removeprefix("r-")
    if not number.isdigit() or len(number) > 18:
        return None
    return ApprovalRequest.objects.filter(pk=int(number), credential_key=credential_key).first()
