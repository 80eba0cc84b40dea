"""Revoking OAuth credentials, and telling the MCP server about any revocation.

The toolkit deletes access tokens and marks refresh tokens revoked one at a time; this module revokes by client,
by token family and by replayed code, records each in the audit log, and announces it: a Revocation row plus the
`credentials_revoked` signal, on which the MCP server cancels the running tool calls of those credentials and
stops their background processes. `oauth` cannot import `mcpserver`; the signal is the seam.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.dispatch import Signal
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application, Grant, RefreshToken

from audit.log import Actor, event, lock_head
from oauth.credentials import application_label, oauth_key
from oauth.models import CodeExchange, Revocation

# Sent after the transaction that revoked credentials commits, with `revocation=<Revocation>`.
credentials_revoked = Signal()


def announce(
    keys: Iterable[str],
    *,
    reason: str,
    by: Actor | None,
    prefixes: Iterable[str] = (),
    stop_background: bool = True,
) -> Revocation | None:
    """Record that the credentials with these principal keys (or key prefixes) were revoked; signal it once
    committed. Their running tool calls are cancelled and, unless `stop_background` is False (a rotation may
    choose so), the background processes they started are stopped."""
    unique, prefix_list = sorted(set(keys)), sorted(set(prefixes))
    if not unique and not prefix_list:
        return None
    with transaction.atomic():
        # Each server's watcher reads revocations by rising id and remembers the last it applied, so ids must
        # commit in their order. Concurrent PostgreSQL transactions could commit ids out of order; the audit
        # chain's lock (taken by the event recorded with every revocation anyway) makes them wait their turn.
        lock_head()
        revocation = Revocation.objects.create(
            keys=unique,
            prefixes=prefix_list,
            reason=reason,
            stop_background=stop_background,
            username=by.username if by else "",
        )
    transaction.on_commit(lambda: credentials_revoked.send(sender=Revocation, revocation=revocation))
    return revocation


def client_keys(application_ids: Iterable[int]) -> set[str]:
    """The principal keys of every user holding a live token or pending code of these clients."""
    ids = list(application_ids)
    pairs: set[tuple[int, int]] = set()
    pairs.update(
        AccessToken.objects.filter(application_id__in=ids, user__isnull=False).values_list("application_id", "user_id")
    )
    pairs.update(
        RefreshToken.objects.filter(application_id__in=ids, revoked__isnull=True).values_list(
            "application_id", "user_id"
        )
    )
    pairs.update(Grant.objects.filter(application_id__in=ids).values_list("application_id", "user_id"))
    return {oauth_key(application_id, user_id) for application_id, user_id in pairs}


def revoke_everything_of(applications: QuerySet[Application]) -> dict[str, Any]:
    """Delete the access tokens and pending codes and revoke the refresh tokens of these clients (in bulk)."""
    now = timezone.now()
    return {
        "access_tokens": AccessToken.objects.filter(application__in=applications)
        .delete()[1]
        .get(AccessToken._meta.label, 0),
        "refresh_tokens": RefreshToken.objects.filter(application__in=applications, revoked__isnull=True).update(
            revoked=now, updated=now, access_token=None
        ),
        "grants": Grant.objects.filter(application__in=applications).delete()[0],
    }


def revoke_clients(applications: QuerySet[Application], by: Actor | None) -> int:
    """Revoke every token and pending code of each client, recording each; returns how many clients."""
    with transaction.atomic():
        chosen = list(applications)
        keys = client_keys(app.pk for app in chosen)
        # Every token first, then the audit records: whoever holds the audit chain's lock takes no other row lock
        # after it, so two transactions never wait for each other in a circle (a deadlock on PostgreSQL).
        counts = [revoke_everything_of(Application.objects.filter(pk=application.pk)) for application in chosen]
        for application, revoked in zip(chosen, counts, strict=True):
            event(
                "oauth.client_revoked",
                by,
                client_id=application.client_id,
                client=application_label(application.name, application.client_id),
                **revoked,
            )
        announce(keys, reason=Revocation.REASON_CLIENT, by=by)
    return len(chosen)


def revoke_family_of(token: AccessToken) -> None:
    """Revoke an access token with its whole refresh-token family (or alone, if it has none)."""
    refresh = RefreshToken.objects.filter(access_token=token).first() or token.source_refresh_token
    if refresh is not None and refresh.token_family:
        RefreshToken.revoke_family(refresh.token_family)
    elif refresh is not None:
        refresh.revoke()
    AccessToken.objects.filter(pk=token.pk).delete()


def revoke_access_tokens(tokens: QuerySet[AccessToken], by: Actor | None) -> int:
    """Revoke access tokens and their refresh-token families, recording each; returns how many."""
    with transaction.atomic():
        chosen = list(tokens.select_related("application", "user", "source_refresh_token"))
        keys = {oauth_key(t.application_id, t.user_id) for t in chosen if t.application_id and t.user_id}
        for token in chosen:
            revoke_family_of(token)
            label = application_label(token.application.name, token.application.client_id) if token.application else ""
            event(
                "oauth.token_revoked",
                by,
                token_id=token.pk,
                client=label,
                owner=token.user.get_username() if token.user else "",
            )
        announce(keys, reason=Revocation.REASON_TOKEN, by=by)
    return len(chosen)


def code_hash(code: str) -> str:
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


def revoke_tokens_of_replayed_code(code: str, application: Application, client_address: str = "") -> bool:
    """A used authorization code came back: revoke what it was exchanged for. True if there was something."""
    with transaction.atomic():
        exchange = (
            CodeExchange.objects.select_for_update().filter(code_hash=code_hash(code), application=application).first()
        )
        if exchange is None:
            return False
        if exchange.token_family is not None:
            RefreshToken.revoke_family(exchange.token_family)
        if exchange.access_token_id is not None:
            AccessToken.objects.filter(pk=exchange.access_token_id).delete()
        first_replay = exchange.replayed_at is None
        exchange.replayed_at = timezone.now()
        exchange.save(update_fields=["replayed_at"])
        if first_replay:
            event(
                "oauth.code_replayed",
                Actor(client_address=client_address),
                client_id=application.client_id,
                client=application_label(application.name, application.client_id),
                user_id=exchange.user_id,
            )
            if exchange.user_id is not None:
                announce([oauth_key(application.pk, exchange.user_id)], reason=Revocation.REASON_CODE_REPLAY, by=None)
    return True
