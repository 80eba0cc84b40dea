"""Issuing, importing, revoking and regenerating bearer tokens: the one place that creates BearerToken rows."""

from __future__ import annotations

import getpass
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from audit.log import Actor, event
from oauth.confinement import checked, installation_default
from oauth.credentials import bearer_key
from oauth.models import CONFINEMENT_INSTALLATION, SCOPE_ALL, BearerToken, Revocation, hash_token, new_token_secret
from oauth.revocation import announce

BOOTSTRAP_NAME = "bootstrap"
NAME_LENGTH = BearerToken._meta.get_field("name").max_length or 100


class NotRegenerable(ValueError):
    """A token that cannot be given a new secret: revoked, or expired (its copy would be expired too)."""


class NameTaken(ValueError):
    """An unrevoked token already has this name (names are unique among unrevoked tokens)."""

    def __init__(self, holder: BearerToken) -> None:
        self.holder = holder
        super().__init__(name_taken_message(holder))


def name_taken_message(holder: BearerToken) -> str:
    """Why a name cannot be used, naming the token that holds it and what to do."""
    text = (
        f"The name {holder.name!r} is taken by token {holder.prefix}… (#{holder.pk}, of {holder.user.get_username()})"
    )
    if holder.status == "expired":
        return f"{text}, which expired but is not revoked: revoke it to free the name, or choose another."
    return f"{text}: choose another name."


def name_holder(name: str, *, exclude_pk: int | None = None) -> BearerToken | None:
    """The unrevoked token named `name` (expired ones included), if any."""
    tokens = BearerToken.objects.filter(name=name, revoked_at__isnull=True).select_related("user")
    if exclude_pk is not None:
        tokens = tokens.exclude(pk=exclude_pk)
    return tokens.first()


def free_name(base: str) -> str:
    """`base`, or the first of "base (2)", "base (3)"... that no unrevoked token holds."""
    if name_holder(base) is None:
        return base
    number = 2
    while True:
        suffix = f" ({number})"
        candidate = base[: NAME_LENGTH - len(suffix)] + suffix
        if name_holder(candidate) is None:
            return candidate
        number += 1


def token_detail(token: BearerToken) -> dict[str, Any]:
    return {
        "token_id": token.pk,
        "name": token.name,
        "prefix": token.prefix,
        "owner": token.user.get_username(),
        "scope": token.scope,
    }


def confinement_detail(token: BearerToken) -> dict[str, Any]:
    """A new token's confinement profile for its audit record; none for read-only tokens, which have no profile."""
    if SCOPE_ALL not in token.scope.split():
        return {}
    return {"confinement": token.confinement, "default": installation_default()}


def issue_token(
    user: User,
    name: str,
    *,
    scope: str = SCOPE_ALL,
    expires_days: int | None = None,
    by: Actor | None = None,
    confinement: str = CONFINEMENT_INSTALLATION,
) -> tuple[BearerToken, str]:
    """Create a token and return it with its secret, which is not stored and cannot be shown again.

    Raises NameTaken if an unrevoked token already has this name, ValueError for an unknown confinement profile."""
    raw = new_token_secret()
    token = BearerToken(name=name, user=user, scope=scope, confinement=checked(confinement))
    if expires_days is not None:
        token.expires_at = timezone.now() + timedelta(days=expires_days)
    token.set_secret(raw)
    save_new_token(token, by)
    return token, raw


def save_new_token(token: BearerToken, by: Actor | None) -> None:
    """Save a new token and record its creation in the audit log, in one transaction.

    Raises NameTaken if an unrevoked token already has its name (checked first, and by the database's constraint
    for a token saved at the same moment)."""
    with transaction.atomic():
        _insert(token)
        event("token.created", by, **token_detail(token), **confinement_detail(token))


def _insert(token: BearerToken) -> None:
    """Save a new token; NameTaken if an unrevoked token has its name (checked first, and by the database's
    constraint for a token saved at the same moment)."""
    holder = name_holder(token.name)
    if holder is not None:
        raise NameTaken(holder)
    try:
        with transaction.atomic():
            token.save()
    except IntegrityError:
        holder = name_holder(token.name)
        if holder is None:
            raise  # not the name: the same secret's hash, saved at the same moment
        raise NameTaken(holder) from None


