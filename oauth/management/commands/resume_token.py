from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from oauth.management.token_choice import choose_token
from oauth.suspension import resume_token
from oauth.tokens import shell_actor


class Command(BaseCommand):
    help = (
        "Resume one suspended bearer token by id, name or visible prefix: it works again from its next request. "
        "Resuming a token that is not suspended changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("token", help="a token's id, name or prefix (as shown in the admin)")

    def handle(self, *args: Any, **options: Any) -> None:
        key = options["token"]
        token = choose_token(key, "resume_token", "resume", "resumed")
        if token is None:
            raise CommandError(f"the token matching {key!r} is revoked: it cannot be resumed")
        if resume_token(token, shell_actor()):
            self.stdout.write(f"Resumed token id {token.pk}, {token}: it works again.")
        else:
            self.stdout.write(f"Token id {token.pk}, {token}, was not suspended.")
