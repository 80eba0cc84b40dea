from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from oauth.management.token_choice import choose_token
from oauth.suspension import suspend_token
from oauth.tokens import shell_actor


class Command(BaseCommand):
    help = (
        "Suspend one bearer token by id, name or visible prefix: its requests are refused (403, saying it is "
        "suspended by an administrator) until resume_token; its running tool calls are cancelled; nothing is revoked. "
        "Its background processes keep running unless --stop-background. Suspending a suspended token changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("token", help="a token's id, name or prefix (as shown in the admin)")
        parser.add_argument("--stop-background", action="store_true", help="also stop its background processes")

    def handle(self, *args: Any, **options: Any) -> None:
        key = options["token"]
        token = choose_token(key, "suspend_token", "suspend", "suspended")
        if token is None:
            raise CommandError(f"the token matching {key!r} is revoked: there is nothing to suspend")
        if suspend_token(token, shell_actor(), stop_background=options["stop_background"]):
            self.stdout.write(f"Suspended token id {token.pk}, {token}: refused until resume_token {token.pk}.")
        else:
            self.stdout.write(f"Token id {token.pk}, {token}, was suspended already.")
