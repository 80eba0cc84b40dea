"""`manage.py policy_export [FILE]`: the stored command policy as a JSON document, disabled rules included, which
`policy_load` reads back as it was (`policy_export | policy_load -` changes nothing but the version)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from mcpserver.policy_source import document_text, policy_document


class Command(BaseCommand):
    help = (
        "Write the stored command policy (settings and every rule in order, disabled ones marked "
        '"enabled": false) as JSON to standard output or to FILE; policy_load reads it back. An existing FILE is '
        "not overwritten without --force."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", nargs="?", default="-", help="where to write it (default, or -: standard output)")
        parser.add_argument("--force", action="store_true", help="overwrite FILE if it exists")

    def handle(self, *args: Any, **options: Any) -> None:
        document = policy_document()
        text = document_text(document)
        target = options["file"]
        if target == "-":
            self.stdout.write(text, ending="")
            where = "standard output"
        else:
            path = Path(target)
            try:
                # "x" creates the file or fails, so a file that appears meanwhile is not overwritten either.
                with path.open("w" if options["force"] else "x", encoding="utf-8") as out:
                    out.write(text)
            except FileExistsError:
                raise CommandError(f"{path} exists; nothing was written (--force overwrites it)") from None
            except OSError as error:
                raise CommandError(f"cannot write {path}: {error.strerror or error}") from None
            where = str(path)
        count = len(document["rules"])
        # On standard error, so that the JSON on standard output can be piped into policy_load.
        self.stderr.write(
            f"Exported {count} rule{'s' if count != 1 else ''} (default: {document['default']}) to {where}."
        )
