"""Holding a call a policy rule asks about until someone answers: the request, the notifications, the wait, and
what the agent is told.

The call's started record is already written (it says the policy asked). Then the request is created, staff are
told (the console's pages at once, the webhook and e-mail if set up), and the call waits:
- approved: it runs as any call does;
- denied: the agent gets the reason, verbatim;
- no answer within SANDSTORM_APPROVAL_TIMEOUT: denied (fail closed);
- still waiting at SANDSTORM_APPROVAL_HOLD (clients such as Claude.ai give up on a call after about a minute): the
  agent is told it is pending as R-17, and the wait goes on without it (holds.py): an approved command then runs as
  a background command of that credential, any other call runs when the agent calls again with the same arguments.
Where the deciding rule lets the client's own user approve and the client can be asked (elicitation), it is asked
too; the first answer wins, and an "accept" there counts only under such a rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import anyio
from asgiref.sync import sync_to_async
from django.conf import settings
from django.urls import reverse
from django.utils import timezone
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, Field, ValidationError

from audit.log import Actor
from audit.models import AuditRecord
from mcpserver.approvals import notify
from mcpserver.approvals.requests import (
    CHANNEL_ELICITATION,
    CHANNEL_ENDED,
    CHANNEL_TIMEOUT,
    Decided,
    DecisionRefused,
    arguments_digest,
    create_request,
    decision_of,
    describe,
    end_request,
    summary_of,
)
from mcpserver.approvals.waiting import decide_and_announce, record_decision, wait_for_decision
from mcpserver.call import ToolCall
from mcpserver.live import LIVE
from mcpserver.models import APPROVAL_APPROVED, APPROVAL_CANCELLED, APPROVAL_TIMED_OUT, ApprovalRequest
from mcpserver.policy.rules import COMMAND_TOOLS
from mcpserver.policy_gate import Decision, client_id_of, command_shape
from mcpserver.process import INSTANCE_ID

logger = logging.getLogger(__name__)
PROGRESS_SECONDS = 10.0


@dataclass(frozen=True)
class Answer:
    approved: bool
    text: str = ""  # for the agent when not approved
    pending: ApprovalRequest | None = None  # the hold: the wait goes on without the call


class ElicitedAnswer(BaseModel):
    approve: bool = Field(description="Run it?")


async def hold_for_approval(
    call: ToolCall, actor: Actor, arguments: dict[str, Any], decision: Decision, started: AuditRecord
) -> Answer:
    request = await _create(call, actor, arguments, decision, started)
    label = request.label
    LIVE.changed(started.call_id, state="awaiting_approval", approval=label)
    LIVE.approval(describe(request))
    notify.notify_staff(_notice(request))
    began = time.monotonic()
    timeout = float(settings.APPROVAL_TIMEOUT)
    hold_at = began + min(float(settings.APPROVAL_HOLD), timeout)
    last_progress = [0.0]

    async def tick() -> None:
        if time.monotonic() - last_progress[0] >= PROGRESS_SECONDS:
            last_progress[0] = time.monotonic()
            waited = int(time.monotonic() - began)
            await call.progress(f"waiting for an administrator: request {label} ({waited}s)")

    elicitation = _elicit(call, actor, request) if decision.approver == "user" else None
    try:
        decided = await wait_for_decision(request.pk, hold_at, tick)
    except BaseException:
        with anyio.CancelScope(shield=True):
            ended = await sync_to_async(end_request)(request.pk, APPROVAL_CANCELLED, CHANNEL_ENDED)
            if ended is not None:
                await record_decision(ended, None)
        raise
    finally:
        if elicitation is not None:
            elicitation.cancel()
    LIVE.changed(started.call_id, state="running", approval="")
    if decided is None:
        if hold_at - began < timeout:
            await _mark_held(request)
            return Answer(False, pending_text(request), pending=request)
        return await _timed_out(request)
    return _answer(request, decided)


async def _create(
    call: ToolCall, actor: Actor, arguments: dict[str, Any], decision: Decision, started: AuditRecord
) -> ApprovalRequest:
    principal = call.principal
    now = timezone.now()
    cwd = arguments.get("cwd")
    return await sync_to_async(create_request)(
        expires_at=now + timedelta(seconds=settings.APPROVAL_TIMEOUT),
        call_id=started.call_id,
        instance_id=INSTANCE_ID,
        tool=call.name,
        arguments=started.arguments if isinstance(started.arguments, dict) else {},
        arguments_sha256=arguments_digest(arguments),
        shape=command_shape(call.name, arguments, decision.verdict.rule_id),
        cwd=cwd if isinstance(cwd, str) else "",
        user_id=principal.user_id,
        username=principal.username,
        credential_key=principal.key,
        credential_kind=principal.credential_kind,
        credential_id=str(principal.credential_id),
        credential_name=principal.credential_name,
        client_id=await client_id_of(principal) or "",
        client_address=actor.client_address,
        rule_id=decision.verdict.rule_id,
        rule_reason=decision.verdict.reason[:2000],
        user_may_approve=decision.approver == "user",
    )


def _elicit(call: ToolCall, actor: Actor, request: ApprovalRequest) -> asyncio.Task[None] | None:
    """Ask the client's user too, if the client can be asked; their answer decides only this request."""
    context = call.context
    if context is None:
        return None
    session = context.request_context.session
    if not getattr(session, "can_send_request", False) or not _client_elicits(session):
        logger.debug("%s: the client cannot be asked (no back channel or no elicitation)", request.label)
        return None

    async def ask() -> None:
        message = (
            f"Sandstorm: {request.username} asks to run {request.tool}: {summary_of(request.tool, request.arguments)}"
            f"\n(policy rule {request.rule_id}: {request.rule_reason}). Approve request {request.label}?"
        )
        try:
            result = await context.elicit(message, ElicitedAnswer)
        except (MCPError, ValidationError, TimeoutError, anyio.BrokenResourceError, anyio.ClosedResourceError) as error:
            # The client could not or would not answer: the console can still decide.
            logger.info("elicitation for %s not answered: %s", request.label, error)
            return
        approve = result.action == "accept" and getattr(result.data, "approve", False)
        reason = "" if approve else f"declined by {request.username} through the client ({result.action})"
        with contextlib.suppress(DecisionRefused):
            await decide_and_announce(
                request.pk, bool(approve), actor, CHANNEL_ELICITATION, reason, credential_key=request.credential_key
            )

    return asyncio.get_running_loop().create_task(ask())


