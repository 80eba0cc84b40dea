from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q

from oauth.models import BearerToken
from oauth.tokens import revoke_tokens, shell_actor


class Command(BaseCommand):
    help = (
        "Revoke bearer tokens by id, name or visible prefix. Agents using them are refused from their next request; "
        "their running tool calls are cancelled and their background processes stopped."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("token", help="a token's id, name or prefix (as shown in the admin)")

    def handle(self, *args: Any, **options: Any) -> None:
        key = options["token"]
        match = Q(name=key) | Q(prefix=key)
        if key.isdigit():
            match |= Q(pk=int(key))
        tokens = BearerToken.objects.filter(match)
        if not tokens.exists():
            raise CommandError(f"no token matches {key!r}")
        count = revoke_tokens(tokens, shell_actor())
        self.stdout.write(f"Revoked {count} token(s) matching {key!r}.")
