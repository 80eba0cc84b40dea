"""The sentences of OAuth clients: registration, consent, revocation, replayed codes and refresh tokens, tokens
refused to a suspended app, pruning."""

from __future__ import annotations

from django.utils.html import format_html
from django.utils.safestring import SafeString

from audit.event_sentences.words import (
    Detail,
    Sentence,
    background_words,
    client_label,
    confinement_label,
    count,
    counted,
    from_address,
    text,
    who,
)
from audit.models import AuditRecord

REGISTRATION_SOURCES = {"dcr": "by dynamic client registration", "cimd": "through its client metadata document"}


def client_registered(record: AuditRecord, detail: Detail) -> SafeString:
    source = text(detail, "source")
    how = REGISTRATION_SOURCES.get(source, f"({source})" if source else "")
    return format_html(
        "{} registered{}{}", client_label(detail), format_html(" {}", how) if how else "", from_address(record)
    )


def consent(record: AuditRecord, detail: Detail) -> SafeString:
    decision = text(detail, "decision")
    verb = {"approved": "approved", "denied": "refused"}.get(decision, decision or "answered")
    scope, host, outcome = text(detail, "scope"), text(detail, "redirect_host"), text(detail, "outcome")
    confined = f"confinement {confinement_label(detail, 'confinement')}" if "confinement" in detail else ""
    parts = (f"scope {scope}" if scope else "", confined, f"back to {host}" if host else "")
    terms = ", ".join(part for part in parts if part)
    upgrade = text(detail, "upgrade_from")  # a step-up: the app held this scope, and asked for more
    return format_html(
        "{} {} {} of {}{}{}{}",
        who(record),
        verb,
        format_html("the upgrade from {} of the connection", upgrade) if upgrade else "the connection",
        client_label(detail),
        format_html(" ({})", terms) if terms else "",
        from_address(record),
        format_html(": {}", outcome) if outcome and outcome != "code issued" else "",
    )


def revoked_counts(detail: Detail) -> str:
    parts = [
        counted(count(detail, "access_tokens"), "access token"),
        counted(count(detail, "refresh_tokens"), "refresh token"),
        counted(count(detail, "grants"), "pending authorization code"),
    ]
    return ", ".join(parts)


def client_revoked(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html(
        "{} revoked {}{}: {}", who(record), client_label(detail), from_address(record), revoked_counts(detail)
    )


def oauth_token_revoked(record: AuditRecord, detail: Detail) -> SafeString:
    owner = text(detail, "owner")
    client = text(detail, "client")
    return format_html(
        "{} revoked OAuth access token #{}{}{}{}",
        who(record),
        text(detail, "token_id") or "?",
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
    registered = text(detail, "registered")[:10]
    return format_html(
        "{} removed the unused {}{}",
        who(record),
        client_label(detail),
        format_html(" (registered {})", registered) if registered else "",
    )


def client_removed(record: AuditRecord, detail: Detail) -> SafeString:
    return format_html("{} revoked and removed {}{}", who(record), client_label(detail), from_address(record))


def confinement_changed(record: AuditRecord, detail: Detail) -> SafeString:
    owner = text(detail, "owner")
    return format_html(
        "{} changed the confinement of {}{} from {} to {}{}",
        who(record),
        client_label(detail),
        format_html(" for {}", owner) if owner else "",
        confinement_label(detail, "previous"),
        confinement_label(detail, "confinement"),
        from_address(record),
    )


def client_suspended(record: AuditRecord, detail: Detail) -> SafeString:
    return _client_suspension("suspended", record, detail)


def client_resumed(record: AuditRecord, detail: Detail) -> SafeString:
    return _client_suspension("resumed", record, detail)


def _client_suspension(done: str, record: AuditRecord, detail: Detail) -> SafeString:
    owner = text(detail, "owner")  # "": every user of the client
    return format_html(
        "{} {} {} {}{}{}",
        who(record),
        done,
        client_label(detail),
        format_html("for {}", owner) if owner else "for every user",
        from_address(record),
        background_words(detail),
    )


GRANT_WORDS = {"refresh_token": "a refresh token", "authorization_code": "an authorization code"}


def token_refused(record: AuditRecord, detail: Detail) -> SafeString:
    grant, owner, reason = text(detail, "grant_type"), text(detail, "owner"), text(detail, "reason")
    whom = "every user" if detail.get("for_every_user") else owner
    why = f"the app is suspended by an administrator for {whom}" if reason == "suspended" else reason
    return format_html(
        "the token endpoint refused to exchange {} of {}{}{}{}",
        GRANT_WORDS.get(grant, f"a grant ({grant})" if grant else "a grant"),
        client_label(detail),
        format_html(" for {}", owner) if owner else "",
        from_address(record),
        format_html(": {}", why) if why else "",
    )


SENTENCES: dict[str, Sentence] = {
    "oauth.client_registered": client_registered,
    "oauth.consent": consent,
    "oauth.client_revoked": client_revoked,
    "oauth.client_suspended": client_suspended,
    "oauth.client_resumed": client_resumed,
    "oauth.token_revoked": oauth_token_revoked,
    "oauth.code_replayed": code_replayed,
    "oauth.refresh_reused": refresh_reused,
    "oauth.token_refused": token_refused,
    "oauth.client_pruned": client_pruned,
    "oauth.client_removed": client_removed,
    "oauth.confinement_changed": confinement_changed,
}
