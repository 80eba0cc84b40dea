"""A call's recording, for staff who may view the audit log: as asciicast v2 (the console's player loads it, and it
downloads as a `.cast` file), and as the text the Live view shows (a page opened later picks a call up with it)."""

from __future__ import annotations

from pathlib import Path

from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.urls import reverse

from audit.models import KIND_FINISHED, KIND_STARTED, AuditRecord
from audit.recording_cast import cast_lines
from audit.recordings import CALL_ID, Recording, live_text, path_of, read
from audit.views import require_view_permission


def _started(call_id: str) -> AuditRecord:
    if not CALL_ID.fullmatch(call_id):
        raise Http404("no such call")
    started = AuditRecord.objects.filter(kind=KIND_STARTED, call_id=call_id).first()
    if started is None:
        raise Http404("no such call")
    return started


def _recording(call_id: str) -> tuple[AuditRecord, Path]:
    started = _started(call_id)
    finished = AuditRecord.objects.filter(kind=KIND_FINISHED, call_id=call_id).first()
    described = (finished.detail or {}).get("recording") if finished is not None else None
    if isinstance(described, dict) and "name" in described:
        path = path_of(str(described["name"]))
    else:  # still running (or ended without a record yet): the file as far as it is written
        path = Recording(call_id, started.tool, started.created_at.timestamp()).path
    if not path.is_file():
        raise Http404("this call has no recording")
    return started, path


def call_page(request: HttpRequest, call_id: str) -> HttpResponseRedirect:
    """The page of the call with this id, at its recording (the Live view knows calls by id, not by record)."""
    require_view_permission(request)
    started = _started(call_id)
    return HttpResponseRedirect(reverse("admin:audit_auditrecord_change", args=[started.pk]) + "#recording")


def recording_events(request: HttpRequest, call_id: str) -> JsonResponse:
    """The output so far as the Live view shows it (`mcpserver.call.live_text`), and its length in UTF-16 units."""
    require_view_permission(request)
    _started_record, path = _recording(call_id)
    _header, events = read(path)
    text = live_text(events)
    response = JsonResponse({"text": text, "units": len(text.encode("utf-16-le")) // 2})
    response["Cache-Control"] = "no-store"
    return response


def recording_cast(request: HttpRequest, call_id: str) -> HttpResponse:
    require_view_permission(request)
    started, path = _recording(call_id)
    header, events = read(path)
    summary = str((started.arguments or {}).get("command", ""))[:200]
    title = f"{started.tool} by {started.username}: {summary}" if summary else f"{started.tool} by {started.username}"
    response = HttpResponse("".join(cast_lines(header, events, title)), content_type="application/x-asciicast")
    if request.GET.get("download"):
        response["Content-Disposition"] = f'attachment; filename="sandstorm-{call_id}.cast"'
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = "no-store"
    return response
