from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from oauth.rotation import describe, rotate_all
from oauth.tokens import shell_actor


class Command(BaseCommand):
    help = (
        "Rotate all credentials, as the admin's 'Rotate all credentials' page does: revoke every OAuth access and "
        "refresh token and pending code and every bearer token, sign out every admin session, cancel the running "
        "tool calls of those credentials and stop their background processes, then create one new bearer token "
        "(printed alone on the last line)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", default="admin", help="who the new bearer token acts as (default: admin)")
        parser.add_argument("--keep-bearer", action="store_true", help="leave bearer tokens valid (OAuth only)")
        parser.add_argument(
            "--keep-background", action="store_true", help="do not stop background processes of revoked credentials"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["user"]).first()
        if user is None:
            raise CommandError(f"no user named {options['user']!r}")
        result = rotate_all(
            by=shell_actor(),
            new_owner=user,
            stop_background=not options["keep_background"],
            keep_bearer=options["keep_bearer"],
        )
        token = result.new_token
        self.stderr.write(
            f"Rotated. {describe(result.counts)} New bearer token {token.name!r} ({token.prefix}…) for "
            f"{user.get_username()}, shown once:"
        )
        self.stdout.write(result.new_secret)
