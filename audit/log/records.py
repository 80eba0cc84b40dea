"""Who acted (Actor) and the records the audit log is made of, built from plain data; nothing here writes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, fields
from typing import Any

from django.conf import settings
from django.utils import timezone

from audit.excerpt import excerpt, store_arguments
from audit.models import KIND_EVENT, KIND_FINISHED, KIND_STARTED, REDACTED_KEY, AuditRecord


@dataclass(frozen=True)
class Actor:
    """Who acted: the principal of an MCP request, an admin in the browser, or a command on the shell."""

    user_id: int | None = None
    username: str = ""
    credential_kind: str = ""
    credential_id: str = ""
    credential_name: str = ""
    scope: str = ""
    client_address: str = ""
    user_agent: str = ""
    session_id: str = ""
    protocol_version: str = ""


def request_actor(request: Any) -> Actor:
    """An admin acting in the browser (a Django HttpRequest with an authenticated user)."""
    user = request.user
    return Actor(
        user_id=user.pk,
        username=user.get_username(),
        credential_kind="session",
        client_address=request.META.get("REMOTE_ADDR", "") or "",
        user_agent=request.META.get("HTTP_USER_AGENT", "")[:300],
    )


ACTOR_FIELDS = tuple(field.name for field in fields(Actor))


def _base(kind: str, actor: Actor | None, instance_id: str) -> AuditRecord:
    values = {name: getattr(actor, name) for name in ACTOR_FIELDS} if actor else {}
    values["user_agent"] = values.get("user_agent", "")[:300]
    return AuditRecord(kind=kind, created_at=timezone.now(), instance_id=instance_id, **values)


def started_record(
    actor: Actor, tool: str, arguments: dict[str, Any], instance_id: str, policy: dict[str, Any] | None = None
) -> AuditRecord:
    """`policy`: what the command policy decided and which rule (in `detail`, so the mac covers it)."""
    stored = store_arguments(arguments, settings.AUDIT_EXCERPT_BYTES)
    record = _base(KIND_STARTED, actor, instance_id)
    record.call_id = uuid.uuid4().hex
    record.tool = tool
    record.arguments = stored.arguments
    record.arguments_size = stored.size
    record.arguments_sha256 = stored.sha256
    detail: dict[str, Any] = {}
    if stored.large:
        detail["large_arguments"] = stored.large
    if stored.redacted:
        # Part of `detail`, so the mac covers it: a reviewer can trust that nothing else was masked.
        detail[REDACTED_KEY] = stored.redacted
    if policy:
        detail["policy"] = policy
    record.detail = detail or None
    return record


def finished_record(
    started: AuditRecord,
    outcome: str,
    *,
    result_text: str = "",
    exit_code: int | None = None,
    reason: str = "",
    duration_ms: int | None = None,
    instance_id: str = "",
    recording: dict[str, Any] | None = None,
    stopped: dict[str, Any] | None = None,
) -> AuditRecord:
    """`recording`: what audit/recordings.py says of the call's recording (its SHA-256 among it), if it has one;
    `stopped`: who stopped a cancelled call and how."""
    result = excerpt(result_text, settings.AUDIT_EXCERPT_BYTES)
    record = AuditRecord(
        kind=KIND_FINISHED,
        created_at=timezone.now(),
        instance_id=instance_id or started.instance_id,
        call_id=started.call_id,
        started_id=started.id,
        tool=started.tool,
        outcome=outcome,
        reason=reason,
        exit_code=exit_code,
        duration_ms=duration_ms,
        result_excerpt=result.text,
        result_size=result.size,
        result_sha256=result.sha256,
        detail={REDACTED_KEY: ["result"]} if result.masked else None,
    )
    if recording is not None:
        record.detail = {**(record.detail or {}), "recording": recording}
    if stopped is not None:  # a cancelled call: by whom and through which channel (mcpserver/stop_reasons.py)
        record.detail = {**(record.detail or {}), "stopped": stopped}
    # The finished record repeats who acted, so it can be read (and filtered) on its own.
    for name in ACTOR_FIELDS:
        setattr(record, name, getattr(started, name))
    return record


def event_record(
    event_name: str, actor: Actor | None = None, /, *, instance_id: str = "", **detail: Any
) -> AuditRecord:
    record = _base(KIND_EVENT, actor, instance_id)
    record.event = event_name
    record.detail = detail or None
    return record
