"""Remove old audit records, leaving a checkpoint the chain continues from, and record the prune itself."""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection, transaction
from django.db.models import Count, Max, Min
from django.utils import timezone as django_timezone

from audit.anchor import anchor_chain_head, verify_anchored
from audit.log import Actor, chain_head, event, lock_head
from audit.models import AuditRecord, ChainCheckpoint
from audit.recordings import names_up_to, remove


@dataclass(frozen=True)
class Cut:
    """The records a prune removes: every record up to `last_id`, a prefix of the chain."""

    count: int
    first_id: int
    last_id: int
    oldest: datetime
    newest: datetime
    kept_older: int  # records created before the date that come after a newer one (clock steps): kept


def parse_day(value: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise CommandError(f"--before must be a date written YYYY-MM-DD, not {value!r}") from None


def find_cut(before: datetime) -> Cut | None:
    """The longest run of records, from the oldest, all created before `before`, never reaching the newest record.

    The chain can only lose a prefix, so a record created before the date but after a newer one stays.
    """
    _, head_id = chain_head()
    newest_id = AuditRecord.objects.aggregate(newest=Max("id"))["newest"]
    if newest_id is None:
        return None
    first_kept = AuditRecord.objects.filter(created_at__gte=before).aggregate(first=Min("id"))["first"]
    # The newest record stays whatever the date: it is what the chain head names.
    limit = min(first_kept or newest_id, newest_id, head_id or newest_id) - 1
    pruned = AuditRecord.objects.filter(id__lte=limit)
    stats = pruned.aggregate(
        count=Count("id"), first=Min("id"), last=Max("id"), oldest=Min("created_at"), newest=Max("created_at")
    )
    if not stats["count"]:
        return None
    kept_older = AuditRecord.objects.filter(id__gt=stats["last"], created_at__lt=before).count()
    return Cut(stats["count"], stats["first"], stats["last"], stats["oldest"], stats["newest"], kept_older)


def prune(cut: Cut, before: datetime, by: str) -> ChainCheckpoint:
    """Delete the records of `cut`, leave a checkpoint and record the prune, all in one transaction."""
    with transaction.atomic():
        lock_head()  # writers wait until the prune is done
        last_mac = AuditRecord.objects.filter(id=cut.last_id).values_list("mac", flat=True).first()
        if last_mac is None:
            raise CommandError(f"record {cut.last_id} vanished while pruning; nothing was removed")
        deleted = AuditRecord.objects.filter(id__lte=cut.last_id).delete()[0]
        if deleted != cut.count:
            raise CommandError(f"expected to remove {cut.count} records but found {deleted}; nothing was removed")
        checkpoint = ChainCheckpoint.objects.create(
            pruned_before=before, last_pruned_id=cut.last_id, last_pruned_mac=last_mac, records_pruned=cut.count
        )
        event(
            "audit.pruned",
            Actor(username=by, credential_kind="shell"),
            count=cut.count,
            before=before.date().isoformat(),
            first_id=cut.first_id,
            last_id=cut.last_id,
            by=by,
        )
    return checkpoint


class Command(BaseCommand):
    help = (
        "Remove audit records created before a date (UTC midnight), started and finished records alike, in one "
        "transaction, and the recordings of the calls whose finished records go. A checkpoint keeps the rest verifiable by audit_verify, and the prune is itself recorded as "
        "an 'audit.pruned' event. The newest record is never removed, nor anything from a chain that does not verify. "
        "Without --yes, only shows what it would remove."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--before", required=True, metavar="YYYY-MM-DD", help="remove records created before this day"
        )
        parser.add_argument("--yes", action="store_true", help="really remove them (default: a dry run)")
        parser.add_argument(
            "--allow-broken",
            action="store_true",
            help="prune even if the chain does not verify (the evidence goes too)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        day = parse_day(options["before"])
        if day > django_timezone.now().date():
            raise CommandError(f"--before {day} is in the future; it would remove records not yet written")
        before = datetime.combine(day, time(), tzinfo=UTC)
        cut = find_cut(before)
        if cut is None:
            self.stdout.write(f"Nothing to prune: no record before {day} (the newest record always stays).")
            return
        summary = (
            f"{cut.count} records (ids {cut.first_id} to {cut.last_id}, created "
            f"{cut.oldest:%Y-%m-%d %H:%M} to {cut.newest:%Y-%m-%d %H:%M} UTC)"
        )
        if cut.kept_older:
            self.stderr.write(f"{cut.kept_older} records created before {day} come after a newer record and stay.")
        if not options["yes"]:
            self.stdout.write(f"Dry run: would remove {summary}. Nothing was removed; add --yes to prune.")
            return
        self._check_chain(options["allow_broken"])
        user = getpass.getuser()
        recordings = names_up_to(cut.last_id)
        checkpoint = prune(cut, before, user)
        removed = remove(recordings)  # after the commit: a prune that failed keeps them all
        self._truncate_wal()
        try:
            # The anchor of the new head: audit_verify then knows the records before it went by a prune.
            anchor_chain_head()
        except OSError as error:
            self.stderr.write(f"Warning: could not anchor the chain head after the prune ({error}).")
        self.stdout.write(
            f"Pruned {summary} and {removed} recordings of their calls; the chain now starts after record "
            f"{checkpoint.last_pruned_id} (checkpoint kept)."
        )

    def _truncate_wal(self) -> None:
        """On SQLite, give back the WAL the prune filled (its size counts towards SANDSTORM_AUDIT_MAX_BYTES)."""
        if connection.vendor != "sqlite":
            return
        try:
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                busy = cursor.fetchone()[0]
        except DatabaseError as error:  # e.g. inside a transaction: the WAL stays as it is, reused by SQLite
            busy = str(error)
        if busy:
            self.stderr.write("The database's WAL could not be truncated now (readers are busy); SQLite reuses it.")

    def _check_chain(self, allow_broken: bool) -> None:
        """Pruning a broken chain destroys the evidence of tampering: refuse unless told otherwise."""
        result, anchored = verify_anchored()
        if result.ok and (anchored is None or anchored.ok):
            return
        if result.ok:
            assert anchored is not None
            message = f"the audit chain does not verify ({anchored.message})"
        else:
            message = f"the audit chain does not verify (record {result.first_bad_id}: {result.problem})"
        if not allow_broken:
            raise CommandError(
                f"{message}; nothing was removed. Keep a copy, then pass --allow-broken to prune anyway."
            )
        self.stderr.write(f"Warning: {message}; pruning anyway (--allow-broken).")
