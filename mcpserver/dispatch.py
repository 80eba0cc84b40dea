"""The one dispatch point every tool call passes through: scope, the command policy, concurrency, approval, the
audit log, the live view, errors, the result cap.

A started record is committed before the tool runs (if that fails, the tool does not run) and a finished record
after it, whatever happened: success, error, timeout, cancellation by the client, a denial, or the answer that it
waits for approval. Where the command policy decided (any policy with rules), the started record names the rule.

A read-only tool changes nothing, so it runs first and both its records are committed together afterwards, before
its result leaves; if they cannot be written, the result is withheld (`run_read`). SANDSTORM_AUDIT_READS_BEFORE
puts reads on the started-record-first path too. An approval asked for is always asked on that path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import anyio.lowlevel
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError
from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult

from audit import recordings
from audit.log import Actor, acall_denied, acall_read, acall_started, afinish_call, started_record
from audit.log.refusals import RefusalLog
from audit.models import (
    OUTCOME_CANCELLED,
    OUTCOME_DENIED,
    OUTCOME_ERROR,
    OUTCOME_INTERRUPTED,
    OUTCOME_OK,
    OUTCOME_PENDING,
    OUTCOME_TIMEOUT,
    AuditRecord,
)
from mcpserver.approvals.asking import hold_for_approval
from mcpserver.approvals.holds import keep_waiting
from mcpserver.approvals.requests import (
    arguments_digest,
    consume_approved,
    covering_grant,
    description_of,
    summary_of,
)
from mcpserver.call import ToolCall, audit_actor, mark_dispatched, principal_from_request, request_session
from mcpserver.confinement_profile import profile_of
from mcpserver.executor import confinement, credential_groups
from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.remote import ExecutorFault, ExecutorLost
from mcpserver.inflight import IN_FLIGHT
from mcpserver.limits import LimitsUnavailable
from mcpserver.live import LIVE, LiveCall
from mcpserver.policy_gate import Decision, command_shape, decide_call, places_for
from mcpserver.process import INSTANCE_ID
from mcpserver.registry import ToolSpec
from mcpserver.results import ToolResult, render
from mcpserver.scopes import scope_refusal
from mcpserver.services import Services
from mcpserver.stop_reasons import TIMEOUT, Stopped
from mcpserver.stopping import CALL_STOPPED, NOT_ACCEPTED, STOPPING_CODE

logger = logging.getLogger(__name__)
# Tools whose output comes whole with their result (git's network tools): recorded as one event at their end.
RESULT_RECORDED = frozenset({"git_clone", "git_push", "git_pull"})
AUDIT_UNAVAILABLE = "Error: the audit log could not be written, so the call was not run; the server log has the details"
READ_UNRECORDED = (
    "Error: the audit log could not be written, so the result of {tool} is withheld; the server log has the details"
)
POLICY_UNAVAILABLE = (
    "Error: the command policy could not be read, so the call was not run; the server log has the details"
)
LIMITS_UNAVAILABLE = (
    "Error: the server cannot count this credential's calls (Redis does not answer), so the call was not run; try again"
)
# The database's refusals, logged one line at a time with a count (a locked or full database refuses every call).
STARTS_REFUSED = RefusalLog("the database refused a started record, so the call did not run")
READS_REFUSED = RefusalLog("the database refused a read's records, so its result was withheld")
DENIALS_REFUSED = RefusalLog("the database refused the records of a denied call")
EXECUTOR_LOST = (
    "Error: the tool executor stopped during this call, so it is not known whether {tool} completed; "
    "a command it had started has been ended. Check the workspace before retrying."
)


async def dispatch(
    spec: ToolSpec, context: Context[Any, Any], arguments: dict[str, Any], services: Services
) -> CallToolResult:
    mark_dispatched()
    principal = principal_from_request(context.request_context.request)
    if principal is None:  # only reachable if the endpoint were mounted without our auth middleware
        return render(ToolResult.error("Error: this request carries no credential"), services.result_cap)
    actor = audit_actor(principal, *request_session(context.request_context))
    confinement.PROFILE.set(profile_of(principal))  # this request's task: what its executor requests carry
    credential_groups.PRINCIPAL.set(principal.key)  # and in its credential's group, which revoking it ends
    if services.stop.stopping:  # reached the tool after the stop began: not run
        await record_denied(actor, spec.name, arguments, NOT_ACCEPTED)
        raise MCPError(code=STOPPING_CODE, message=NOT_ACCEPTED)
    full = await services.audit_budget.refusal()
    if full is not None:
        # Not recorded call by call (a flood would fill the disk again): counted, and recorded once a minute.
        return render(ToolResult.error(full), services.result_cap)
    # An OAuth credential's call its scope refuses is answered 403 before it gets here (mcpserver.step_up), by the
    # same decision; a bearer token's is answered here, as a tool error.
    refusal = scope_refusal(spec, principal, arguments)
    if refusal is not None:
        return await deny(actor, spec, arguments, services, refusal)
    try:
        decision = await decide_call(spec.name, arguments, principal, places_for(services.executor))
    except DatabaseError:
        logger.exception("the command policy could not be read; refusing the call")
        return render(ToolResult.error(POLICY_UNAVAILABLE), services.result_cap)
    if decision.verdict.decision == "deny":
        reason = (
            f"Error: the command policy denies this call (rule {decision.verdict.rule_id}): {decision.verdict.reason}"
        )
        return await deny(actor, spec, arguments, services, reason, decision.audit_detail())
    try:
        slot = await services.concurrency.acquire(principal.key)
    except LimitsUnavailable as error:
        logger.error("refusing a call: %s", error)
        return render(ToolResult.error(LIMITS_UNAVAILABLE), services.result_cap)
    if slot is None:
        limit = services.concurrency.limit
        reason = f"Error: this credential already has {limit} tool calls running (the limit); wait for one to finish"
        return await deny(actor, spec, arguments, services, reason)
    call = ToolCall(spec.name, principal, services.executor, services.result_cap, context)
    # A scope of its own, so the call can be cancelled from outside its request (disconnect, revocation).
    cancel_scope = anyio.CancelScope()
    token = IN_FLIGHT.register(principal.key, actor.session_id, str(context.request_id), cancel_scope, call.stop_note)
    result = ToolResult.error("Error: the call was cancelled (client disconnected, credential revoked or stopped)")
    try:
        if decision.verdict.decision == "ask":  # after the concurrency check: an approval it uses is used up
            decision = await _answered_before(spec.name, arguments, principal.key, decision)
        with cancel_scope:
            result = await run_audited(spec, call, actor, arguments, decision, cancel_scope)
            if result.extra.get("held") is not None:
                keep_waiting(result.extra["held"], arguments, principal, actor, services.executor)
    finally:
        IN_FLIGHT.unregister(token)
        await slot.release()
    if cancel_scope.cancelled_caught and services.stop.stopping:
        # Stopped by the server's stop (mcpserver.stopping): the client gets a JSON-RPC error, not a disconnect.
        raise MCPError(code=STOPPING_CODE, message=CALL_STOPPED)
    return render(result, services.result_cap, keep_structured=spec.output is not None)


async def deny(
    actor: Actor,
    spec: ToolSpec,
    arguments: dict[str, Any],
    services: Services,
    reason: str,
    policy: dict[str, Any] | None = None,
) -> CallToolResult:
    await record_denied(actor, spec.name, arguments, reason, policy)
    return render(ToolResult.error(reason), services.result_cap)


async def _answered_before(tool: str, arguments: dict[str, Any], key: str, decision: Decision) -> Decision:
    """An ask already answered: a timed grant for this credential and command shape, or an approved request for
    exactly this call that was answered "pending" (used once). Else the ask stands."""
    shape = command_shape(tool, arguments, decision.verdict.rule_id)
    grant = await sync_to_async(covering_grant)(key, tool, shape)
    if grant is not None:
        return decision.answered("grant", f"R-{grant.request_id}", grant.granted_by)
    approved = await sync_to_async(consume_approved)(key, tool, arguments_digest(arguments))
    if approved is not None:
        return decision.answered("request", approved.label, approved.decided_by)
    return decision


def call_parts(params: object) -> tuple[str, dict[str, Any]]:
    """The tool name and arguments of a tools/call's params, as far as they are what they should be."""
    if not isinstance(params, Mapping):
        return "", {}
    arguments = params.get("arguments")
    return str(params.get("name", "")), arguments if isinstance(arguments, dict) else {}


