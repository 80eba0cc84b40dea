from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from oauth.clients import prune_unused_clients
from oauth.tokens import shell_actor


class Command(BaseCommand):
    help = (
        "Remove self-registered OAuth clients (dynamic registration or metadata document) that never obtained a "
        "token within a week of registering. Expired tokens are removed by django-oauth-toolkit's `cleartokens`."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--days", type=int, default=7, help="how old an unused client must be (default: 7)")
        parser.add_argument("--dry-run", action="store_true", help="only say what would be removed")

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            removed = prune_unused_clients(
                timedelta(days=max(options["days"], 0)), shell_actor(), dry_run=options["dry_run"]
            )
        verb = "Would remove" if options["dry_run"] else "Removed"
        self.stdout.write(f"{verb} {len(removed)} unused client(s){': ' if removed else '.'}{', '.join(removed)}")
