"""What the rest of Sandstorm calls to write the audit log: each function builds a record and hands it to this
process's writer (audit.log.writer), which commits it before the function returns."""

from __future__ import annotations

import functools
from typing import Any

from django.db import DatabaseError

from audit.log.held import held
from audit.log.records import Actor, event_record, finished_record, started_record
from audit.log.writer import current
from audit.models import OUTCOME_DENIED, AuditRecord


def call_started(
    actor: Actor, tool: str, arguments: dict[str, Any], instance_id: str, policy: dict[str, Any] | None = None
) -> AuditRecord:
    """Commit the started record; the caller must not run the tool if this raises."""
    return current().write(started_record(actor, tool, arguments, instance_id, policy))


def call_finished(started: AuditRecord, outcome: str, **result: Any) -> AuditRecord:
    """Commit the finished record of `started` (keywords as finished_record's)."""
    return current().write(finished_record(started, outcome, **result))


def call_denied(
    actor: Actor,
    tool: str,
    arguments: dict[str, Any],
    reason: str,
    instance_id: str,
    policy: dict[str, Any] | None = None,
) -> AuditRecord:
    started = call_started(actor, tool, arguments, instance_id, policy)
    return call_finished(started, OUTCOME_DENIED, result_text=reason, reason=reason, duration_ms=0)


def event(event_name: str, actor: Actor | None = None, /, *, instance_id: str = "", **detail: Any) -> AuditRecord:
    return current().write(event_record(event_name, actor, instance_id=instance_id, **detail))


# The async forms, for the tool path and the server's tasks: the writer builds and commits the record without
# making the event loop wait for a lock.


async def acall_started(
    actor: Actor, tool: str, arguments: dict[str, Any], instance_id: str, policy: dict[str, Any] | None = None
) -> AuditRecord:
    """Commit the started record; the caller must not run the tool if this raises."""
    build = functools.partial(started_record, actor, tool, arguments, instance_id, policy)
    return await current().awrite(build, opens_call=True)


async def acall_finished(started: AuditRecord, outcome: str, **result: Any) -> AuditRecord:
    return await current().awrite(functools.partial(finished_record, started, outcome, **result), closes_call=True)


async def afinish_call(started: AuditRecord, outcome: str, **result: Any) -> AuditRecord:
    """Commit the finished record of `started`, a call that ran; if the database refuses it, the record is held and
    written again until it takes it (audit.log.held). Never raises DatabaseError: the call has had its effect."""
    built: list[AuditRecord] = []

    def build() -> AuditRecord:
        built.append(finished_record(started, outcome, **result))
        return built[0]

    try:
        return await current().awrite(build, closes_call=True)
    except DatabaseError as error:
        if not built:
            raise  # never: building a record does not touch the database
        held().hold(built[0], error)
        return built[0]


async def acall_read(started: AuditRecord, outcome: str, **result: Any) -> AuditRecord:
    """Commit a read's started record (built, not yet written) and its finished record together, in one transaction;
    the finished record is returned. The caller must not hand the read's result on if this raises."""

    def build() -> list[AuditRecord]:
        return [started, finished_record(started, outcome, **result)]

    records = await current().awrite_together(build)
    return records[-1]


async def acall_denied(
    actor: Actor,
    tool: str,
    arguments: dict[str, Any],
    reason: str,
    instance_id: str,
    policy: dict[str, Any] | None = None,
) -> AuditRecord:
    started = await acall_started(actor, tool, arguments, instance_id, policy)
    return await afinish_call(started, OUTCOME_DENIED, result_text=reason, reason=reason, duration_ms=0)


async def aevent(
    event_name: str, actor: Actor | None = None, /, *, instance_id: str = "", **detail: Any
) -> AuditRecord:
    return await current().awrite(functools.partial(event_record, event_name, actor, instance_id=instance_id, **detail))
