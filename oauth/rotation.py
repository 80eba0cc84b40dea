"""The kill switch: revoke every credential at once and start again from one new bearer token.

In one database transaction: every OAuth access token (registration tokens included), refresh token and pending
authorization code, and every bearer token (unless kept), are revoked; every admin session but the caller's is
ended; one new bearer token is issued; the rotation is recorded in the audit log and announced, so the MCP server
cancels the running tool calls of the revoked credentials (and, if asked, stops their background processes).
Sessions open at /mcp stop working at their next request: every request is authenticated afresh.

The confirmation page, the result page and `rotate_tokens` report the same numbers: what still worked before the
rotation and no longer does (`counts`). Rows that were dead already (expired tokens and codes, expired sessions) are
revoked or deleted as well, but not counted: nothing is cut off by their going.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application, Grant, RefreshToken

from audit.log import Actor, event
from oauth.credentials import KIND_BEARER, KIND_OAUTH, application_label
from oauth.models import BearerToken, Revocation
from oauth.revocation import announce, revoke_everything_of
from oauth.tokens import issue_token

# RFC 7592 registration access tokens: internal to a client's registration, user NULL (oauth/admin_clients.py).
REGISTRATION_SCOPE = "oauth2_provider:registration"
# The confirmation page names at most this many bearer tokens and clients, then says how many more.
NAMED_AT_MOST = 20


@dataclass(frozen=True)
class RotationCounts:
    """What a rotation cuts off: the confirmation page shows it before anything happens, the result page after."""

    bearer_tokens: int  # active (unrevoked, unexpired)
    access_tokens: int  # unexpired, of a user: what clients call /mcp with
    registration_tokens: int  # unexpired RFC 7592 registration tokens: revoked too, not access to /mcp
    refresh_tokens: int  # unrevoked
    grants: int  # unexpired authorization codes
    clients: int  # OAuth clients holding any of the above but registration tokens
    sessions: int  # unexpired admin sessions but the caller's


@dataclass(frozen=True)
class CutOff:
    """Who a rotation cuts off, by name, for the confirmation page (at most NAMED_AT_MOST of each)."""

    counts: RotationCounts
    bearer_tokens: list[str] = field(default_factory=list)  # "laptop (sst_abcd…, owner admin)"
    clients: list[str] = field(default_factory=list)

    @property
    def more_bearer_tokens(self) -> int:
        return self.counts.bearer_tokens - len(self.bearer_tokens)

    @property
    def more_clients(self) -> int:
        return self.counts.clients - len(self.clients)


@dataclass(frozen=True)
class RotationResult:
    counts: RotationCounts
    new_token: BearerToken
    new_secret: str  # shown once, never stored


def _live_access_tokens() -> QuerySet[AccessToken]:
    return AccessToken.objects.filter(expires__gt=timezone.now())


def _user_access_tokens() -> QuerySet[AccessToken]:
    return _live_access_tokens().filter(user__isnull=False)


def _live_refresh_tokens() -> QuerySet[RefreshToken]:
    return RefreshToken.objects.filter(revoked__isnull=True)


def _live_grants() -> QuerySet[Grant]:
    return Grant.objects.filter(expires__gt=timezone.now())


def _clients_cut_off() -> QuerySet[Application]:
    """Clients that hold a credential to /mcp (an access token of a user, a refresh token or a pending code)."""
    ids = set(_user_access_tokens().filter(application__isnull=False).values_list("application_id", flat=True))
    ids.update(_live_refresh_tokens().values_list("application_id", flat=True))
    ids.update(_live_grants().values_list("application_id", flat=True))
    return Application.objects.filter(pk__in=ids).order_by("name", "pk")


def _other_sessions(keep_session_key: str | None) -> QuerySet[Session]:
    return Session.objects.exclude(session_key=keep_session_key or "")


def _count(*, keep_bearer: bool, keep_session_key: str | None) -> RotationCounts:
    return RotationCounts(
        bearer_tokens=0 if keep_bearer else BearerToken.objects.active().count(),
        access_tokens=_user_access_tokens().count(),
        registration_tokens=_live_access_tokens().filter(user__isnull=True, scope=REGISTRATION_SCOPE).count(),
        refresh_tokens=_live_refresh_tokens().count(),
        grants=_live_grants().count(),
        clients=_clients_cut_off().count(),
        sessions=_other_sessions(keep_session_key).filter(expire_date__gt=timezone.now()).count(),
    )


def bearer_label(token: BearerToken) -> str:
    return f"{token.name} ({token.prefix}…, owner {token.user.get_username()})"


def preview(*, keep_bearer: bool = False, keep_session_key: str | None = None) -> CutOff:
    """What a rotation would cut off now, counted as the rotation counts it, with the first names of each."""
    counts = _count(keep_bearer=keep_bearer, keep_session_key=keep_session_key)
    tokens = [] if keep_bearer else list(BearerToken.objects.active().select_related("user")[:NAMED_AT_MOST])
    clients = list(_clients_cut_off()[:NAMED_AT_MOST])
    return CutOff(
        counts=counts,
        bearer_tokens=[bearer_label(token) for token in tokens],
        clients=[application_label(client.name, client.client_id) for client in clients],
    )


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def describe(counts: RotationCounts) -> str:
    """The one sentence the result page and `rotate_tokens` say."""
    registration = (
        f", and {_plural(counts.registration_tokens, 'client registration token')}"
        if counts.registration_tokens
        else ""
    )
    return (
        f"Revoked {_plural(counts.bearer_tokens, 'bearer token')}, "
        f"{_plural(counts.access_tokens, 'OAuth access token')}, {_plural(counts.refresh_tokens, 'refresh token')} "
        f"and {_plural(counts.grants, 'pending authorization code')} of {_plural(counts.clients, 'OAuth client')}"
        f"{registration}; signed out {_plural(counts.sessions, 'other admin session')}."
    )


def unique_token_name(base: str) -> str:
    """`base`, or `base (2)`, `base (3)`…: the first name no unrevoked token has."""
    taken = set(
        BearerToken.objects.filter(revoked_at__isnull=True)
        .filter(Q(name=base) | Q(name__startswith=f"{base} ("))
        .values_list("name", flat=True)
    )
    name, number = base, 1
    while name in taken:
        number += 1
        name = f"{base} ({number})"
    return name


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
        # Counted first, in the same transaction, by the queries the confirmation page used.
        counts = _count(keep_bearer=keep_bearer, keep_session_key=keep_session_key)
        revoke_everything_of(Application.objects.all())
        # Tokens of no application (introspection cache rows) cannot exist here, but leave nothing behind.
        AccessToken.objects.all().delete()
        if not keep_bearer:
            # Expired ones too: an expiry can be edited in the admin, a revocation cannot be undone.
            BearerToken.objects.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        _other_sessions(keep_session_key).delete()
        name = unique_token_name(f"rotation {timezone.localtime():%Y-%m-%d %H:%M:%S}")
        token, secret = issue_token(new_owner, name, by=by)
        event(
            "credentials.rotated",
            by,
            **asdict(counts),
            stop_background=stop_background,
            kept_bearer_tokens=keep_bearer,
            new_token_id=token.pk,
            new_token_name=token.name,
            new_token_prefix=token.prefix,
            new_token_owner=new_owner.get_username(),
        )
        # By prefix: every OAuth (and bearer) credential that exists now. The new token is untouched: only calls
        # and processes started before this moment are affected.
        prefixes = [f"{KIND_OAUTH}:"] + ([] if keep_bearer else [f"{KIND_BEARER}:"])
        announce([], prefixes=prefixes, reason=Revocation.REASON_ROTATION, by=by, stop_background=stop_background)
    return RotationResult(counts=counts, new_token=token, new_secret=secret)
