"""Security events as sentences: "admin revoked token laptop (sst_abcd…) from 10.0.0.5", not a line of JSON.

One builder per event name the code writes (SENTENCES, gathered from this package's modules, one per kind of event;
a test finds every `event("…")` in the source and checks it has one); an event without one reads "name: key=value,
…". Names, addresses, user agents and reasons come from agents, clients and people typing into a login form: every
piece goes through format_html (audit.event_sentences.words), so all of it is escaped and nothing is ever marked
safe that was not built here.
"""

from __future__ import annotations

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from audit.event_sentences import access, audit_log, console, oauth
from audit.event_sentences.words import Detail, Sentence, from_address, text, who
from audit.models import AuditRecord

SENTENCES: dict[str, Sentence] = {**access.SENTENCES, **oauth.SENTENCES, **audit_log.SENTENCES, **console.SENTENCES}


def fallback(record: AuditRecord, detail: Detail) -> SafeString:
    """An event with no sentence of its own: its name and its detail as key=value pairs."""
    pairs = [(key, text(detail, key)) for key in sorted(detail)]
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
