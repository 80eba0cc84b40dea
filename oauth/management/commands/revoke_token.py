from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from oauth.management.token_choice import choose_token
from oauth.models import BearerToken
from oauth.tokens import revoke_tokens, shell_actor


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
        token = choose_token(key, "revoke_token", "revoke", "revoked")
        if token is None:
            self.stdout.write(f"The token matching {key!r} was revoked already.")
            return
        revoke_tokens(BearerToken.objects.filter(pk=token.pk), shell_actor())
        self.stdout.write(f"Revoked 1 token matching {key!r}: id {token.pk}, {token}.")