def _client_elicits(session: Any) -> bool:
    capabilities = getattr(session, "client_capabilities", None)
    return capabilities is not None and getattr(capabilities, "elicitation", None) is not None


async def _mark_held(request: ApprovalRequest) -> None:
    await ApprovalRequest.objects.filter(pk=request.pk).aupdate(held=True)
    request.held = True
    LIVE.approval(describe(request))


async def _timed_out(request: ApprovalRequest) -> Answer:
    ended = await sync_to_async(end_request)(request.pk, APPROVAL_TIMED_OUT, CHANNEL_TIMEOUT)
    if ended is None:  # decided as the time ran out
        decided = await sync_to_async(_decision)(request.pk)
        return _answer(request, decided)
    await record_decision(ended, None)
    return Answer(False, timeout_text(request))


def _decision(request_id: int) -> Decided:
    decided = decision_of(request_id)
    assert decided is not None
    return decided


def _answer(request: ApprovalRequest, decided: Decided) -> Answer:
    if decided.state == APPROVAL_APPROVED:
        return Answer(True)
    if decided.state == APPROVAL_TIMED_OUT:
        return Answer(False, timeout_text(request))
    return Answer(False, denied_text(request, decided))


def denied_text(request: ApprovalRequest, decided: Decided) -> str:
    who = decided.decided_by or "an administrator"
    reason = decided.reason or "no reason given"
    return f"Error: {who} denied this call (request {request.label}, policy rule {request.rule_id}): {reason}"


def timeout_text(request: ApprovalRequest) -> str:
    seconds = int(settings.APPROVAL_TIMEOUT)
    waited = f"{seconds} second{'s' * (seconds != 1)}" if seconds < 120 or seconds % 60 else f"{seconds // 60} minutes"
    return (
        f"Error: no one answered approval request {request.label} within {waited}, so the call was not run "
        f"(policy rule {request.rule_id})"
    )


def pending_text(request: ApprovalRequest) -> str:
    until = request.expires_at.strftime("%H:%M:%S UTC")
    head = (
        f"Pending: this call waits for an administrator's approval as request {request.label} (policy rule "
        f"{request.rule_id}: {request.rule_reason}). It has not run yet."
    )
    if request.tool in COMMAND_TOOLS:
        follow = (
            f' Once approved it runs as a background command: follow it with terminal_output id "{request.label}" '
            f"(wait_ms waits for the approval too); terminal_list shows it as pending."
        )
    else:
        follow = f" Once approved, call {request.tool} again with the same arguments: that call then runs."
    return f"{head}{follow} If no one approves it by {until}, it is denied."


def _notice(request: ApprovalRequest) -> notify.ApprovalNotice:
    path = f"{reverse('admin:live')}?request={request.pk}"
    return notify.ApprovalNotice(
        label=request.label,
        tool=request.tool,
        summary=summary_of(request.tool, request.arguments),
        cwd=request.cwd,
        username=request.username,
        credential_name=request.credential_name,
        client=request.client_id,
        address=request.client_address,
        rule_id=request.rule_id,
        rule_reason=request.rule_reason,
        card_url=f"{settings.PUBLIC_URL}{path}",
        expires_at=request.expires_at,
    )