async def record_denied(
    actor: Actor, tool: str, arguments: dict[str, Any], reason: str, policy: dict[str, Any] | None = None
) -> None:
    """Record a tools/call refused before it ran (scope, policy, concurrency, rate limit, or by the SDK: unknown
    tool, bad arguments). A database failure is logged, not raised: the refusal is answered all the same."""
    try:
        await acall_denied(actor, tool[:64], arguments, reason, INSTANCE_ID, policy)
    except DatabaseError as error:
        DENIALS_REFUSED.note(error)


async def run_audited(
    spec: ToolSpec,
    call: ToolCall,
    actor: Actor,
    arguments: dict[str, Any],
    decision: Decision | None = None,
    cancel_scope: anyio.CancelScope | None = None,
) -> ToolResult:
    policy = decision.audit_detail() if decision is not None and decision.recorded else None
    asks = decision is not None and decision.asks
    if spec.read_only and not asks and not settings.AUDIT_READS_BEFORE:
        return await run_read(spec, call, actor, arguments, policy, cancel_scope)
    try:
        # Shielded: the writer completes a started record even for a caller cancelled meanwhile, so wait for it; the
        # checkpoint below then ends such a call as cancelled, with its finished record, before the tool runs.
        with anyio.CancelScope(shield=True):
            started = await acall_started(actor, spec.name, arguments, INSTANCE_ID, policy)
    except DatabaseError as error:
        STARTS_REFUSED.note(error)
        return ToolResult.error(AUDIT_UNAVAILABLE)
    call.call_id = started.call_id
    began = time.monotonic()

    async def run() -> tuple[str, ToolResult]:
        await anyio.lowlevel.checkpoint_if_cancelled()  # cancelled while its started record was written: never run
        if decision is not None and decision.asks:
            answer = await hold_for_approval(call, actor, arguments, decision, started)
            if not answer.approved:
                held = answer.pending is not None
                result = ToolResult(answer.text, is_error=True, extra={"held": answer.pending} if held else {})
                return (OUTCOME_PENDING if held else OUTCOME_DENIED), result
        result = await _run(spec, call, arguments)
        return outcome_of(result), result

    async def finish(outcome: str, result: ToolResult, ending: dict[str, Any]) -> bool:
        await _finish(started, outcome, result, began, ending)
        return True  # a finished record the database refuses is held, never lost

    result, _ = await _live_and_recorded(started, call, cancel_scope, run, finish)
    return result


