"""Security events as sentences: "admin revoked token laptop (sst_abcd…) from 10.0.0.5", not a line of JSON.

One builder per event name the code writes (SENTENCES; a test finds every `event("…")` in the source and checks it
has one); an event without one reads "name: key=value, …". Names, addresses, user agents and reasons come from
agents, clients and people typing into a login form: every piece goes through format_html, so all of it is escaped
and nothing is ever marked safe that was not built here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from audit.budget import human
from audit.models import AuditRecord

VALUE_CHARS = 80
LISTED = 3  # commands, reasons, ... named before "and N more"

Detail = dict[str, Any]
Sentence = Callable[[AuditRecord, Detail], SafeString]


def _text(detail: Detail, key: str) -> str:
    value = detail.get(key)
    if value is None:
        return ""
    return Truncator(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)).chars(VALUE_CHARS)


def _count(detail: Detail, key: str) -> int:
    value = detail.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def counted(number: int, singular: str, plural: str | None = None) -> str:
    return f"{number} {singular if number == 1 else plural or singular + 's'}"


def listing(items: list[str]) -> str:
    shown = [Truncator(item).chars(VALUE_CHARS) for item in items[:LISTED]]
    more = len(items) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _strings(detail: Detail, key: str) -> list[str]:
    value = detail.get(key)
    return [str(item) for item in value] if isinstance(value, list) else []


def who(record: AuditRecord, *, subject: bool = True) -> SafeString:
    """Who acted: an admin by name, the OS user of a command line as such, or "someone" if the record does not say.
    As the `subject` of a sentence, the command line's note is set off by commas on both sides."""
    name = record.username
    if record.credential_kind == "shell":
        return format_html("OS user {}, on the command line{}", name or "(unknown)", "," if subject else "")
    if record.credential_kind in ("", "session"):
        return format_html("{}", name or "someone")
    credential = record.credential_name or record.credential_id
    return format_html("{} (with {} credential {})", name or "someone", record.credential_kind, credential)


def from_address(record: AuditRecord) -> SafeString:
    if not record.client_address or record.credential_kind == "shell":
        return SafeString("")
    return format_html(" from {}", record.client_address)


def token_label(detail: Detail) -> SafeString:
    name, prefix = _text(detail, "name"), _text(detail, "prefix")
    if not name and not prefix:
        return format_html("token #{}", _text(detail, "token_id") or "?")
    if not prefix:
        return format_html("token {}", name)
    return format_html("token {} ({}…)", name or f"#{_text(detail, 'token_id')}", prefix)


def client_label(detail: Detail) -> SafeString:
    return format_html("client {}", _text(detail, "client") or _text(detail, "client_id") or "(unknown)")


# --- one sentence per event ---------------------------------------------------------------------------------------


def token_created(record: AuditRecord, detail: Detail) -> SafeString:
    scope = _text(detail, "scope")
    return format_html(
        "{} created {} for {}{}{}",
        who(record),
        token_label(detail),
        _text(detail, "owner") or "(unknown owner)",
        format_html(" with scope {}", scope) if scope else "",
        from_address(record),
    )


def token_revoked(record: AuditRecord, detail: Detail) -> SafeString:
    owner = _text(detail, "owner")
    of_owner = format_html(" of {}", owner) if owner and owner != record.username else ""
    return format_html("{} revoked {}{}{}", who(record), token_label(detail), of_owner, from_address(record))