def revoke_tokens(
    tokens: QuerySet[BearerToken],
    by: Actor | None,
    *,
    stop_background: bool = True,
    reason: str = Revocation.REASON_BEARER,
) -> int:
    """Revoke the active tokens among `tokens`, recording each and cancelling their running tool calls (and, unless
    `stop_background` is False, stopping their background processes). Returns how many were revoked."""
    with transaction.atomic():
        active = _mark_revoked(tokens)
        _record_revoked(active, by, reason=reason, stop_background=stop_background)
    return len(active)


def _mark_revoked(tokens: QuerySet[BearerToken]) -> list[BearerToken]:
    active = list(tokens.filter(revoked_at__isnull=True).select_related("user"))
    BearerToken.objects.filter(pk__in=[token.pk for token in active]).update(revoked_at=timezone.now())
    return active


def _record_revoked(active: list[BearerToken], by: Actor | None, *, reason: str, stop_background: bool) -> None:
    # After every row is written: whoever holds the audit chain's lock (taken by each event) takes no other row lock
    # after it, so two transactions never wait for each other in a circle (a deadlock on PostgreSQL).
    for token in active:
        event("token.revoked", by, **token_detail(token))
    keys = [bearer_key(token.pk) for token in active]
    announce(keys, reason=reason, by=by, stop_background=stop_background)


def regenerate_token(
    token_id: int, by: Actor | None, *, stop_background: bool = False
) -> tuple[BearerToken, BearerToken, str]:
    """Give a token a new secret: a new token with the same name, owner, scope, confinement profile, expiry and
    suspension, and the old one revoked at once, its running calls cancelled (its background processes stopped only
    if `stop_background`: a key rotation leaves the agent's work running). Returns (old, new, new secret).

    Raises NotRegenerable for a revoked or expired token, or one that does not exist."""
    raw = new_token_secret()
    with transaction.atomic():
        old = BearerToken.objects.select_for_update().filter(pk=token_id).select_related("user").first()
        if old is None or old.revoked_at is not None:
            raise NotRegenerable("The token was revoked already: create a new one instead.")
        if not old.is_active:
            raise NotRegenerable(f"Token “{old.name}” has expired: its copy would be expired too. Create a new one.")
        new = BearerToken(
            name=old.name, user=old.user, scope=old.scope, confinement=old.confinement, expires_at=old.expires_at,
            suspended_at=old.suspended_at,
        )  # fmt: skip
        new.set_secret(raw)
        revoked = _mark_revoked(BearerToken.objects.filter(pk=old.pk))
        _insert(new)  # the name is free: its holder was revoked above
        _record_revoked(revoked, by, reason=Revocation.REASON_REGENERATION, stop_background=stop_background)
        # The new token's creation record: what token.created would say, and which token it replaces.
        event(
            "token.regenerated",
            by,
            **token_detail(new),
            **confinement_detail(new),
            previous_token_id=old.pk,
            previous_prefix=old.prefix,
            stop_background=stop_background,
        )
    return old, new, raw


def shell_actor() -> Actor:
    """Who ran a management command: the OS user, as far as the audit log can tell."""
    return Actor(username=getpass.getuser(), credential_kind="shell")


def import_bootstrap_token(user: User, raw: str) -> bool:
    """Import SANDSTORM_MCP_TOKEN as the token named 'bootstrap' (or 'bootstrap (2)'... if an unrevoked token holds
    that name). True if a new row was made.

    Matching is by hash, so a revoked bootstrap token stays revoked while the variable still holds it.
    """
    if len(raw) < 16:
        raise ValueError("SANDSTORM_MCP_TOKEN must be at least 16 characters long")
    for _attempt in range(3):  # a name taken between free_name and the save: take the next one
        if BearerToken.objects.filter(token_hash=hash_token(raw)).exists():
            return False
        token = BearerToken(name=free_name(BOOTSTRAP_NAME), user=user, scope=SCOPE_ALL)
        token.set_secret(raw)
        try:
            save_new_token(token, shell_actor())
        except NameTaken:
            continue
        except IntegrityError:  # another process imported it at the same moment
            return False
        return True
    return False
