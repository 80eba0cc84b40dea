from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q
from django.utils import timezone

from oauth.models import BearerToken
from oauth.tokens import revoke_tokens, shell_actor


def candidate_line(token: BearerToken) -> str:
    created = timezone.localtime(token.created_at).strftime("%Y-%m-%d %H:%M:%S %Z")
    return f"  id {token.pk}: {token.name!r}, {token.prefix}…, owner {token.user.get_username()}, created {created}"


class Command(BaseCommand):
    help = (
        "Revoke one bearer token by id, name or visible prefix. Agents using it are refused from their next request; "
        "its running tool calls are cancelled and its background processes stopped. A name or prefix that more than "
        "one unrevoked token has is refused: pass the id."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("token", help="a token's id, name or prefix (as shown in the admin)")

    def handle(self, *args: Any, **options: Any) -> None:
        key = options["token"]
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
                f"{len(chosen)} tokens match {key!r}; nothing was revoked. Pass the id of the one to revoke "
                f"(revoke_token ID):\n{lines}"
            )
        if not chosen:
            self.stdout.write(f"The token matching {key!r} was revoked already.")
            return
        [token] = chosen
        revoke_tokens(BearerToken.objects.filter(pk=token.pk), shell_actor())
        self.stdout.write(f"Revoked 1 token matching {key!r}: id {token.pk}, {token}.")
