"""The sentences of the audit log's own events: full, pruned, a loss accepted at start-up, records held."""

from __future__ import annotations

from django.utils.html import format_html
from django.utils.safestring import SafeString

from audit.budget import human
from audit.event_sentences.words import Detail, Sentence, count, counted, text, who
from audit.models import AuditRecord


def audit_full(record: AuditRecord, detail: Detail) -> SafeString:
    used, limit = count(detail, "bytes"), count(detail, "max_bytes")
    size = format_html(" ({} of its {} budget)", human(used), human(limit)) if limit else ""
    return format_html(
        "the audit log is full{}: {} refused", size, counted(count(detail, "calls_refused"), "tool call")
    )


def audit_pruned(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "{} pruned {} created before {}",
        who(record),
        counted(count(detail, "count"), "audit record"),
        text(detail, "before") or "(unknown)",
    )


def audit_loss_accepted(record: AuditRecord, detail: Detail) -> SafeString:
    missing = count(detail, "records_missing")
    return format_html(
        "{} accepted the loss of {} at start-up, the chain going on after record {}: {}",
        who(record),
        counted(missing, "audit record") if missing else "audit records",
        count(detail, "chain_restarts_after"),
        text(detail, "problem") or "(unknown)",
    )


def audit_records_held(record: AuditRecord, detail: Detail) -> SafeString:
    when = "by the next start, from the spill file" if detail.get("replayed") else "once the database took them"
    return format_html(
        "the database refused {} for {} s ({}); held, then written {}",
        counted(count(detail, "count"), "finished call record"),
        count(detail, "held_seconds"),
        text(detail, "reason") or "no reason given",
        when,
    )


SENTENCES: dict[str, Sentence] = {
    "audit.full": audit_full,
    "audit.pruned": audit_pruned,
    "audit.loss_accepted": audit_loss_accepted,
    "audit.records_held": audit_records_held,
}
