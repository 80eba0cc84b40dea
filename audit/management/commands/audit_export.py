"""Export tool calls from the audit log as JSON Lines or CSV, streamed in chunks."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import QuerySet

from audit.export import CSV_HEADER, call_queryset, csv_line, export_rows, filter_calls, jsonl_line
from audit.filters import EXIT_CODE_NONZERO, OUTCOME_VALUES, RANGES, SEARCH_PARAM, InvalidFilter
from audit.models import AuditRecord

FORMATS: dict[str, Callable[[dict[str, Any]], str]] = {"jsonl": jsonl_line, "csv": csv_line}


# option -> the list's parameter (audit.filters): the command filters exactly as the admin's list and its exports.
OPTION_PARAMS = {
    "tool": "tool",
    "outcome": "outcome",
    "exit_code": "exit_code",
    "user": "user",
    "credential": "credential",
    "credential_kind": "credential_kind",
    "credential_name": "credential_name",
    "session": "session",
    "range": "range",
    "since": "since",
    "until": "until",
    "search": SEARCH_PARAM,
}


def option_name(parameter: str) -> str:
    option = next((name for name, param in OPTION_PARAMS.items() if param == parameter), parameter)
    return "--" + option.replace("_", "-")


def calls(options: dict[str, Any]) -> QuerySet[AuditRecord]:
    """The calls the filter options select, as the call list with the same parameters shows them."""
    params: dict[str, list[str]] = {}
    for option, parameter in OPTION_PARAMS.items():
        given = options.get(option)
        if given:
            params[parameter] = given if isinstance(given, list) else [given]
    try:
        return filter_calls(call_queryset(), params)
    except InvalidFilter as error:
        raise CommandError(f"{option_name(error.parameter)}: {error.message}") from None


def write_lines(write: Callable[[str], object], fmt: str, queryset: QuerySet[AuditRecord]) -> int:
    line = FORMATS[fmt]
    if fmt == "csv":
        write(CSV_HEADER)
    count = 0
    for row in export_rows(queryset):  # .iterator(chunk_size=...): never all rows in memory
        write(line(row))
        count += 1
    return count


@contextlib.contextmanager
def private_file(path: Path) -> Iterator[TextIO]:
    """A file only its owner can read (0600), written beside `path` and renamed over it once complete."""
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mkstemp creates it 0600
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8", newline="") as out:
            yield out
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


class Command(BaseCommand):
    help = (
        "Export tool calls from the audit log, one per line, started and finished data together: JSON Lines (the "
        "tool under 'tool') or CSV (a header row; cells a spreadsheet would run as formulas are neutralised). "
        "Writes to standard output, or with --output to a file readable by its owner only (0600). The filters are "
        "those of the admin's call list (the same names, --outcome failed included)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--format", required=True, choices=sorted(FORMATS), help="jsonl or csv")
        parser.add_argument(
            "--since", metavar="YYYY-MM-DD", help="calls started on or after this day (the server's time zone, UTC)"
        )
        parser.add_argument(
            "--until",
            metavar="YYYY-MM-DD",
            help="calls started on or before this day (the server's time zone), inclusive",
        )
        parser.add_argument("--range", choices=sorted(RANGES), help="calls of today, yesterday, the past 7 or 30 days")
        for option, what in (
            ("tool", "the tool"),
            ("outcome", f"the outcome ({', '.join(OUTCOME_VALUES)}; failed is every outcome but ok and pending)"),
            ("exit-code", f"the exit code (a whole number, or {EXIT_CODE_NONZERO} for every code but 0)"),
            ("user", "the user"),
            ("credential", "the credential, written kind:id (bearer:3)"),
            ("credential-kind", "the credential kind (bearer, oauth)"),
            ("credential-name", "the credential's name as the calls recorded it (an OAuth client's label)"),
            ("session", "the MCP session id"),
        ):
            parser.add_argument(
                f"--{option}", action="append", metavar="VALUE", help=f"only calls of {what}; repeat for several"
            )
        parser.add_argument("--search", metavar="WORDS", help="only calls with these words in the arguments or result")
        parser.add_argument(
            "--output", metavar="PATH", help="write this file (replaced if it exists) instead of stdout"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        queryset = calls(options)
        fmt = options["format"]
        if options["output"]:
            path = Path(options["output"])
            if not path.parent.is_dir():
                raise CommandError(f"no such directory: {path.parent}")
            with private_file(path) as out:
                count = write_lines(out.write, fmt, queryset)
            where = str(path)
        else:
            count = write_lines(self.stdout.write, fmt, queryset)
            where = "standard output"
        since, until = options["since"], options["until"]
        span = f" started {since or 'any time'} to {until or 'now'}" if since or until else ""
        self.stderr.write(f"Exported {count} calls{span} as {fmt} to {where}.")
