"""Waiting for a decision, and telling the waiting call (and the console's pages) that one was taken.

The decision itself is in the database (requests.py). A decision is announced on the channel layer, in a group
per request, so that the call waiting for it wakes at once, in whichever process holds it; the waiting call also
reads the request again every POLL_SECONDS, so a decision taken where no layer reaches (a management command, a
lost message) still arrives.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from asgiref.sync import sync_to_async
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer

from audit.log import Actor, aevent
from mcpserver.approvals.requests import Decided, decide, decision_of, describe
from mcpserver.live import LIVE
from mcpserver.models import ApprovalRequest
from mcpserver.process import INSTANCE_ID

POLL_SECONDS = 2.0


def group_of(request_id: int) -> str:
    return f"sandstorm.approval.{request_id}"


async def wait_for_decision(
    request_id: int, deadline: float, tick: Callable[[], Awaitable[None]] | None = None
) -> Decided | None:
    """The decision on the request, or None if `deadline` (time.monotonic()) passes first. `tick` runs at least
    every POLL_SECONDS while it waits (progress notifications)."""
    layer = get_channel_layer()
    channel = await layer.new_channel() if layer is not None else ""
    if layer is not None:
        await layer.group_add(group_of(request_id), channel)
    try:
        while True:
            decided = await sync_to_async(decision_of)(request_id)
            if decided is not None:
                return decided
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if tick is not None:
                await tick()
            await _message_or_timeout(layer, channel, min(left, POLL_SECONDS))
    finally:
        if layer is not None:
            await layer.group_discard(group_of(request_id), channel)


async def _message_or_timeout(layer: object, channel: str, seconds: float) -> None:
    if layer is None:
        await asyncio.sleep(seconds)
        return
    try:
        await asyncio.wait_for(layer.receive(channel), seconds)  # type: ignore[attr-defined]  # BaseChannelLayer
    except TimeoutError:
        pass


async def announce(request_id: int) -> None:
    """Wake the call waiting on this request and update the console's pages."""
    request = await ApprovalRequest.objects.aget(pk=request_id)
    LIVE.approval(describe(request))
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(group_of(request_id), {"type": "approval.decided", "id": request_id})
    except (ChannelFull, OSError):
        pass  # the waiting call reads the request again within POLL_SECONDS


async def decide_and_announce(
    request_id: int,
    approve: bool,
    actor: Actor,
    channel: str,
    reason: str = "",
    grant_minutes: int | None = None,
    credential_key: str | None = None,
) -> Decided:
    """Decide a request (DecisionRefused if someone else did first), record who decided, and announce it."""
    decided = await sync_to_async(decide)(
        request_id, approve, actor.username, channel, reason, grant_minutes, credential_key
    )
    await record_decision(decided, actor, grant_minutes)
    return decided


async def record_decision(decided: Decided, actor: Actor | None, grant_minutes: int | None = None) -> None:
    """The audit event of a decision (a person's, or the timeout's, or the call's end: no actor), and its
    announcement."""
    await aevent(
        "approval.decided",
        actor,
        instance_id=INSTANCE_ID,
        request=f"R-{decided.request_id}",
        call_id=decided.call_id,
        decision=decided.state,
        channel=decided.channel,
        latency_ms=decided.latency_ms,
        reason=decided.reason,
        grant_minutes=grant_minutes,
    )
    await announce(decided.request_id)
