"""The sentences of what admins stop from the console, of the command policy and of approvals."""

from __future__ import annotations

from django.utils.html import format_html
from django.utils.safestring import SafeString

from audit.event_sentences.words import Detail, Sentence, count, counted, from_address, listing, strings, text, who
from audit.models import AuditRecord


def console_background_stopped(record: AuditRecord, detail: Detail) -> SafeString:
    commands = strings(detail, "commands") or [f"pid {pid}" for pid in strings(detail, "pids")]
    users = strings(detail, "users")
    return format_html(
        "{} stopped {} from the console{}{}{}",
        who(record),
        counted(len(strings(detail, "pids")) or len(commands), "background command"),
        from_address(record),
        format_html(" (started by {})", listing(users)) if users else "",
        format_html(": {}", listing(commands)) if commands else "",
    )


def console_call_stopped(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "{} stopped a running {} call of {} from the console{}: {}",
        who(record),
        text(detail, "tool"),
        text(detail, "user"),
        from_address(record),
        text(detail, "summary"),
    )


POLICY_ACTIONS = {
    "added": "added policy rule",
    "edited": "edited policy rule",
    "deleted": "deleted policy rule",
    "moved_up": "moved up policy rule",
    "moved_down": "moved down policy rule",
    "enabled": "enabled policy rule",
    "disabled": "disabled policy rule",
    "settings": "changed the policy's default and opaque decisions",
    "recommended_on": "switched on the recommended policy rules",
    "recommended_off": "switched off the recommended policy rules",
}


def policy_changed(record: AuditRecord, detail: Detail) -> SafeString:
    action = text(detail, "action")
    rules = strings(detail, "rule_ids") or ([text(detail, "rule_id")] if detail.get("rule_id") else [])
    named = format_html(" {}", listing(rules)) if rules and action not in ("settings",) else ""
    return format_html(
        "{} {}{}{} (policy version {})",
        who(record),
        POLICY_ACTIONS.get(action, f"changed the policy ({action})"),
        named,
        from_address(record),
        text(detail, "version"),
    )


def policy_loaded(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "{} loaded a command policy of {} from {} (policy version {}, sha256 {}…)",
        who(record),
        counted(len(strings(detail, "rule_ids")), "rule"),
        text(detail, "source") or "a file",
        text(detail, "version"),
        text(detail, "sha256")[:12],
    )


def approval_decided(record: AuditRecord, detail: Detail) -> SafeString:
    decision = text(detail, "decision")
    waited = f"{count(detail, 'latency_ms') / 1000:.1f}"
    if decision == "timed_out":
        return format_html("request {} got no answer in {} s: denied", text(detail, "request"), waited)
    if decision == "cancelled":
        return format_html("request {} ended unanswered after {} s (its call ended)", text(detail, "request"), waited)
    verb = {"approved": "approved", "denied": "denied"}.get(decision, decision.replace("_", " "))
    minutes = detail.get("grant_minutes")
    grant = format_html(" and the same command shape for {} minutes", minutes) if minutes else ""
    reason = format_html(": {}", text(detail, "reason")) if decision == "denied" and detail.get("reason") else ""
    return format_html(
        "{} {} request {}{} through the {} after {} s{}",
        who(record),
        verb,
        text(detail, "request"),
        grant,
        text(detail, "channel"),
        waited,
        reason,
    )


def approval_grants_revoked(record: AuditRecord, detail: Detail) -> SafeString:
    requests = strings(detail, "requests")
    return format_html(
        "{} revoked {} ({}){}",
        who(record),
        counted(len(requests), "timed approval grant"),
        listing(strings(detail, "shapes")),
        from_address(record),
    )


def approval_run_in_background(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "approved request {} of {} started as background command {}: {}",
        text(detail, "request"),
        who(record, subject=False),
        text(detail, "pid"),
        text(detail, "command"),
    )


def approval_run_failed(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "approved request {} of {} did not start: {}",
        text(detail, "request"),
        who(record, subject=False),
        text(detail, "error"),
    )


def console_session_disconnected(record: AuditRecord, detail: Detail) -> SafeString:
    address = text(detail, "session_address")
    return format_html(
        "{} disconnected the MCP session of {} (acting as {}{}) in the console{}{}",
        who(record),
        text(detail, "credential_name") or text(detail, "credential"),
        text(detail, "owner"),
        format_html(", opened from {}", address) if address else "",
        from_address(record),
        "; its running call was cancelled" if detail.get("busy") else "",
    )


def background_ended(record: AuditRecord, detail: Detail) -> SafeString:
    """A background command is over; its recording (if any) is kept, its SHA-256 in this record."""
    state, code = text(detail, "state"), detail.get("exit_code")
    ended = {"exited": f"ended with exit code {code}", "killed": f"was killed (exit code {code})"}.get(
        state, "was lost (its end was not recorded)"
    )
    kept_detail = detail.get("recording")
    recording: Detail = kept_detail if isinstance(kept_detail, dict) else {}
    if "name" in recording:
        kept = format_html("; its recording is kept ({})", counted(count(recording, "events"), "event"))
    else:
        kept = format_html("; not recorded: {}", text(recording, "unrecorded") or "it printed nothing")
    return format_html(
        "background command {} ({}) {}{}: {}",
        text(detail, "pid"),
        text(detail, "credential"),
        ended,
        kept,
        text(detail, "command"),
    )


SENTENCES: dict[str, Sentence] = {
    "background.ended": background_ended,
    "console.background_stopped": console_background_stopped,
    "console.call_stopped": console_call_stopped,
    "console.session_disconnected": console_session_disconnected,
    "policy.changed": policy_changed,
    "policy.loaded": policy_loaded,
    "approval.decided": approval_decided,
    "approval.run_in_background": approval_run_in_background,
    "approval.run_failed": approval_run_failed,
    "approval.grants_revoked": approval_grants_revoked,
}
