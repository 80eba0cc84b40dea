"""The console's Live page (/admin/live/): running calls with their output, background commands and pending
approvals. The page is a frame that its socket fills and keeps current (mcpserver/console_socket.py and
mcpserver/static/mcpserver/console_live.js); what the server renders here is only the request a notification linked
to (`?request=17`), so a decision taken meanwhile is said rather than a card that never appears."""

from __future__ import annotations

from typing import Any

from django.contrib.admin import AdminSite
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone

from mcpserver.models import APPROVAL_PENDING, ApprovalRequest

MAX_ID_DIGITS = 18  # below 2**63


def focused_request(request: HttpRequest) -> dict[str, Any] | None:
    """The approval request `?request=` names: its id, and, once it no longer waits, what became of it."""
    raw = request.GET.get("request", "")
    if not raw.isdigit() or len(raw) > MAX_ID_DIGITS:
        return None
    found = ApprovalRequest.objects.filter(pk=int(raw)).first()
    if found is None:
        return {"id": int(raw), "label": f"R-{int(raw)}", "missing": True}
    waiting = found.state == APPROVAL_PENDING and found.expires_at > timezone.now()
    return {
        "id": found.pk,
        "label": found.label,
        "waiting": waiting,
        "state": "expired" if found.state == APPROVAL_PENDING and not waiting else found.state.replace("_", " "),
        "decided_by": found.decided_by,
        "decided_at": found.decided_at,
        "channel": found.channel,
        "reason": found.reason,
    }


def live(request: HttpRequest, site: AdminSite) -> TemplateResponse:
    context = {**site.each_context(request), "title": "Live", "focus": focused_request(request)}
    return TemplateResponse(request, "admin/live.html", context)
