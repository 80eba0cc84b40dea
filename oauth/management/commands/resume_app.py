from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from oauth.management.app_choice import choose_app, choose_user
from oauth.suspension import resume_app
from oauth.tokens import shell_actor


class Command(BaseCommand):
    help = (
        "Lift a connected app's suspension (by client id) for every user, or the one for a user (--user): the two "
        "are apart, lifting one leaves the other. Re-running changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("client", help="the app's client id (or its id in the admin)")
        parser.add_argument("--user", help="lift its suspension for this user (default: the one for every user)")

    def handle(self, *args: Any, **options: Any) -> None:
        application, user = choose_app(options["client"]), choose_user(options["user"])
        whom = f"for {user.get_username()}" if user is not None else "for every user"
        name = application.name or application.client_id
        if resume_app(application, user, shell_actor()):
            self.stdout.write(f"Resumed connected app {name!r} {whom}.")
        else:
            self.stdout.write(f"Connected app {name!r} was not suspended {whom}.")
