"""Suspending a credential and resuming it: a bearer token, or a connected app for every user or for one of them.

While suspended, every request at /mcp with the credential is refused (403) saying it is suspended by an
administrator (oauth.credentials reads the suspension in the query that finds the token), and nothing is revoked or
deleted: resuming makes the same token work again, in the same MCP session. A suspended app gets no new tokens
either: the token endpoint refuses its refresh tokens and codes with `invalid_grant` (oauth.policy), and the consent
page does not offer it for approval (oauth/views/consent.py); both work again once it is resumed. Suspending cancels
the credential's running tool calls through the revocation machinery (a Revocation row of reason `suspension`,
oauth.revocation), which revokes nothing; its background processes are stopped only if the admin asks (they keep
running otherwise, as a suspension is meant to be undone). Each suspension and resumption is recorded in the audit
log.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone
from oauth2_provider.models import Application

from audit.log import Actor, event
from oauth.credentials import app_key_prefix, application_label, bearer_key, oauth_key
from oauth.models import AppSuspension, BearerToken, Revocation
from oauth.revocation import announce
from oauth.tokens import token_detail


def suspend_token(token: BearerToken, by: Actor | None, *, stop_background: bool = False) -> bool:
    """Suspend an unrevoked token; False if it was suspended (or revoked) already."""
    with transaction.atomic():
        if not BearerToken.objects.filter(pk=token.pk, revoked_at__isnull=True, suspended_at__isnull=True).update(
            suspended_at=timezone.now()
        ):
            return False
        event("token.suspended", by, **token_detail(token), stop_background=stop_background)
        announce([bearer_key(token.pk)], reason=Revocation.REASON_SUSPENSION, by=by, stop_background=stop_background)
    return True


def resume_token(token: BearerToken, by: Actor | None) -> bool:
    """Resume a suspended token; False if it was not suspended."""
    with transaction.atomic():
        if not BearerToken.objects.filter(pk=token.pk, suspended_at__isnull=False).update(suspended_at=None):
            return False
        event("token.resumed", by, **token_detail(token))
    return True


def app_detail(application: Application, user: AbstractBaseUser | None) -> dict[str, Any]:
    """What the audit records of an app's suspension say: the app, and whose use ("" for every user's)."""
    return {
        "client_id": application.client_id,
        "client": application_label(application.name, application.client_id),
        "owner": user.get_username() if user is not None else "",
    }


def suspend_app(
    application: Application, user: AbstractBaseUser | None, by: Actor | None, *, stop_background: bool = False
) -> bool:
    """Suspend a connected app for `user`, or for every user (None); False if it was suspended so already."""
    with transaction.atomic():
        try:
            with transaction.atomic():  # a savepoint: the same suspension made at the same moment ends here
                _, made = AppSuspension.objects.get_or_create(
                    application=application, user_id=user.pk if user is not None else None,
                    defaults={"username": by.username if by is not None else ""},
                )  # fmt: skip
        except IntegrityError:
            return False
        if not made:
            return False
        event("oauth.client_suspended", by, **app_detail(application, user), stop_background=stop_background)
        keys = [oauth_key(application.pk, user.pk)] if user is not None else []
        prefixes = [] if user is not None else [app_key_prefix(application.pk)]
        announce(keys, prefixes=prefixes, reason=Revocation.REASON_SUSPENSION, by=by, stop_background=stop_background)
    return True


def resume_app(application: Application, user: AbstractBaseUser | None, by: Actor | None) -> bool:
    """Lift the suspension of a connected app for `user`, or the one for every user (None); False if there was none.
    A suspension for every user and one for a user are apart: lifting one leaves the other."""
    with transaction.atomic():
        rows = AppSuspension.objects.filter(application=application)
        deleted, _ = (rows.filter(user_id=user.pk) if user is not None else rows.filter(user__isnull=True)).delete()
        if not deleted:
            return False
        event("oauth.client_resumed", by, **app_detail(application, user))
    return True


def suspension_of(application: Application, user_id: int | None) -> AppSuspension | None:
    """What keeps `application` out for this user: its suspension for every user, else the user's own; None if it
    is suspended for neither. The token endpoint and the consent page ask (oauth.policy, oauth/views/consent.py)."""
    rows = AppSuspension.objects.filter(application=application).filter(Q(user__isnull=True) | Q(user_id=user_id))
    return rows.order_by(F("user_id").asc(nulls_first=True)).first()


def suspended_users(application: Application) -> tuple[AppSuspension | None, dict[int, AppSuspension]]:
    """The app's suspension for every user (or None), and its suspensions for one user each, by user id."""
    every, each = None, {}
    for row in AppSuspension.objects.filter(application=application):
        if row.user_id is None:
            every = row
        else:
            each[row.user_id] = row
    return every, each
