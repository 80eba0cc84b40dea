from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from oauth.management.app_choice import choose_app, choose_user
from oauth.suspension import suspend_app
from oauth.tokens import shell_actor


class Command(BaseCommand):
    help = (
        "Suspend a connected app (by client id) for every user, or for one (--user): its requests are refused (403, "
        "saying it is suspended by an administrator) until resume_app; its running tool calls are cancelled; nothing "
        "is revoked. Its background processes keep running unless --stop-background. Re-running changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("client", help="the app's client id (or its id in the admin)")
        parser.add_argument("--user", help="suspend it for this user only (default: every user)")
        parser.add_argument("--stop-background", action="store_true", help="also stop its background processes")

    def handle(self, *args: Any, **options: Any) -> None:
        application, user = choose_app(options["client"]), choose_user(options["user"])
        whom = f"for {user.get_username()}" if user is not None else "for every user"
        name = application.name or application.client_id
        if suspend_app(application, user, shell_actor(), stop_background=options["stop_background"]):
            self.stdout.write(f"Suspended connected app {name!r} {whom}: refused until resume_app.")
        else:
            self.stdout.write(f"Connected app {name!r} was suspended {whom} already.")
