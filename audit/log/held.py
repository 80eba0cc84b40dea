"""Finished records the database refused (a lock held past the busy timeout, a full disk): never dropped.

A tool that ran has had its effect, so its finished record (outcome, result excerpt, hash) must reach the log. One
the database refuses is held: kept in memory and appended at once, one JSON line, to a spill file in the state dir
(so a process killed meanwhile loses nothing), then written again every few seconds, in order, until the database
takes it; the spill file is emptied once nothing is held. The next start writes what a spill file still holds
before anything else (`replay_spill`), so those calls are not taken for interrupted ones.

The held records are written together with a security event, `audit.records_held` (how many, why, for how long,
and whether the next start wrote them), so the log itself says they were late and why. Meanwhile `/health` answers
503 with the reason, and the server log gets one line when the first record is held and
one line with a count while records stay held, never a traceback per call. A disk too full for the spill file too
gets room from a ballast file kept beside it, deleted at that moment. A record that the process stops holding,
having reached neither the database nor the spill file, is lost: that is logged with its call id and the reason.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError, IntegrityError
from django.utils import timezone

from audit.log.records import event_record
from audit.log.refusals import reason_of
from audit.log.writer import current
from audit.models import KIND_FINISHED, AuditRecord

logger = logging.getLogger(__name__)
SPILL_NAME = "audit_spill.jsonl"  # worker 1's (the only one without SANDSTORM_WORKERS); worker N's: spill_name(N)
BALLAST_NAME = "audit_spill.ballast"
BALLAST_BYTES = 4 * 1024 * 1024
RETRY_SECONDS = (1.0, 2.0, 5.0)  # between attempts: the first ones quickly, then every 5 s
REPORT_SECONDS = 30.0  # while records stay held: one log line with the count this often
# The columns a held record is spilled with: all but its place in the chain, which it gets when it is written.
_SPILLED = tuple(
    field.attname for field in AuditRecord._meta.concrete_fields if field.attname not in ("id", "prev_mac", "mac")
)


HELD_BECAUSE = "held_because"  # beside a spilled record's fields: why the database refused it


def _to_json(record: AuditRecord, reason: str) -> str:
    values: dict[str, Any] = {name: getattr(record, name) for name in _SPILLED}
    values["created_at"] = record.created_at.isoformat()
    values[HELD_BECAUSE] = reason
    return json.dumps(values, ensure_ascii=True, separators=(",", ":"))


def _from_json(line: str) -> tuple[AuditRecord, str]:
    values = json.loads(line)
    reason = str(values.pop(HELD_BECAUSE, ""))
    values["created_at"] = datetime.fromisoformat(values["created_at"])
    unknown = set(values) - set(_SPILLED)
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    return AuditRecord(**values), reason


_WORKER_SPILL = re.compile(r"audit_spill\.worker-(\d+)\.jsonl")


def spill_name(worker: int) -> str:
    """The spill file of worker `worker`: one per worker, so one never replays or removes another's."""
    return SPILL_NAME if worker == 1 else f"audit_spill.worker-{worker}.jsonl"


def held_event(count: int, reason: str, held_seconds: float, *, replayed: bool) -> AuditRecord:
    """The security event written with held records, in their transaction: the log says they were held, and why."""
    return event_record(
        "audit.records_held", count=count, reason=reason, held_seconds=round(held_seconds), replayed=replayed
    )