async def run_read(
    spec: ToolSpec,
    call: ToolCall,
    actor: Actor,
    arguments: dict[str, Any],
    policy: dict[str, Any] | None,
    cancel_scope: anyio.CancelScope | None,
) -> ToolResult:
    """A read-only tool, run before anything is written: its started record is built now (its time is the call's
    start) and committed with the finished record after the read. Its result leaves only once both are committed."""
    started = started_record(actor, spec.name, arguments, INSTANCE_ID, policy)
    call.call_id = started.call_id
    began = time.monotonic()

    async def run() -> tuple[str, ToolResult]:
        result = await _run(spec, call, arguments)
        return outcome_of(result), result

    async def record(outcome: str, result: ToolResult, ending: dict[str, Any]) -> bool:
        return await _record_read(started, outcome, result, began, ending)

    result, recorded = await _live_and_recorded(started, call, cancel_scope, run, record)
    return result if recorded else ToolResult.error(READ_UNRECORDED.format(tool=spec.name))


async def _live_and_recorded(
    started: AuditRecord,
    call: ToolCall,
    cancel_scope: anyio.CancelScope | None,
    run: Callable[[], Awaitable[tuple[str, ToolResult]]],
    record: Callable[[str, ToolResult, dict[str, Any]], Awaitable[bool]],
) -> tuple[ToolResult, bool]:
    """`run` as a call the live view shows, its end recorded by `record` with its recording: the result, and whether
    it was recorded."""
    LIVE.started(_live_call(started, call, cancel_scope))
    if recordings.enabled():
        call.recording = recordings.Recording(started.call_id, started.tool, started.created_at.timestamp())
    began = time.monotonic()
    outcome = OUTCOME_CANCELLED
    try:
        outcome, result = await run()
        if started.tool in RESULT_RECORDED and not call.printed:
            # Not streamed: what it printed is its result, recorded (and shown live) as it ends.
            await call.output([(round(time.monotonic() - began, 3), "o", result.text)], progress=False)
    except BaseException:
        # Cancelled by the client, a disconnect or shut-down: record it even inside the cancelled scope.
        with anyio.CancelScope(shield=True):
            stopped = call.stop_note.why()
            ending = {"recording": call.end_recording(), "reason": stopped.sentence(), "stopped": stopped.as_detail()}
            await record(OUTCOME_CANCELLED, ToolResult.error("cancelled"), ending)
        raise
    finally:
        LIVE.ended(started.call_id, outcome)
    # Shielded: a call with its result is not cancelled while that is recorded; it answers with it.
    ending = {"recording": call.end_recording()}
    if outcome == OUTCOME_TIMEOUT:
        timed_out = Stopped(TIMEOUT, detail=str(result.extra.get("timeout") or ""))
        ending |= {"reason": timed_out.sentence(), "stopped": timed_out.as_detail()}
    with anyio.CancelScope(shield=True):
        recorded = await record(outcome, result, ending)
    return result, recorded


