"""Export tool calls from the audit log as JSON Lines or CSV, streamed in chunks."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any, TextIO

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import QuerySet

from audit.export import CSV_HEADER, call_queryset, csv_line, export_rows, jsonl_line
from audit.models import AuditRecord

FORMATS: dict[str, Callable[[dict[str, Any]], str]] = {"jsonl": jsonl_line, "csv": csv_line}


def parse_day(value: str, option: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise CommandError(f"{option} must be a date written YYYY-MM-DD, not {value!r}") from None


def midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def calls(since: date | None, until: date | None) -> QuerySet[AuditRecord]:
    """Calls started on or after `since` and on or before `until` (whole UTC days)."""
    queryset = call_queryset()
    if since is not None:
        queryset = queryset.filter(created_at__gte=midnight(since))
    if until is not None:
        queryset = queryset.filter(created_at__lt=midnight(until + timedelta(days=1)))
    return queryset


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
        "Writes to standard output, or with --output to a file readable by its owner only (0600)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--format", required=True, choices=sorted(FORMATS), help="jsonl or csv")
        parser.add_argument("--since", metavar="YYYY-MM-DD", help="calls started on or after this day (UTC)")
        parser.add_argument(
            "--until", metavar="YYYY-MM-DD", help="calls started on or before this day (UTC), inclusive"
        )
        parser.add_argument(
            "--output", metavar="PATH", help="write this file (replaced if it exists) instead of stdout"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        since = parse_day(options["since"], "--since") if options["since"] else None
        until = parse_day(options["until"], "--until") if options["until"] else None
        if since and until and until < since:
            raise CommandError(f"--until {until} is before --since {since}")
        queryset = calls(since, until)
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
        span = f" started {since or 'any time'} to {until or 'now'}" if since or until else ""
        self.stderr.write(f"Exported {count} calls{span} as {fmt} to {where}.")
