"""The sentences of bearer tokens, admin sign-in and its second factor, failed authentication at /mcp, and
rotating or revoking credentials."""

from __future__ import annotations

from django.utils.html import format_html
from django.utils.safestring import SafeString

from audit.event_sentences.words import (
    Detail,
    Sentence,
    background_words,
    confinement_label,
    count,
    counted,
    from_address,
    listing,
    strings,
    text,
    token_label,
    who,
)
from audit.models import AuditRecord


def token_created(record: AuditRecord, detail: Detail) -> SafeString:
    scope = text(detail, "scope")
    confined = "confinement" in detail
    return format_html(
        "{} created {} for {}{}{}{}",
        who(record),
        token_label(detail),
        text(detail, "owner") or "(unknown owner)",
        format_html(" with scope {}", scope) if scope else "",
        format_html(", confinement {}", confinement_label(detail, "confinement")) if confined else "",
        from_address(record),
    )


def token_revoked(record: AuditRecord, detail: Detail) -> SafeString:
    owner = text(detail, "owner")
    of_owner = format_html(" of {}", owner) if owner and owner != record.username else ""
    return format_html("{} revoked {}{}{}", who(record), token_label(detail), of_owner, from_address(record))


def token_confinement_changed(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "{} changed the confinement of {} from {} to {}{}",
        who(record),
        token_label(detail),
        confinement_label(detail, "previous"),
        confinement_label(detail, "confinement"),
        from_address(record),
    )


def token_first_used(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html("{} first used{}", token_label(detail), from_address(record))


def admin_login(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html("{} signed in to the admin{}", record.username or "someone", from_address(record))


def admin_login_failed(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html("login failed for ‘{}’{}", record.username, from_address(record))


def second_factor_enrolled(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html("{} set up a second factor{}", who(record), from_address(record))


def second_factor_verified(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html("{} gave the second factor ({}){}", who(record), text(detail, "by"), from_address(record))


def second_factor_failed(record: AuditRecord, detail: Detail) -> SafeString:
    step = " while setting it up" if text(detail, "step") == "set-up" else ""
    return format_html(
        "wrong second-factor code ({}) for ‘{}’{}{}", text(detail, "by"), record.username, step, from_address(record)
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
        text(detail, "recovery_codes_left"),
    )


def second_factor_reset(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html("{} removed the second factor of ‘{}’", who(record), text(detail, "user"))


def admin_login_throttled(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html("sign-in throttled for ‘{}’{} after repeated failures", record.username, from_address(record))


def auth_failed(record: AuditRecord, detail: Detail) -> SafeString:
    if detail.get("aggregated"):
        reasons = listing(strings(detail, "reasons"))
        return format_html(
            "authentication failed {} more at /mcp{}{}",
            counted(count(detail, "count"), "time"),
            from_address(record),
            format_html(": {}", reasons) if reasons else "",
        )
    reason = text(detail, "reason")
    return format_html(
        "authentication failed at /mcp{}{}", from_address(record), format_html(": {}", reason) if reason else ""
    )


ROTATED = (
    ("bearer_tokens", "bearer token"),
    ("clients", "client"),
    ("access_tokens", "access token"),
    ("refresh_tokens", "refresh token"),
    ("grants", "pending authorization code"),
    ("sessions", "admin session"),
)


def credentials_rotated(record: AuditRecord, detail: Detail) -> SafeString:
    cut = [counted(count(detail, key), word) for key, word in ROTATED if count(detail, key)]
    notes = []
    if detail.get("kept_bearer_tokens"):
        notes.append("bearer tokens kept")
    if detail.get("stop_background") is False:
        notes.append("background processes left running")
    new_token = text(detail, "new_token_prefix")
    owner = text(detail, "new_token_owner")
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
    commands = strings(detail, "commands") or [f"pid {pid}" for pid in strings(detail, "pids")]
    reason, by = text(detail, "reason"), text(detail, "revoked_by")
    return format_html(
        "{} stopped after a revocation{}{}{}",
        counted(len(strings(detail, "pids")) or len(commands), "background process", "background processes"),
        format_html(" ({})", reason) if reason else "",
        format_html(" by {}", by) if by else "",
        format_html(": {}", listing(commands)) if commands else "",
    )


def token_regenerated(record: AuditRecord, detail: Detail) -> SafeString:
    previous, owner = text(detail, "previous_prefix"), text(detail, "owner")
    return format_html(
        "{} regenerated {}{}{}: the old secret{} is revoked{}",
        who(record),
        token_label(detail),
        format_html(" for {}", owner) if owner else "",
        from_address(record),
        format_html(" ({}…)", previous) if previous else "",
        background_words(detail),
    )


def token_suspended(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "{} suspended {}{}{}", who(record), token_label(detail), from_address(record), background_words(detail)
    )


def token_resumed(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "{} resumed {}{}{}", who(record), token_label(detail), from_address(record), background_words(detail)
    )


def processes_stopped(record: AuditRecord, detail: Detail) -> SafeString:
    """Processes a revoked credential's commands left running outside any background job (`setsid cmd &`)."""
    commands = strings(detail, "commands") or [f"pid {pid}" for pid in strings(detail, "pids")]
    reason, by = text(detail, "reason"), text(detail, "revoked_by")
    return format_html(
        "{} left running by the commands of a revoked credential stopped{}{}{}",
        counted(len(strings(detail, "pids")) or len(commands), "process", "processes"),
        format_html(" ({})", reason) if reason else "",
        format_html(" by {}", by) if by else "",
        format_html(": {}", listing(commands)) if commands else "",
    )


SENTENCES: dict[str, Sentence] = {
    "token.created": token_created,
    "token.revoked": token_revoked,
    "token.regenerated": token_regenerated,
    "token.suspended": token_suspended,
    "token.resumed": token_resumed,
    "token.first_used": token_first_used,
    "token.confinement_changed": token_confinement_changed,
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
    "credentials.rotated": credentials_rotated,
    "credentials.background_stopped": background_stopped,
    "credentials.processes_stopped": processes_stopped,
}
