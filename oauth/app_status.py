"""A connected app's status and when its access ends, for the list and its page (oauth.admin_clients), from its live
tokens prefetched for a page of the list at once; and the scopes it holds for one user, for the consent page."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Prefetch, QuerySet
from oauth2_provider.models import AccessToken, Application, RefreshToken

from oauth.console_lists import moment
from oauth.lifetimes import refresh_token_seconds


def renewable_refresh_tokens(now: datetime) -> QuerySet[RefreshToken]:
    """The refresh tokens that can still renew an access: unrevoked, of a user, their idle lifetime not over."""
    renewable = RefreshToken.objects.filter(user__isnull=False, revoked__isnull=True, access_token__isnull=False)
    idle = refresh_token_seconds()
    if idle is not None:
        renewable = renewable.filter(access_token__expires__gt=now - timedelta(seconds=idle))
    return renewable


def live_tokens_prefetched(now: datetime) -> list[Prefetch[Any]]:
    """An app's live access tokens (`live_access`) and the refresh tokens that can still renew them
    (`live_refresh`), with their users, for a page of the list."""
    renewable = renewable_refresh_tokens(now)
    return [
        Prefetch(
            "accesstoken_set",
            AccessToken.objects.filter(user__isnull=False, expires__gt=now).select_related("user"),
            to_attr="live_access",
        ),
        Prefetch("refreshtoken_set", renewable.select_related("user", "access_token"), to_attr="live_refresh"),
    ]


def live_scopes(application: Application, user_id: int, now: datetime) -> set[str]:
    """The scopes an app holds for one user: those of its unexpired access tokens, and of the access its refresh
    tokens can still renew (the consent page shows a request for more as an upgrade)."""
    mine = {"application": application, "user_id": user_id}
    held = AccessToken.objects.filter(**mine, expires__gt=now).values_list("scope", flat=True)
    renewable = renewable_refresh_tokens(now).filter(**mine).values_list("access_token__scope", flat=True)
    return {name for scope in [*held, *renewable] for name in scope.split()}


def app_status(application: Application) -> str:
    """active (it may call, or renew its access), suspended (so, but an admin suspended it for every user), revoked
    (every refresh token of it revoked), expired (its access lapsed), or unused (it never got a token)."""
    if getattr(application, "live_access", None) or getattr(application, "live_refresh", None):
        return "suspended" if getattr(application, "suspended_for_everyone", False) else "active"
    if getattr(application, "has_revoked_refresh", False) and not getattr(application, "has_open_refresh", False):
        return "revoked"
    registration = getattr(application, "sandstorm_registration", None)
    if registration is not None and registration.last_token_at is None:
        return "unused"
    return "expired"


def access_ends(application: Application) -> str:
    """When its access ends unless it renews it: a renewable refresh token's idle lifetime after its access token's
    expiry, else its newest access token's expiry."""
    idle = refresh_token_seconds()
    renewable = getattr(application, "live_refresh", [])
    if renewable and idle is None:
        return "when revoked"
    ends = [token.expires for token in getattr(application, "live_access", [])]
    ends += [refresh.access_token.expires + timedelta(seconds=idle or 0) for refresh in renewable]
    return moment(max(ends, default=None))
