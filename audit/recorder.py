"""What the rest of Sandstorm calls to write the audit log. Takes plain data; imports nothing from other apps."""

from __future__ import annotations

import functools
import logging
import threading
import uuid
from dataclasses import dataclass, fields
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from audit.append import append_all
from audit.excerpt import excerpt, store_arguments
from audit.inline import InlineAppender
from audit.models import KIND_EVENT, KIND_FINISHED, KIND_STARTED, OUTCOME_DENIED, REDACTED_KEY, AuditRecord
from audit.writer import AuditWriter

logger = logging.getLogger(__name__)


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

# This process's audit writers take turns here before they ask the database for its write lock. SQLite's busy
# handler waits for a lock by sleeping 1, 2, 5, 10, 15... ms between tries, so writers that race for it leave the
# database idle between them; a Python lock hands over at once. (Other processes still wait the SQLite way.)
_WRITE_TURN = threading.Lock()


def _append(record: AuditRecord) -> AuditRecord:
    if connection.in_atomic_block:
        # Inside a transaction that may already hold the database's write lock: waiting for a turn here could
        # deadlock with a writer that holds the turn and waits for that lock.
        append_all([record])
    else:
        with _WRITE_TURN:
            append_all([record])
    return record


def _base(kind: str, actor: Actor | None, instance_id: str) -> AuditRecord:
    values = {name: getattr(actor, name) for name in ACTOR_FIELDS} if actor else {}
    values["user_agent"] = values.get("user_agent", "")[:300]
    return AuditRecord(kind=kind, created_at=timezone.now(), instance_id=instance_id, **values)


def started_record(actor: Actor, tool: str, arguments: dict[str, Any], instance_id: str) -> AuditRecord:
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
    record.detail = detail or None
    return record


def call_started(actor: Actor, tool: str, arguments: dict[str, Any], instance_id: str) -> AuditRecord:
    """Commit the started record; the caller must not run the tool if this raises."""
    return _append(started_record(actor, tool, arguments, instance_id))


def finished_record(
    started: AuditRecord,
    outcome: str,
    *,
    result_text: str = "",
    exit_code: int | None = None,
    reason: str = "",
    duration_ms: int | None = None,
    instance_id: str = "",
) -> AuditRecord:
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
    # The finished record repeats who acted, so it can be read (and filtered) on its own.
    for name in ACTOR_FIELDS:
        setattr(record, name, getattr(started, name))
    return record


def call_finished(started: AuditRecord, outcome: str, **result: Any) -> AuditRecord:
    """Commit the finished record of `started` (keywords as finished_record's)."""
    return _append(finished_record(started, outcome, **result))


def call_denied(actor: Actor, tool: str, arguments: dict[str, Any], reason: str, instance_id: str) -> AuditRecord:
    started = call_started(actor, tool, arguments, instance_id)
    return call_finished(started, OUTCOME_DENIED, result_text=reason, reason=reason, duration_ms=0)


def event_record(event_name: str, actor: Actor | None = None, /, *, instance_id: str = "", **detail: Any) -> AuditRecord:
    record = _base(KIND_EVENT, actor, instance_id)
    record.event = event_name
    record.detail = detail or None
    return record


def event(event_name: str, actor: Actor | None = None, /, *, instance_id: str = "", **detail: Any) -> AuditRecord:
    return _append(event_record(event_name, actor, instance_id=instance_id, **detail))


# Async forms, for the tool path and the server's tasks: the records are built and written by the group-commit
# writer's thread, which takes this process's turn like the synchronous writers above; a lone call's records, on
# SQLite, on the caller's thread when they can be at once (audit.inline).
_INLINE = InlineAppender(_WRITE_TURN) if connection.vendor == "sqlite" else None
WRITER = AuditWriter(append_all, _WRITE_TURN, inline=_INLINE)


async def acall_started(
    actor: Actor, tool: str, arguments: dict[str, Any], instance_id: str, *, lone_call: bool = False
) -> AuditRecord:
    """Commit the started record; the caller must not run the tool if this raises. `lone_call`: see AuditWriter."""
    return await WRITER.append(functools.partial(started_record, actor, tool, arguments, instance_id), lone_call=lone_call)


async def acall_finished(started: AuditRecord, outcome: str, *, lone_call: bool = False, **result: Any) -> AuditRecord:
    return await WRITER.append(functools.partial(finished_record, started, outcome, **result), lone_call=lone_call)


async def acall_denied(actor: Actor, tool: str, arguments: dict[str, Any], reason: str, instance_id: str) -> AuditRecord:
    started = await acall_started(actor, tool, arguments, instance_id)
    return await acall_finished(started, OUTCOME_DENIED, result_text=reason, reason=reason, duration_ms=0)


async def aevent(event_name: str, actor: Actor | None = None, /, *, instance_id: str = "", **detail: Any) -> AuditRecord:
    return await WRITER.append(functools.partial(event_record, event_name, actor, instance_id=instance_id, **detail))
