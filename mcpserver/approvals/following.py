"""Following a held command by its request's label (`R-17`): what terminal_output, terminal_list and
terminal_input see of a call that waited for approval, before and after it runs as a background command."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from asgiref.sync import sync_to_async

from mcpserver.approvals.requests import request_of
from mcpserver.approvals.waiting import wait_for_decision
from mcpserver.models import APPROVAL_APPROVED, APPROVAL_PENDING, ApprovalRequest, BackgroundProcess
from oauth.credentials import Principal

START_GRACE = 5.0  # seconds an approved command may take to be started by the waiting task


@dataclass(frozen=True)
class NotRunning:
    """A request whose command is not (yet) a background command: its state and what to tell the agent."""

    label: str
    state: str  # pending_approval, denied, timed_out, cancelled, not_started
    text: str
    is_error: bool


def is_label(job_id: int | str) -> bool:
    return isinstance(job_id, str) and job_id[:2].upper() == "R-"


async def job_of_request(principal: Principal, label: str, wait_ms: int) -> BackgroundProcess | NotRunning:
    """The background command the request became, waiting up to `wait_ms` for a decision (and its start)."""
    request = await sync_to_async(request_of)(principal.key, label)
    if request is None:
        return NotRunning(label, "unknown", f"Error: no approval request {label} of this credential", True)
    deadline = time.monotonic() + wait_ms / 1000
    if request.state == APPROVAL_PENDING and wait_ms > 0:
        await wait_for_decision(request.pk, deadline)
    request = await ApprovalRequest.objects.select_related("background").aget(pk=request.pk)
    starting_until = time.monotonic() + START_GRACE
    while request.state == APPROVAL_APPROVED and request.background is None and not request.outcome:
        if time.monotonic() > starting_until:
            break
        await asyncio.sleep(0.1)
        request = await ApprovalRequest.objects.select_related("background").aget(pk=request.pk)
    if request.background is not None:
        return request.background
    return _not_running(request)


def _not_running(request: ApprovalRequest) -> NotRunning:
    label = request.label
    if request.state == APPROVAL_PENDING:
        text = f"{label} still waits for an administrator's approval (until {request.expires_at:%H:%M:%S} UTC)."
        return NotRunning(label, "pending_approval", text, False)
    if request.state == APPROVAL_APPROVED:
        text = f"{label} was approved by {request.decided_by} but did not start: {request.outcome or 'starting'}"
        return NotRunning(label, "not_started", text, True)
    if request.state == "denied":
        reason = request.reason or "no reason given"
        return NotRunning(label, "denied", f"Error: {request.decided_by} denied {label}: {reason}", True)
    if request.state == "timed_out":
        return NotRunning(label, "timed_out", f"Error: no one answered {label} in time, so it did not run", True)
    return NotRunning(label, request.state, f"Error: {label} ended before anyone answered ({request.state})", True)


async def held_requests(principal: Principal, limit: int) -> list[ApprovalRequest]:
    """This credential's held requests that have not become background commands (newest first)."""
    rows = ApprovalRequest.objects.filter(credential_key=principal.key, held=True, background__isnull=True)
    return [row async for row in rows.order_by("-id")[:limit]]
