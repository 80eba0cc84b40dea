"""Check the audit log's hash chain from the genesis (or the last prune checkpoint) to the chain head."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from audit.anchor import verify_anchored
from audit.models import ChainCheckpoint
from audit.recordings import damaged_recordings


class Command(BaseCommand):
    help = (
        "Verify the audit log: recompute every record's keyed mac, check that each record chains from the one "
        "before it, that the chain head names the newest record and that the chain reaches the newest head the server "
        "anchored outside the database (<state dir>/audit_anchors), and that every call's recording matches the "
        "SHA-256 its record keeps. Exits 0 with a one-line summary if the chain is "
        "intact; otherwise exits 1 naming the first bad record, or how many records are missing after the last "
        "anchor. Read-only; safe to run at any time."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        began = time.monotonic()
        try:
            result, anchored = verify_anchored()
        except DatabaseError as error:  # e.g. a value SQLite cannot read as JSON text, written straight into the file
            raise CommandError(f"FAILED: the audit log could not be read ({error}).", returncode=1) from error
        elapsed = time.monotonic() - began
        if not result.ok:
            raise CommandError(
                f"FAILED: record {result.first_bad_id}: {result.problem}. "
                f"{result.checked} records before it verified; the chain is broken from record {result.first_bad_id}.",
                returncode=1,
            )
        if anchored is not None and not anchored.ok:
            raise CommandError(f"FAILED: {anchored.message}.", returncode=1)
        damaged = damaged_recordings()
        if damaged:
            for line in damaged:
                self.stderr.write(f"FAILED: {line}")
            raise CommandError(
                f"FAILED: {len(damaged)} recording(s) do not match their records (the chain itself is intact).",
                returncode=1,
            )
        head = f"record {result.last_id}" if result.checked else "none, the log is empty"
        self.stdout.write(f"OK: {result.checked} records checked, chain intact (head: {head})")
        checkpoint = ChainCheckpoint.objects.order_by("-last_pruned_id").first()
        if checkpoint is not None and options["verbosity"] >= 1:
            self.stderr.write(
                f"The chain starts after record {checkpoint.last_pruned_id}, from the checkpoint left by the prune of "
                f"{checkpoint.created_at:%Y-%m-%d %H:%M} UTC (records before {checkpoint.pruned_before:%Y-%m-%d})."
            )
        if anchored is not None and options["verbosity"] >= 1:
            self.stderr.write(anchored.message)
        if options["verbosity"] >= 2:
            self.stderr.write(f"Took {elapsed:.1f} s.")