def token_first_used(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html("{} first used{}", token_label(detail), from_address(record))


def admin_login(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html("{} signed in to the admin{}", record.username or "someone", from_address(record))


def admin_login_failed(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html("login failed for ‘{}’{}", record.username, from_address(record))


def second_factor_enrolled(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html("{} set up a second factor{}", who(record), from_address(record))


def second_factor_verified(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html("{} gave the second factor ({}){}", who(record), _text(detail, "by"), from_address(record))


def second_factor_failed(record: AuditRecord, detail: Detail) -> SafeString:
    step = " while setting it up" if _text(detail, "step") == "set-up" else ""
    return format_html(
        "wrong second-factor code ({}) for ‘{}’{}{}", _text(detail, "by"), record.username, step, from_address(record)
    )


def second_factor_throttled(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "second-factor codes throttled for ‘{}’{} after repeated wrong codes", record.username, from_address(record)
    )


def recovery_code_used(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "{} signed in with a recovery code{} ({} left)",
        who(record),
        from_address(record),
        _text(detail, "recovery_codes_left"),
    )


def second_factor_reset(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html("{} removed the second factor of ‘{}’", who(record), _text(detail, "user"))


def admin_login_throttled(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html("sign-in throttled for ‘{}’{} after repeated failures", record.username, from_address(record))


def auth_failed(record: AuditRecord, detail: Detail) -> SafeString:
    if detail.get("aggregated"):
        reasons = listing(_strings(detail, "reasons"))
        return format_html(
            "authentication failed {} more at /mcp{}{}",
            counted(_count(detail, "count"), "time"),
            from_address(record),
            format_html(": {}", reasons) if reasons else "",
        )
    reason = _text(detail, "reason")
    return format_html(
        "authentication failed at /mcp{}{}", from_address(record), format_html(": {}", reason) if reason else ""
    )


def audit_full(record: AuditRecord, detail: Detail) -> SafeString:
    used, limit = _count(detail, "bytes"), _count(detail, "max_bytes")
    size = format_html(" ({} of its {} budget)", human(used), human(limit)) if limit else ""
    return format_html(
        "the audit log is full{}: {} refused", size, counted(_count(detail, "calls_refused"), "tool call")
    )


def audit_pruned(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "{} pruned {} created before {}",
        who(record),
        counted(_count(detail, "count"), "audit record"),
        _text(detail, "before") or "(unknown)",
    )


def audit_loss_accepted(record: AuditRecord, detail: Detail) -> SafeString:
    missing = _count(detail, "records_missing")
    return format_html(
        "{} accepted the loss of {} at start-up, the chain going on after record {}: {}",
        who(record),
        counted(missing, "audit record") if missing else "audit records",
        _count(detail, "chain_restarts_after"),
        _text(detail, "problem") or "(unknown)",
    )


def audit_records_held(record: AuditRecord, detail: Detail) -> SafeString:
    when = "by the next start, from the spill file" if detail.get("replayed") else "once the database took them"
    return format_html(
        "the database refused {} for {} s ({}); held, then written {}",
        counted(_count(detail, "count"), "finished call record"),
        _count(detail, "held_seconds"),
        _text(detail, "reason") or "no reason given",
        when,
    )


REGISTRATION_SOURCES = {"dcr": "by dynamic client registration", "cimd": "through its client metadata document"}


def client_registered(record: AuditRecord, detail: Detail) -> SafeString:
    source = _text(detail, "source")
    how = REGISTRATION_SOURCES.get(source, f"({source})" if source else "")
    return format_html(
        "{} registered{}{}", client_label(detail), format_html(" {}", how) if how else "", from_address(record)
    )


def consent(record: AuditRecord, detail: Detail) -> SafeString:
    decision = _text(detail, "decision")
    verb = {"approved": "approved", "denied": "refused"}.get(decision, decision or "answered")
    scope, host, outcome = _text(detail, "scope"), _text(detail, "redirect_host"), _text(detail, "outcome")
    terms = ", ".join(part for part in (f"scope {scope}" if scope else "", f"back to {host}" if host else "") if part)
    return format_html(
        "{} {} the connection of {}{}{}{}",
        who(record),
        verb,
        client_label(detail),
        format_html(" ({})", terms) if terms else "",
        from_address(record),
        format_html(": {}", outcome) if outcome and outcome != "code issued" else "",
    )


def revoked_counts(detail: Detail) -> str:
    parts = [
        counted(_count(detail, "access_tokens"), "access token"),
        counted(_count(detail, "refresh_tokens"), "refresh token"),
        counted(_count(detail, "grants"), "pending authorization code"),
    ]
    return ", ".join(parts)


def client_revoked(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "{} revoked {}{}: {}", who(record), client_label(detail), from_address(record), revoked_counts(detail)
    )


def oauth_token_revoked(record: AuditRecord, detail: Detail) -> SafeString:
    owner = _text(detail, "owner")
    client = _text(detail, "client")
    return format_html(
        "{} revoked OAuth access token #{}{}{}{}",
        who(record),
        _text(detail, "token_id") or "?",
        format_html(" of {}", owner) if owner else "",
        format_html(" (client {})", client) if client else "",
        from_address(record),
    )


def code_replayed(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "an authorization code of {} was used a second time{}: the tokens it was exchanged for were revoked",
        client_label(detail),
        from_address(record),
    )


def refresh_reused(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "a revoked refresh token of {} was used again{}: its whole token family was revoked",
        client_label(detail),
        from_address(record),
    )


def client_pruned(record: AuditRecord, detail: Detail) -> SafeString:
    registered = _text(detail, "registered")[:10]
    return format_html(
        "{} removed the unused {}{}",
        who(record),
        client_label(detail),
        format_html(" (registered {})", registered) if registered else "",
    )


def client_removed(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html("{} revoked and removed {}{}", who(record), client_label(detail), from_address(record))


ROTATED = (
    ("bearer_tokens", "bearer token"),
    ("clients", "client"),
    ("access_tokens", "access token"),
    ("refresh_tokens", "refresh token"),
    ("grants", "pending authorization code"),
    ("sessions", "admin session"),
)


def credentials_rotated(record: AuditRecord, detail: Detail) -> SafeString:
    cut = [counted(_count(detail, key), word) for key, word in ROTATED if _count(detail, key)]
    notes = []
    if detail.get("kept_bearer_tokens"):
        notes.append("bearer tokens kept")
    if detail.get("stop_background") is False:
        notes.append("background processes left running")
    new_token = _text(detail, "new_token_prefix")
    owner = _text(detail, "new_token_owner")
    return format_html(
        "{} rotated all credentials{}: {}{}{}{}",
        who(record),
        from_address(record),
        ", ".join(cut) or "nothing was live",
        format_html(" ({})", ", ".join(notes)) if notes else "",
        format_html("; new token {}…", new_token) if new_token else "",
        format_html(" for {}", owner) if new_token and owner else "",
    )


def background_stopped(record: AuditRecord, detail: Detail) -> SafeString:
    commands = _strings(detail, "commands") or [f"pid {pid}" for pid in _strings(detail, "pids")]
    reason, by = _text(detail, "reason"), _text(detail, "revoked_by")
    return format_html(
        "{} stopped after a revocation{}{}{}",
        counted(len(_strings(detail, "pids")) or len(commands), "background process", "background processes"),
        format_html(" ({})", reason) if reason else "",
        format_html(" by {}", by) if by else "",
        format_html(": {}", listing(commands)) if commands else "",
    )


def console_background_stopped(record: AuditRecord, detail: Detail) -> SafeString:
    commands = _strings(detail, "commands") or [f"pid {pid}" for pid in _strings(detail, "pids")]
    users = _strings(detail, "users")
    return format_html(
        "{} stopped {} from the console{}{}{}",
        who(record),
        counted(len(_strings(detail, "pids")) or len(commands), "background command"),
        from_address(record),
        format_html(" (started by {})", listing(users)) if users else "",
        format_html(": {}", listing(commands)) if commands else "",
    )


def console_call_stopped(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "{} stopped a running {} call of {} from the console{}: {}",
        who(record),
        _text(detail, "tool"),
        _text(detail, "user"),
        from_address(record),
        _text(detail, "summary"),
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
    action = _text(detail, "action")
    rules = _strings(detail, "rule_ids") or ([_text(detail, "rule_id")] if detail.get("rule_id") else [])
    named = format_html(" {}", listing(rules)) if rules and action not in ("settings",) else ""
    return format_html(
        "{} {}{}{} (policy version {})",
        who(record),
        POLICY_ACTIONS.get(action, f"changed the policy ({action})"),
        named,
        from_address(record),
        _text(detail, "version"),
    )


def policy_loaded(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "{} loaded a command policy of {} from {} (policy version {}, sha256 {}…)",
        who(record),
        counted(len(_strings(detail, "rule_ids")), "rule"),
        _text(detail, "source") or "a file",
        _text(detail, "version"),
        _text(detail, "sha256")[:12],
    )


def approval_decided(record: AuditRecord, detail: Detail) -> SafeString:
    decision = _text(detail, "decision")
    waited = f"{_count(detail, 'latency_ms') / 1000:.1f}"
    if decision == "timed_out":
        return format_html("request {} got no answer in {} s: denied", _text(detail, "request"), waited)
    if decision == "cancelled":
        return format_html("request {} ended unanswered after {} s (its call ended)", _text(detail, "request"), waited)
    verb = {"approved": "approved", "denied": "denied"}.get(decision, decision.replace("_", " "))
    minutes = detail.get("grant_minutes")
    grant = format_html(" and the same command shape for {} minutes", minutes) if minutes else ""
    reason = format_html(": {}", _text(detail, "reason")) if decision == "denied" and detail.get("reason") else ""
    return format_html(
        "{} {} request {}{} through the {} after {} s{}",
        who(record),
        verb,
        _text(detail, "request"),
        grant,
        _text(detail, "channel"),
        waited,
        reason,
    )


def approval_grants_revoked(record: AuditRecord, detail: Detail) -> SafeString:
    requests = _strings(detail, "requests")
    return format_html(
        "{} revoked {} ({}){}",
        who(record),
        counted(len(requests), "timed approval grant"),
        listing(_strings(detail, "shapes")),
        from_address(record),
    )


def approval_run_in_background(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "approved request {} of {} started as background command {}: {}",
        _text(detail, "request"),
        who(record, subject=False),
        _text(detail, "pid"),
        _text(detail, "command"),
    )


def approval_run_failed(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "approved request {} of {} did not start: {}",
        _text(detail, "request"),
        who(record, subject=False),
        _text(detail, "error"),
    )


SENTENCES: dict[str, Sentence] = {
    "token.created": token_created,
    "token.revoked": token_revoked,
    "token.first_used": token_first_used,
    "admin.login": admin_login,
    "admin.login_failed": admin_login_failed,
    "admin.login_throttled": admin_login_throttled,
    "admin.second_factor_enrolled": second_factor_enrolled,
    "admin.second_factor_verified": second_factor_verified,
    "admin.second_factor_failed": second_factor_failed,
    "admin.second_factor_throttled": second_factor_throttled,
    "admin.recovery_code_used": recovery_code_used,
    "admin.second_factor_reset": second_factor_reset,
    "auth.failed": auth_failed,
    "audit.full": audit_full,
    "audit.pruned": audit_pruned,
    "audit.loss_accepted": audit_loss_accepted,
    "audit.records_held": audit_records_held,
    "oauth.client_registered": client_registered,
    "oauth.consent": consent,
    "oauth.client_revoked": client_revoked,
    "oauth.token_revoked": oauth_token_revoked,
    "oauth.code_replayed": code_replayed,
    "oauth.refresh_reused": refresh_reused,
    "oauth.client_pruned": client_pruned,
    "oauth.client_removed": client_removed,
    "credentials.rotated": credentials_rotated,
    "credentials.background_stopped": background_stopped,
    "console.background_stopped": console_background_stopped,
    "console.call_stopped": console_call_stopped,
    "policy.changed": policy_changed,
    "policy.loaded": policy_loaded,
    "approval.decided": approval_decided,
    "approval.run_in_background": approval_run_in_background,
    "approval.run_failed": approval_run_failed,
    "approval.grants_revoked": approval_grants_revoked,
}


def fallback(record: AuditRecord, detail: Detail) -> SafeString:
    """An event with no sentence of its own: its name and its detail as key=value pairs."""
    pairs = [(key, _text(detail, key)) for key in sorted(detail)]
    actor = format_html(" by {}", who(record, subject=False)) if record.username else ""
    return format_html(
        "{}{}{}{}",
        record.event or "event",
        actor,
        from_address(record),
        format_html(": {}", format_html_join(", ", "{}={}", pairs)) if pairs else "",
    )


def event_sentence(record: AuditRecord) -> SafeString:
    """The event as one sentence of escaped text (safe to put in a page as it is)."""
    detail = record.detail if isinstance(record.detail, dict) else {}
    build = SENTENCES.get(record.event, fallback)
    try:
        return build(record, detail)
    except (TypeError, ValueError, AttributeError):  # a detail of an unexpected shape: say what is there
        return fallback(record, detail)
