"""The kill switch: revoke every credential at once and start again from one new bearer token.

In one database transaction: every OAuth access token (registration tokens included), refresh token and pending
authorization code, and every bearer token (unless kept), are revoked; every admin session but the caller's is
ended; one new bearer token is issued; the rotation is recorded in the audit log and announced, so the MCP server
cancels the running tool calls of the revoked credentials (and, if asked, stops their background processes).
Sessions open at /mcp stop working at their next request: every request is authenticated afresh.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application, Grant, RefreshToken

from audit.log import Actor, event
from oauth.credentials import KIND_BEARER, KIND_OAUTH
from oauth.models import BearerToken, Revocation
from oauth.revocation import announce, revoke_everything_of
from oauth.tokens import issue_token


@dataclass(frozen=True)
class RotationCounts:
    """What a rotation cuts off (the confirmation page shows it before anything happens)."""

    access_tokens: int
    refresh_tokens: int
    grants: int
    bearer_tokens: int
    clients: int
    sessions: int


@dataclass(frozen=True)
class RotationResult:
    counts: RotationCounts
    new_token: BearerToken
    new_secret: str  # shown once, never stored


def _live_access_tokens() -> Q:
    return Q(expires__gt=timezone.now())


def _clients_with_credentials() -> set[int]:
    ids: set[int] = set(
        AccessToken.objects.filter(_live_access_tokens(), application__isnull=False).values_list(
            "application_id", flat=True
        )
    )
    ids.update(RefreshToken.objects.filter(revoked__isnull=True).values_list("application_id", flat=True))
    ids.update(Grant.objects.values_list("application_id", flat=True))
    return ids


def preview(*, keep_bearer: bool = False, keep_session_key: str | None = None) -> RotationCounts:
    sessions = Session.objects.filter(expire_date__gt=timezone.now())
    return RotationCounts(
        access_tokens=AccessToken.objects.filter(_live_access_tokens()).count(),
        refresh_tokens=RefreshToken.objects.filter(revoked__isnull=True).count(),
        grants=Grant.objects.count(),
        bearer_tokens=0 if keep_bearer else BearerToken.objects.active().count(),
        clients=len(_clients_with_credentials()),
        sessions=sessions.exclude(session_key=keep_session_key or "").count(),
    )


def rotate_all(
    *,
    by: Actor,
    new_owner: User,
    stop_background: bool = True,
    keep_bearer: bool = False,
    keep_session_key: str | None = None,
) -> RotationResult:
    """Revoke everything (see the module doc) and issue one new bearer token for `new_owner`."""
    with transaction.atomic():
        clients = _clients_with_credentials()
        oauth = revoke_everything_of(Application.objects.all())
        # Tokens of no application (introspection cache rows) cannot exist here, but leave nothing behind.
        oauth["access_tokens"] += AccessToken.objects.all().delete()[1].get(AccessToken._meta.label, 0)
        bearer_revoked = 0
        if not keep_bearer:
            bearer_revoked = BearerToken.objects.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        sessions = Session.objects.exclude(session_key=keep_session_key or "").delete()[0]
        token, secret = issue_token(new_owner, f"rotation {timezone.now():%Y-%m-%d %H:%M}", by=by)
        counts = RotationCounts(
            access_tokens=oauth["access_tokens"],
            refresh_tokens=oauth["refresh_tokens"],
            grants=oauth["grants"],
            bearer_tokens=bearer_revoked,
            clients=len(clients),
            sessions=sessions,
        )
        event(
            "credentials.rotated",
            by,
            **asdict(counts),
            stop_background=stop_background,
            kept_bearer_tokens=keep_bearer,
            new_token_id=token.pk,
            new_token_prefix=token.prefix,
            new_token_owner=new_owner.get_username(),
        )
        # By prefix: every OAuth (and bearer) credential that exists now. The new token is untouched: only calls
        # and processes started before this moment are affected.
        prefixes = [f"{KIND_OAUTH}:"] + ([] if keep_bearer else [f"{KIND_BEARER}:"])
        announce([], prefixes=prefixes, reason=Revocation.REASON_ROTATION, by=by, stop_background=stop_background)
    return RotationResult(counts=counts, new_token=token, new_secret=secret)
