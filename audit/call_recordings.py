"""What the console shows of a call's recording (audit/recordings.py): the player when there is a file, and in words
why there is none, or not all of it. A call that ran its command as a background command has the recording of that
command, kept by the job's `background.ended` event once it is over, and replayed as far as it goes while it runs."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from audit.models import KIND_EVENT, OUTCOME_PENDING, AuditRecord
from audit.recordings import JOB_ENDED, Recording


def described_recording(record: AuditRecord, finished: AuditRecord | None) -> dict[str, Any] | None:
    """What the audit log says of the call's recording (audit/recordings.py): its finished record's, or, for a call
    that started a background command, its `background.ended` event's (while it runs: the file so far, `running`).
    None when the call printed nothing, ran before recordings or has not finished."""
    detail = finished.detail if finished is not None and isinstance(finished.detail, dict) else {}
    described = detail.get("recording")
    if isinstance(described, dict):
        return described
    if not started_a_job(record, finished):
        return None
    ended = AuditRecord.objects.filter(kind=KIND_EVENT, event=JOB_ENDED, call_id=record.call_id).first()
    if ended is not None:
        kept = (ended.detail or {}).get("recording")
        return kept if isinstance(kept, dict) else None
    recording = Recording(record.call_id, record.tool, record.created_at.timestamp())
    return {"name": recording.name, "running": True} if recording.path.is_file() else None


def started_a_job(record: AuditRecord, finished: AuditRecord | None) -> bool:
    """Whether the call ran its command as a background command, whose recording is kept when it ends."""
    arguments = record.arguments if isinstance(record.arguments, dict) else {}
    if record.tool == "terminal_exec_background":
        return True
    pending = finished is not None and finished.outcome == OUTCOME_PENDING  # run once approved
    return record.tool == "terminal_exec" and (arguments.get("background_after") is not None or pending)


def has_recording(record: AuditRecord, finished: AuditRecord | None) -> bool:
    """Whether the call has a recording to replay (a file: all or part of what it printed)."""
    return "name" in (described_recording(record, finished) or {})


def recording_detail(record: AuditRecord, finished: AuditRecord | None) -> dict[str, Any] | None:
    """What the call page shows of the call's recording: a player when there is a file, and in words why there is
    none, or not all of it."""
    described = described_recording(record, finished)
    if described is None:
        return None
    cast_url = reverse("audit:recording_cast", kwargs={"call_id": record.call_id}) if "name" in described else ""
    return {
        "cast_url": cast_url,
        "download_url": f"{cast_url}?download=1" if cast_url else "",
        "unrecorded": str(described.get("unrecorded") or ""),
        # A budget that stopped the recording cut its end, which "not recorded" says; `cut` alone is the per-call cap.
        "cut": bool(described.get("cut")) and not described.get("unrecorded"),
        "running": bool(described.get("running")),
    }
