"""`manage.py backup PATH`: a consistent copy of the SQLite database, safe while the server runs, and the recordings
its records name, in PATH.recordings/ beside it."""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.recordings import copy_into

# All pages in one step: the step reads one snapshot (WAL readers never block the server's writers), while small
# steps would restart from the beginning each time another connection writes, which a busy server does constantly.
ALL_PAGES = -1


class Command(BaseCommand):
    help = (
        "Write a consistent copy of the SQLite database to PATH (mode 0600) with SQLite's online backup API, "
        "safe while the server runs, and the recordings of the calls it holds into PATH.recordings/ (new ones "
        "copied, pruned ones removed). Refuses to overwrite PATH unless --force. The copy holds the audit log; "
        "the state dir's secret_key and audit_key files are needed beside it to use and verify it, and "
        "PATH.recordings/ as its recordings/ directory."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", help="where to write the copy (a file; its directory must exist)")
        parser.add_argument("--force", action="store_true", help="replace PATH if it exists")

    def handle(self, *args: Any, **options: Any) -> None:
        source = sqlite_database()
        target = Path(options["path"]).expanduser().absolute()
        if target.exists() and not options["force"]:
            raise CommandError(f"{target} exists; pass --force to replace it")
        if not target.parent.is_dir():
            raise CommandError(f"the directory {target.parent} does not exist")
        if target.resolve() == source.resolve():
            raise CommandError("PATH is the live database itself")
        began = time.monotonic()
        pages = copy_database(source, target)
        size = target.stat().st_size
        copied, recorded = copy_into(recordings_named(target), recordings_beside(target))
        took = time.monotonic() - began
        self.stdout.write(
            f"Backed up {source} to {target}: {pages} pages, {size} bytes, and {recorded} recordings in "
            f"{recordings_beside(target)} ({copied} new), in {took:.1f}s."
        )


def sqlite_database(database: Mapping[str, Any] | None = None) -> Path:
    """The path of the configured SQLite database; any other engine is refused with what to use instead."""
    config: Mapping[str, Any] = settings.DATABASES["default"] if database is None else database
    if config["ENGINE"] != "django.db.backends.sqlite3":
        raise CommandError(
            "backup supports the SQLite database only; for PostgreSQL (DATABASE_URL) use pg_dump, "
            'e.g. pg_dump --format=custom --file=sandstorm.dump "$DATABASE_URL"'
        )
    path = Path(config["NAME"])
    if not path.exists():
        raise CommandError(f"the database {path} does not exist yet (run manage.py migrate first)")
    return path


def recordings_beside(target: Path) -> Path:
    return target.with_name(f"{target.name}.recordings")


def recordings_named(copy: Path) -> list[str]:
    """The recordings the records in the copy name (the copy's own: what a restore of it needs): calls' finished
    records, and the events that keep background commands' recordings."""
    connection = sqlite3.connect(f"{copy.as_uri()}?mode=ro", uri=True)
    try:
        rows = connection.execute(
            "SELECT json_extract(detail, '$.recording.name') FROM audit_auditrecord "
            "WHERE (kind = 'call.finished' OR (kind = 'event' AND event = 'background.ended')) "
            "AND json_extract(detail, '$.recording.name') IS NOT NULL"
        ).fetchall()
    except sqlite3.Error as error:
        raise CommandError(f"could not read the copy's recordings: {error}") from None
    finally:
        connection.close()
    return [str(name) for (name,) in rows]


def copy_database(source: Path, target: Path) -> int:
    """Copy `source` into a new 0600 file beside `target`, check it, then rename it over `target` atomically.

    The rename means a failed or interrupted backup never leaves a half-written file where the last good copy was.
    """
    fd, partial_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    os.close(fd)  # mkstemp creates it 0600; SQLite writes into it (an empty file is a valid empty database)
    partial = Path(partial_name)
    try:
        pages = _backup(source, partial)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return pages


def _backup(source: Path, partial: Path) -> int:
    # Read-only, so a backup can never change the live database; the busy timeout waits out the server's writers.
    reader = sqlite3.connect(f"{source.as_uri()}?mode=ro", uri=True, timeout=30)
    writer = sqlite3.connect(partial)
    try:
        reader.backup(writer, pages=ALL_PAGES)
        # The copy is a plain rollback-journal database: it needs no -wal/-shm files beside it.
        writer.execute("PRAGMA journal_mode=DELETE")
        verdict = writer.execute("PRAGMA quick_check").fetchone()[0]
        if verdict != "ok":
            raise CommandError(f"the copy failed SQLite's quick_check: {verdict}")
        return int(writer.execute("PRAGMA page_count").fetchone()[0])
    except sqlite3.Error as error:
        raise CommandError(f"backup failed: {error}") from None
    finally:
        writer.close()
        reader.close()
