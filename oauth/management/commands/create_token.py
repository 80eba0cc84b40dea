from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from oauth.confinement import PROFILES, choice_label
from oauth.models import CONFINEMENT_INSTALLATION, SCOPE_ALL, SCOPE_READ
from oauth.tokens import NameTaken, issue_token, shell_actor


class Command(BaseCommand):
    help = "Create a bearer token for /mcp. The token is printed once, alone on the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="what the token is for, e.g. 'claude-code laptop'")
        parser.add_argument("--user", default="admin", help="the user the agent acts as (default: admin)")
        parser.add_argument("--scope", choices=[SCOPE_ALL, SCOPE_READ], default=SCOPE_ALL)
        parser.add_argument("--expires-days", type=int, default=None, help="expire after N days (default: never)")
        parser.add_argument(
            "--confinement",
            choices=PROFILES,
            default=CONFINEMENT_INSTALLATION,
            help="what the agent's commands may reach (full scope only): workspace (kernel-confined to the workspace) "
            "or host (the agent user's full reach); default: the installation's, SANDSTORM_CONFINEMENT",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["user"]).first()
        if user is None:
            raise CommandError(f"no user named {options['user']!r}")
        days = options["expires_days"]
        if days is not None and days < 1:
            raise CommandError("--expires-days must be at least 1")
        confinement = options["confinement"]
        if confinement and options["scope"] != SCOPE_ALL:
            raise CommandError("--confinement is for full-scope tokens: read-only calls always run in the read sandbox")
        try:
            token, raw = issue_token(
                user, options["name"], scope=options["scope"], expires_days=days, by=shell_actor(),
                confinement=confinement,
            )  # fmt: skip
        except NameTaken as taken:
            raise CommandError(str(taken)) from None
        expiry = f", expires {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else ""
        confined = f", confinement {choice_label(token.confinement)}" if token.scope == SCOPE_ALL else ""
        self.stderr.write(
            f"Created token {token.name!r} ({token.prefix}…) for {user.get_username()}, scope {token.scope}"
            f"{confined}{expiry}."
        )
        self.stderr.write("It is shown once; only its hash is stored.")
        self.stdout.write(raw)
