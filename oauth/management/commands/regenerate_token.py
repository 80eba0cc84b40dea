from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from oauth.management.token_choice import choose_token
from oauth.tokens import NotRegenerable, regenerate_token, shell_actor


class Command(BaseCommand):
    help = (
        "Give one bearer token (by id, name or visible prefix) a new secret: a new token with the same name, owner, "
        "scope, confinement profile and expiry, printed once, alone on the last line; the old secret is revoked at "
        "once and its running tool calls cancelled. Its background processes keep running unless --stop-background. "
        "A name or prefix that more than one unrevoked token has is refused: pass the id."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("token", help="a token's id, name or prefix (as shown in the admin)")
        parser.add_argument(
            "--stop-background", action="store_true", help="also stop the background processes the old secret started"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        key = options["token"]
        token = choose_token(key, "regenerate_token", "regenerate", "regenerated")
        if token is None:
            raise CommandError(f"the token matching {key!r} was revoked: create a new one (create_token NAME)")
        try:
            old, new, secret = regenerate_token(token.pk, shell_actor(), stop_background=options["stop_background"])
        except NotRegenerable as refused:
            raise CommandError(str(refused)) from None
        expiry = f", expires {new.expires_at:%Y-%m-%d %H:%M} UTC" if new.expires_at else ""
        suspended = "; it is suspended, as the old one was (resume it in the admin)" if new.suspended_at else ""
        self.stderr.write(
            f"Regenerated token {new.name!r} for {new.user.get_username()}, scope {new.scope}{expiry}: id {new.pk}, "
            f"{new.prefix}…; the old secret ({old.prefix}…, id {old.pk}) is revoked{suspended}."
        )
        self.stderr.write("It is shown once; only its hash is stored.")
        self.stdout.write(secret)
