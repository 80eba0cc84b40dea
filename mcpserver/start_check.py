"""The start-up check: a server does not start on a database that lost records, nor on a new one where one was.

`manage.py bootstrap` (so `make run` and the installer) and `manage.py serve` (production's ExecStart) run it
before anything of theirs opens the database. It finds, without changing anything:

- a database that is missing, empty or without tables while the state dir has history (an anchor file, backups):
  starting would create a new, empty one in its place;
- on SQLite, a write-ahead log whose replay would drop committed transactions (audit.sqlite_files reads it before
  SQLite does, since SQLite drops a damaged tail silently when it opens the database), a database file shorter than
  its header says, and what `PRAGMA quick_check` reports;
- a chain head behind the newest head anchored outside the database (audit.anchor), or an anchored record that is
  gone or has another mac: the newest records were lost, whatever lost them.

A loss stops the start with one line (`StartRefused`, exit status EXIT_REFUSED) that says what is wrong, where the
backups are, how to restore one and how to go on without what was lost. Going on (`--accept-audit-loss`,
SANDSTORM_ACCEPT_AUDIT_LOSS=1) keeps the damaged files as evidence, records the loss in the audit log as the
security event `audit.loss_accepted`, moves the old anchor file aside and anchors the new head.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError, CommandParser, OutputWrapper
from django.db import connection, transaction
from django.utils import timezone

from audit import sqlite_files
from audit.anchor import Anchor, AnchorFile, anchor_chain_head, read_anchors
from audit.log import chain_head, event
from audit.models import AuditRecord, ChainCheckpoint, ChainHead
from oauth.tokens import shell_actor

EXIT_REFUSED = 65  # sysexits.h's EX_DATAERR; the server's unit does not restart on it (RestartPreventExitStatus)
# quick_check reads every page: about 0.2 s per 100,000 records with a warm cache, 1 s cold. It always runs after a
# shut-down that was not clean (a WAL left behind); after a clean one, only on databases up to this size.
QUICK_CHECK_ALWAYS_BYTES = 256 * 1024**2
BACKUPS_DIR = "backups"  # in the state dir: where the installer's nightly backup goes

DATABASE_MISSING = "database_missing"
DATABASE_DAMAGED = "database_damaged"
WAL_DAMAGED = "wal_damaged"
RECORDS_MISSING = "records_missing"


@dataclass(frozen=True)
class Loss:
    kind: str  # one of the four above
    what: str  # what is wrong, in words
    anchored: Anchor | None = None  # the newest anchor: how far the chain had reached


class StartRefused(Exception):
    """The one line a refused start prints."""


Query = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]


def history(state_dir: Path, anchor_file: Path) -> list[str]:
    """What in the state dir says a database was here before: anchors (or anchor files moved aside) and backups."""
    anchors = [anchor_file, *sorted(anchor_file.parent.glob(f"{anchor_file.name}.*"))]
    found = [str(path) for path in anchors if path.is_file() and path.stat().st_size]
    backups = state_dir / BACKUPS_DIR
    if backups.is_dir() and any(backups.iterdir()):
        found.append(f"{backups}/")
    return found


def _missing(where: str, state: str) -> Loss | None:
    markers = history(Path(settings.STATE_DIR), Path(settings.AUDIT_ANCHOR_FILE))
    if not markers:
        return None  # a first start
    return Loss(
        DATABASE_MISSING,
        f"the database {where} {state}, but this state dir has history ({', '.join(markers)}): starting would "
        "create a new, empty one in its place",
    )


def check_database() -> Loss | None:
    """What was lost, or None. Reads only; on SQLite, before Django's connection is opened."""
    # The anchors first: every head anchored by now was committed by now, so an intact chain reaches it.
    anchors = read_anchors(Path(settings.AUDIT_ANCHOR_FILE), settings.AUDIT_HMAC_KEY)
    if connection.vendor == "sqlite":
        loss = _check_sqlite(Path(connection.settings_dict["NAME"]), anchors)
    else:
        with connection.cursor() as cursor:

            def query(sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
                cursor.execute(sql, params)
                return list(cursor.fetchall())

            tables = set(connection.introspection.table_names(cursor))
            loss = _against_anchor(anchors, query, tables, f"{connection.settings_dict['NAME']!r} on PostgreSQL")
    if loss is not None and loss.anchored is None and anchors is not None:
        loss = replace(loss, anchored=anchors.newest)  # how far the chain reached, for the record of the loss
    return loss


def _check_sqlite(database: Path, anchors: AnchorFile | None) -> Loss | None:
    size = database.stat().st_size if database.exists() else 0
    if not size:
        return _missing(str(database), "is missing" if not database.exists() else "is empty (0 bytes)")
    # Another server process on this state dir has it open: its WAL is live, not a crash's leftover.
    shared = sqlite_files.in_use(database)
    left_wal = Path(f"{database}-wal").exists() and Path(f"{database}-wal").stat().st_size > 0
    if not shared:
        if problem := sqlite_files.wal_loss(database):
            return Loss(WAL_DAMAGED, problem)
        if not left_wal and (problem := sqlite_files.header_problem(database)):
            return Loss(DATABASE_DAMAGED, problem)
    try:
        with contextlib.closing(_open_read_only(database, immutable=not (shared or left_wal))) as reader:
            if not shared and (left_wal or size <= QUICK_CHECK_ALWAYS_BYTES):
                verdict = [row[0] for row in reader.execute("PRAGMA quick_check(3)")]
                if verdict != ["ok"]:
                    return Loss(
                        DATABASE_DAMAGED, f"the database {database} is damaged: quick_check says {'; '.join(verdict)}"
                    )

            def query(sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
                return reader.execute(sql.replace("%s", "?"), params).fetchall()

            tables = {row[0] for row in query("SELECT name FROM sqlite_master WHERE type = 'table'")}
            return _against_anchor(anchors, query, tables, str(database))
    except sqlite3.OperationalError:
        raise  # locked, or cannot be opened: not a loss, and the caller says so
    except sqlite3.DatabaseError as error:  # malformed, not a database
        return Loss(DATABASE_DAMAGED, f"the database {database} is damaged: SQLite cannot read it ({error})")


def _open_read_only(database: Path, immutable: bool) -> sqlite3.Connection:
    """A connection that cannot write, checkpoint or delete the WAL. Without a WAL nobody else has open, as
    immutable: then SQLite creates no -wal or -shm file either."""
    uri = f"{database.absolute().as_uri()}?mode=ro{'&immutable=1' if immutable else ''}"
    return sqlite3.connect(uri, uri=True, timeout=30)


def _against_anchor(anchors: AnchorFile | None, query: Query, tables: set[str], where: str) -> Loss | None:
    """Whether the chain still reaches the newest anchored head (audit.anchor.check_anchor, without the walk)."""
    if "django_migrations" not in tables:
        return _missing(where, "has no tables")
    newest = anchors.newest if anchors is not None else None
    if newest is None or newest.record_id == 0:
        return None
    audit_tables = {model._meta.db_table for model in (ChainHead, ChainCheckpoint, AuditRecord)}
    rows = (
        query(f"SELECT last_record_id FROM {ChainHead._meta.db_table} WHERE id = 1", ())
        if audit_tables <= tables
        else []
    )
    head_id = int(rows[0][0]) if rows else 0
    anchor_file = Path(settings.AUDIT_ANCHOR_FILE)
    anchored = f"record {newest.record_id} was anchored at {newest.at} (line {newest.line} of {anchor_file})"
    if newest.record_id > head_id:
        return Loss(
            RECORDS_MISSING,
            f"the audit log has lost its newest records: the chain ends at record {head_id}, but {anchored}",
            newest,
        )
    pruned = query(f"SELECT MAX(last_pruned_id) FROM {ChainCheckpoint._meta.db_table}", ())
    if newest.record_id <= int(pruned[0][0] or 0):
        return None  # pruned since it was anchored: audit_verify checks the prune's checkpoint
    found = query(f"SELECT mac FROM {AuditRecord._meta.db_table} WHERE id = %s", (newest.record_id,))
    if not found or found[0][0] != newest.mac:
        state = "is gone" if not found else "has another mac"
        return Loss(
            RECORDS_MISSING,
            f"the audit log has lost records: {anchored}, and that record {state} (newer records were lost and "
            "others written with their ids)",
            newest,
        )
    return None


def _backups_hint() -> str:
    backups = Path(settings.STATE_DIR) / BACKUPS_DIR
    copies = (
        sorted((path for path in backups.glob("*") if path.is_file()), key=lambda path: path.stat().st_mtime)
        if backups.is_dir()
        else []
    )
    if not copies:
        return f"no backup in {backups}"
    newest = copies[-1]
    taken = datetime.fromtimestamp(newest.stat().st_mtime, tz=UTC)
    return f"newest: {newest}, of {taken:%Y-%m-%d %H:%M} UTC"


def refusal(loss: Loss) -> str:
    """The line a refused start prints: what is wrong, where the backups are, how to restore, how to go on."""
    anchors = Path(settings.AUDIT_ANCHOR_FILE)
    if connection.vendor == "sqlite":
        database = connection.settings_dict["NAME"]
        restore = (
            f"To restore a copy made by manage.py backup ({_backups_hint()}): with the server stopped, remove "
            f"{database}-wal and {database}-shm, copy it to {database} and move {anchors} aside"
        )
    else:
        restore = f"To restore your newest pg_dump: load it into the database, then move {anchors} aside"
    if settings.EXECUTOR_SOCKET:  # installed: the operator's commands go through sandstorm-manage
        accept = "sudo sandstorm-manage bootstrap --accept-audit-loss, then start the service"
    else:
        accept = ".venv/bin/python manage.py run --accept-audit-loss (or SANDSTORM_ACCEPT_AUDIT_LOSS=1 make run)"
    return (
        f"sandstorm: not starting: {loss.what}. Nothing was changed. {restore} (docs/operations.md, Backups and "
        f"restore). To start with what is left instead, the loss recorded in the audit log: {accept}."
    )


def _kept(database: Path, stamp: str, move: bool) -> dict[str, str]:
    """Move (or copy) the database's files to `<name>.damaged-<stamp>` beside them; where each went."""
    kept = {}
    for suffix in ("", "-wal", "-shm") if move else ("-wal", "-shm"):
        source = Path(f"{database}{suffix}")
        if not source.exists():
            continue
        target = source.with_name(f"{database.name}.damaged-{stamp}{suffix}")
        if move:
            source.rename(target)
        else:
            shutil.copy2(source, target)
        kept[source.name] = str(target)
    return kept


def _skip_ids(last_lost: int) -> None:
    """Have new audit records take ids after `last_lost`, so none takes the id of a record that was lost."""
    table = AuditRecord._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(
                "UPDATE sqlite_sequence SET seq = %s WHERE name = %s AND seq < %s", [last_lost, table, last_lost]
            )
            cursor.execute(
                "INSERT INTO sqlite_sequence (name, seq) SELECT %s, %s "
                "WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = %s)",
                [table, last_lost, table],
            )
        else:
            cursor.execute(
                f"SELECT setval(pg_get_serial_sequence(%s, 'id'), GREATEST(%s, (SELECT COALESCE(MAX(id), 1) FROM {table})))",
                [table, last_lost],
            )


def _loss_detail(loss: Loss, head_id: int, kept: dict[str, str]) -> dict[str, Any]:
    """What the audit.loss_accepted event records: what was wrong, how far the chain had reached, where it goes on."""
    detail: dict[str, Any] = {"loss": loss.kind, "problem": loss.what, "chain_restarts_after": head_id, "kept": kept}
    if loss.anchored is not None:
        detail.update(
            anchored_record_id=loss.anchored.record_id, anchored_mac=loss.anchored.mac, anchored_at=loss.anchored.at
        )
        if loss.anchored.record_id > head_id:  # otherwise how many were lost is not known
            detail["records_missing"] = loss.anchored.record_id - head_id
    return detail


def accept_loss(loss: Loss) -> str:
    """Go on without what was lost: keep the damaged files, make the database usable (SQLite's replay of what is
    intact, or a new database), record the loss as a security event and anchor the new head in a new anchor file.
    Returns a line saying what was done."""
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    kept: dict[str, str] = {}
    if connection.vendor == "sqlite" and loss.kind in {DATABASE_DAMAGED, WAL_DAMAGED}:
        kept = _kept(Path(connection.settings_dict["NAME"]), stamp, move=loss.kind == DATABASE_DAMAGED)
    call_command("migrate", interactive=False, verbosity=0)  # a database moved aside or missing is made anew
    _, head_id = chain_head()
    if loss.anchored is not None and loss.anchored.record_id > head_id:
        _skip_ids(loss.anchored.record_id)
    detail = _loss_detail(loss, head_id, kept)
    anchors = Path(settings.AUDIT_ANCHOR_FILE)
    old_anchors = anchors.with_name(f"{anchors.name}.before-loss-{stamp}")
    if anchors.exists():
        detail["anchors_kept_as"] = str(old_anchors)
    record = event("audit.loss_accepted", shell_actor(), **detail)
    if anchors.exists():
        anchors.rename(old_anchors)  # the evidence of what the chain reached; audit_verify starts from the new one
    anchor_chain_head()
    said = [f"recorded as audit record {record.id} (audit.loss_accepted)", f"the chain goes on after record {head_id}"]
    if kept:
        said.append(f"damaged files kept as {', '.join(kept.values())}")
    if "anchors_kept_as" in detail:
        said.append(f"the old anchors are in {old_anchors}")
    return f"sandstorm: accepted the loss ({loss.what}): {'; '.join(said)}."


def check_at_start(accept: bool) -> str | None:
    """The start-up check: raises StartRefused with the line to print if something was lost, unless `accept`; then
    accepts the loss and returns the line saying so. None when nothing was lost."""
    loss = check_database()
    if loss is None:
        return None
    if not accept:
        raise StartRefused(refusal(loss))
    return accept_loss(loss)


def add_accept_argument(parser: CommandParser) -> None:
    parser.add_argument(
        "--accept-audit-loss",
        action="store_true",
        help="start even though the start-up check finds lost audit records or a damaged or missing database: keep "
        "the damaged files, record the loss in the audit log and anchor the chain anew (or SANDSTORM_ACCEPT_AUDIT_LOSS=1)",
    )


def run_before_start(accept: bool, stderr: OutputWrapper) -> None:
    """The check as a command runs it before it starts anything: a loss ends the process with the refusal line and
    EXIT_REFUSED, unless accepted (by the flag or SANDSTORM_ACCEPT_AUDIT_LOSS)."""
    try:
        accepted = check_at_start(accept or settings.ACCEPT_AUDIT_LOSS)
    except StartRefused as refused:
        stderr.write(str(refused))
        raise SystemExit(EXIT_REFUSED) from None
    except sqlite3.OperationalError as error:  # locked for longer than the busy timeout, or not openable
        raise CommandError(f"could not check the database before starting: {error}") from None
    if accepted:
        stderr.write(accepted)