class HeldRecords:
    """This process's held finished records; see the module's docstring."""

    def __init__(self, state_dir: Path, worker: int = 1, ballast_bytes: int = BALLAST_BYTES) -> None:
        self._spill = state_dir / spill_name(worker)
        self._ballast = state_dir / BALLAST_NAME
        self._ballast_bytes = ballast_bytes
        self._lock = threading.Lock()
        self._held: list[AuditRecord] = []
        self._unspilled: set[int] = set()  # id() of held records the spill file could not take
        self._error = ""  # the database's latest refusal
        self._first_error = ""  # the refusal that began the hold, for its event
        self._since = 0.0
        self._reported = 0.0
        self._retrying: asyncio.Task[None] | None = None

    # --- state, for /health -------------------------------------------------------------------------------------

    def problem(self) -> str | None:
        """Why /health answers 503, while records are held."""
        with self._lock:
            if not self._held:
                return None
            return f"{len(self._held)} finished audit record(s) wait to be written: {self._error}"

    @property
    def count(self) -> int:
        return len(self._held)

    # --- holding and writing again ------------------------------------------------------------------------------

    def hold(self, record: AuditRecord, error: BaseException) -> None:
        """Keep `record`, which the database refused with `error`, until it is written; never raises."""
        reason = reason_of(error)
        with self._lock:
            first = not self._held
            self._held.append(record)
            self._error = reason
            if first:
                self._since = self._reported = time.monotonic()
                self._first_error = reason
        if not self._spill_one(record, reason):
            with self._lock:
                self._unspilled.add(id(record))
        if first:
            logger.error(
                "audit: the database refused the finished record of %s (call %s): %s; it is held and written again "
                "until the database takes it (/health answers 503 meanwhile)",
                record.tool,
                record.call_id,
                reason,
            )
        self._start_retrying()

    def _start_retrying(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no event loop here (a management command): the next start's replay writes the spill file
        if self._retrying is None or self._retrying.done():
            self._retrying = loop.create_task(self._retry())

    async def _retry(self) -> None:
        attempt = 0
        while self._held:
            await asyncio.sleep(RETRY_SECONDS[min(attempt, len(RETRY_SECONDS) - 1)])
            attempt += 1
            await self.write_held()
            self._report()

    async def write_held(self) -> bool:
        """Try once to write every held record, in order; True if none is held any more."""
        batch = self._with_event()
        if not batch:
            return True
        try:
            await current().awrite_together(lambda: batch)
        except DatabaseError as error:
            return self._refused(error)
        return self._written(batch[:-1])

    def write_held_now(self) -> bool:
        """write_held for a caller without an event loop (the shut-down); True if none is held any more."""
        batch = self._with_event()
        if not batch:
            return True
        try:
            current().write_all(batch)
        except DatabaseError as error:
            return self._refused(error)
        return self._written(batch[:-1])

    def _with_event(self) -> list[AuditRecord]:
        """The held records and, last, the event that says they were held; empty if none is held."""
        with self._lock:
            batch, reason, since = list(self._held), self._first_error, self._since
        if not batch:
            return []
        return [*batch, held_event(len(batch), reason, time.monotonic() - since, replayed=False)]

    def _refused(self, error: BaseException) -> bool:
        with self._lock:
            self._error = reason_of(error)
        return False

    def _written(self, batch: Sequence[AuditRecord]) -> bool:
        with self._lock:
            written = {id(record) for record in batch}
            self._held = [record for record in self._held if id(record) not in written]
            self._unspilled -= written
            empty = not self._held
            held_for = time.monotonic() - self._since
        logger.warning("audit: %d held finished record(s) written after %.0f s", len(batch), held_for)
        if empty:
            self._empty_spill()
        return empty

    def _report(self) -> None:
        now = time.monotonic()
        with self._lock:
            if not self._held or now - self._reported < REPORT_SECONDS:
                return
            self._reported = now
            count, error = len(self._held), self._error
        logger.error("audit: %d finished record(s) still held, not yet written: %s", count, error)

    def cancel_retries(self) -> None:
        """At shut-down, on the event loop: no more retries by the loop (stop() makes the last attempt)."""
        if self._retrying is not None:
            self._retrying.cancel()

    def stop(self) -> None:
        """At shut-down: write what is held if the database takes it now; what it does not take stays in the spill
        file for the next start, and what is in neither is lost, which is logged."""
        if self.write_held_now():
            return
        with self._lock:
            unspilled = [record for record in self._held if id(record) in self._unspilled]
            error = self._error
        lost = [record for record in unspilled if not self._spill_one(record, error)]
        if len(lost) < len(self._held):
            logger.error(
                "audit: %d finished record(s) held at shut-down are in %s; the next start writes them",
                len(self._held) - len(lost),
                self._spill,
            )
        for record in lost:
            logger.error(
                "audit: LOST the finished record of %s (call %s, outcome %s): the database refused it (%s) and "
                "the spill file could not take it",
                record.tool,
                record.call_id,
                record.outcome,
                error,
            )

    # --- the spill file -----------------------------------------------------------------------------------------

    def prepare(self) -> None:
        """At start: the ballast that gives a full disk room for the spill file."""
        if self._ballast.exists():
            return
        try:
            with self._ballast.open("wb") as ballast:
                os.posix_fallocate(ballast.fileno(), 0, self._ballast_bytes)
        except OSError as error:
            logger.warning("audit: could not make the spill file's ballast %s: %s", self._ballast, error)
            self._ballast.unlink(missing_ok=True)

    def _spill_one(self, record: AuditRecord, reason: str) -> bool:
        line = (_to_json(record, reason) + "\n").encode()
        for attempt in range(2):
            try:
                self._append(line)
                return True
            except OSError as error:
                if attempt == 0 and self._ballast.exists():
                    self._ballast.unlink(missing_ok=True)  # the room it kept is for this
                    continue
                logger.error("audit: the spill file %s cannot take a held record: %s", self._spill, error)
        return False

    def _append(self, line: bytes) -> None:
        descriptor = os.open(self._spill, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            written = os.write(descriptor, line)
            if written != len(line):
                raise OSError(f"short write to the spill file ({written} of {len(line)} bytes)")
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

    def _empty_spill(self) -> None:
        try:
            self._spill.unlink(missing_ok=True)
        except OSError as error:
            logger.error("audit: could not remove the written spill file %s: %s", self._spill, error)
        self.prepare()


def replay_spill(state_dir: Path, worker: int = 1, workers: int = 1) -> int:
    """At start, before interrupted calls are looked for: write the finished records this worker's spill file holds
    (those whose call has no finished record yet), then remove it; worker 1 also takes the files of workers beyond
    `workers` (there are fewer now). Returns how many were written; raises DatabaseError if the database refuses them
    (the file is kept)."""
    names = [spill_name(worker)]
    if worker == 1:
        others = (_WORKER_SPILL.fullmatch(path.name) for path in state_dir.iterdir())
        names += sorted(match.group(0) for match in others if match and int(match.group(1)) > workers)
    return sum(_replay(state_dir / name) for name in names)


def _replay(spill: Path) -> int:
    if not spill.exists():
        return 0
    records, reasons = [], []
    for number, line in enumerate(spill.read_text(encoding="ascii", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record, reason = _from_json(line)
        except (ValueError, TypeError) as error:  # a line cut short by a crash mid-write: the rest is whole
            logger.error("audit: skipped line %d of %s, which is not a whole record: %s", number, spill, error)
            continue
        records.append(record)
        reasons.append(reason)
    finished = set(
        AuditRecord.objects.filter(
            kind=KIND_FINISHED, started_id__in=[record.started_id for record in records]
        ).values_list("started_id", flat=True)
    )
    pending = [record for record in records if record.started_id not in finished]
    if pending:
        held_for = (timezone.now() - min(record.created_at for record in pending)).total_seconds()
        event = held_event(len(pending), reasons[0] if reasons else "", held_for, replayed=True)
        try:
            current().write_all([*pending, event])
        except IntegrityError:  # finished meanwhile by another server process replaying the same file
            pending = []
    spill.unlink()
    if pending:
        logger.warning("audit: wrote %d finished record(s) held in %s before the last stop", len(pending), spill)
    return len(pending)


_current: HeldRecords | None = None


def held() -> HeldRecords:
    """This process's held records, in the state dir the settings name."""
    global _current
    if _current is None:
        _current = HeldRecords(Path(settings.STATE_DIR), settings.WORKER)
    return _current


def reset() -> None:
    """Forget this process's held records (tests)."""
    global _current
    _current = None