async def _record_read(
    started: AuditRecord, outcome: str, result: ToolResult, began: float, ending: dict[str, Any]
) -> bool:
    """`ending`: the finished record's fields about how the call ended (its recording; why it was stopped)."""
    duration_ms = _log_call(started, outcome, began)
    try:
        await acall_read(
            started,
            outcome,
            result_text=result.text,
            exit_code=result.exit_code,
            duration_ms=duration_ms,
            instance_id=INSTANCE_ID,
            **ending,
        )
    except DatabaseError as error:
        READS_REFUSED.note(error)
        return False
    return True


def _live_call(started: AuditRecord, call: ToolCall, scope: anyio.CancelScope | None) -> LiveCall:
    principal = call.principal
    return LiveCall(
        call_id=started.call_id,
        tool=started.tool,
        summary=summary_of(started.tool, started.arguments),  # the audit log's copy: secrets masked
        description=description_of(started.arguments),
        username=principal.username,
        credential_name=principal.credential_name,
        credential_key=principal.key,
        address=principal.client_address,
        scope=scope,
        note=call.stop_note,
    )


def outcome_of(result: ToolResult) -> str:
    if not result.is_error:
        return OUTCOME_OK
    if result.extra.get("interrupted"):
        return OUTCOME_INTERRUPTED
    return OUTCOME_TIMEOUT if result.extra.get("timed_out") else OUTCOME_ERROR


def _log_call(started: AuditRecord, outcome: str, began: float) -> int:
    """One log line per call: who, what and how it ended, never its arguments or result (they may hold secrets).
    Returns the call's duration in milliseconds."""
    duration_ms = int((time.monotonic() - began) * 1000)
    credential = f"{started.credential_kind}:{started.credential_id} {started.credential_name}".strip()
    fields = {"call_id": started.call_id, "tool": started.tool, "user": started.username, "credential": credential}
    logger.info(
        "tool call %s %s", started.tool, outcome, extra={**fields, "outcome": outcome, "duration_ms": duration_ms}
    )
    return duration_ms


async def _finish(started: AuditRecord, outcome: str, result: ToolResult, began: float, ending: dict[str, Any]) -> None:
    duration_ms = _log_call(started, outcome, began)
    # The call has run: a finished record the database refuses is held and written again (audit.log.held).
    await afinish_call(
        started,
        outcome,
        result_text=result.text,
        exit_code=result.exit_code,
        duration_ms=duration_ms,
        instance_id=INSTANCE_ID,
        **ending,
    )


async def _run(spec: ToolSpec, call: ToolCall, arguments: dict[str, Any]) -> ToolResult:
    try:
        return await spec.fn(call, **arguments)
    except ToolFailure as failure:
        return ToolResult.error(str(failure))
    except ExecutorLost as lost:
        logger.error("the executor was lost during %s: %s", spec.name, lost)
        return ToolResult(text=EXECUTOR_LOST.format(tool=spec.name), is_error=True, extra={"interrupted": True})
    except ExecutorFault as fault:
        logger.error("the executor failed during %s: %s", spec.name, fault)
        return ToolResult.error(f"Error: {spec.name} failed in the tool executor; the server log has the details")
    except Exception:
        # The tool boundary: an unexpected failure becomes an error result; details go to the server log only.
        logger.exception("tool %s failed unexpectedly", spec.name)
        return ToolResult.error(f"Error: {spec.name} failed unexpectedly; the server log has the details")
