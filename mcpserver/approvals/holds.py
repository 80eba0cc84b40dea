"""The wait that goes on after a call was answered "pending" (asking.py): until the request is decided or times
out. An approved command then runs as a background command of the credential that asked, which the agent follows
with terminal_output by the request's label; any other approved call runs when the agent calls again with the same
arguments (requests.consume_approved).

The exact arguments are held in memory by the waiting task, never read back from the audit log's copy (which may
be masked or cut). A server that stops ends its waits: the requests are cancelled, then and at the next start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.utils import timezone

from audit.log import Actor, aevent
from mcpserver.approvals.requests import CHANNEL_ENDED, CHANNEL_TIMEOUT, end_request
from mcpserver.approvals.waiting import announce, record_decision, wait_for_decision
from mcpserver.background import record_cap, record_started_process
from mcpserver.confinement_profile import profile_of
from mcpserver.executor import confinement, credential_groups
from mcpserver.executor.interface import Executor, ExecutorError
from mcpserver.live import LIVE
from mcpserver.models import (
    APPROVAL_APPROVED,
    APPROVAL_CANCELLED,
    APPROVAL_TIMED_OUT,
    ApprovalRequest,
    BackgroundProcess,
)
from mcpserver.policy.rules import COMMAND_TOOLS
from mcpserver.process import INSTANCE_ID
from oauth.credentials import Principal
from oauth.models import Revocation

logger = logging.getLogger(__name__)
_WAITING: dict[int, asyncio.Task[None]] = {}


def keep_waiting(
    request: ApprovalRequest, arguments: dict[str, Any], principal: Principal, actor: Actor, executor: Executor
) -> None:
    task = asyncio.get_running_loop().create_task(_wait_then_run(request, arguments, principal, actor, executor))
    _WAITING[request.pk] = task
    task.add_done_callback(lambda _: _WAITING.pop(request.pk, None))


async def stop_waiting() -> None:
    """At shut-down: end every held wait (their requests are cancelled: nobody would be left to run them)."""
    tasks = list(_WAITING.values())
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _wait_then_run(
    request: ApprovalRequest, arguments: dict[str, Any], principal: Principal, actor: Actor, executor: Executor
) -> None:
    confinement.PROFILE.set(profile_of(principal))  # the command runs, if approved, in its credential's sandbox
    credential_groups.PRINCIPAL.set(principal.key)  # and in its credential's group, which revoking it ends
    left = (request.expires_at - timezone.now()).total_seconds()
    try:
        decided = await wait_for_decision(request.pk, time.monotonic() + left)
    except asyncio.CancelledError:
        ended = await sync_to_async(end_request)(request.pk, APPROVAL_CANCELLED, CHANNEL_ENDED)
        if ended is not None:
            await record_decision(ended, None)
        raise
    if decided is None:
        ended = await sync_to_async(end_request)(request.pk, APPROVAL_TIMED_OUT, CHANNEL_TIMEOUT)
        if ended is not None:
            await record_decision(ended, None)
        return
    if decided.state != APPROVAL_APPROVED or request.tool not in COMMAND_TOOLS:
        return
    await _run_in_background(request, arguments, principal, actor, executor)


async def _run_in_background(
    request: ApprovalRequest, arguments: dict[str, Any], principal: Principal, actor: Actor, executor: Executor
) -> None:
    command = str(arguments.get("command", ""))
    cwd = arguments.get("cwd") if isinstance(arguments.get("cwd"), str) else None
    if await _revoked_since(principal.key, request):
        await ApprovalRequest.objects.filter(pk=request.pk).aupdate(outcome="not started: its credential was revoked")
        await announce(request.pk)
        return
    mode = "pty" if arguments.get("pty") else "stdin" if arguments.get("stdin") else "none"
    try:
        started = await executor.start_background(command, cwd, mode, record_cap())
    except ExecutorError as error:
        outcome = f"not started: {error}"
        await ApprovalRequest.objects.filter(pk=request.pk).aupdate(outcome=outcome[:2000])
        await aevent("approval.run_failed", actor, instance_id=INSTANCE_ID, request=request.label, error=str(error))
        await announce(request.pk)
        return
    await record_started_process(principal, started, command, cwd or "", request.call_id)
    row = await BackgroundProcess.objects.filter(pid=started.pid, start_ticks=started.start_ticks).afirst()
    await ApprovalRequest.objects.filter(pk=request.pk).aupdate(
        background=row, outcome=f"running as background command {started.pid}"
    )
    await aevent(
        "approval.run_in_background",
        actor,
        instance_id=INSTANCE_ID,
        request=request.label,
        call_id=request.call_id,
        pid=started.pid,
        command=command[:2000],
    )
    await announce(request.pk)
    LIVE.background_changed()


async def _revoked_since(key: str, request: ApprovalRequest) -> bool:
    """Whether the credential that asked was revoked after it asked: an approval then starts nothing."""
    revocations = Revocation.objects.filter(created_at__gte=request.created_at)
    return any([revocation.covers(key) async for revocation in revocations])
