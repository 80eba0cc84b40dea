"""Which bearer token a command's argument names, as `revoke_token` and `regenerate_token` read it: an id, else a
name or visible prefix; a name or prefix more than one unrevoked token has is refused, listing them, rather than
guessed."""

from __future__ import annotations

from django.core.management.base import CommandError
from django.db.models import Q
from django.utils import timezone

from oauth.models import BearerToken


def candidate_line(token: BearerToken) -> str:
    created = timezone.localtime(token.created_at).strftime("%Y-%m-%d %H:%M:%S %Z")
    return f"  id {token.pk}: {token.name!r}, {token.prefix}…, owner {token.user.get_username()}, created {created}"


def choose_token(key: str, command: str, do: str, done: str) -> BearerToken | None:
    """The one unrevoked token `key` names; None if the tokens it names are all revoked. CommandError if it names
    none, or more than one (saying nothing was `done`, and to `do` one with `command ID`)."""
    by_id = BearerToken.objects.filter(pk=int(key)) if key.isdigit() else BearerToken.objects.none()
    # An id names one token; a name or prefix may be shared, and is then refused rather than guessed.
    tokens = by_id if by_id.exists() else BearerToken.objects.filter(Q(name=key) | Q(prefix=key))
    if not tokens.exists():
        raise CommandError(f"no token matches {key!r}")
    # The active ones first: a shared name of which only one token still works means that one.
    unrevoked = tokens.filter(revoked_at__isnull=True).select_related("user").order_by("created_at")
    chosen = list(unrevoked.active()) or list(unrevoked)
    if len(chosen) > 1:
        lines = "\n".join(candidate_line(token) for token in chosen)
        raise CommandError(
            f"{len(chosen)} tokens match {key!r}; nothing was {done}. Pass the id of the one to {do} ({command} ID):"
            f"\n{lines}"
        )
    return chosen[0] if chosen else None
