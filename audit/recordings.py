"""Recordings: what a call's commands printed, whole, in order and with their timing, kept beside the audit log.

One gzip file of JSON lines per call, `<RECORDINGS_DIR>/<YYYY-MM-DD>/<call id>.jsonl.gz`, in the server's state dir
(0700): the agent's processes run as another user, or, in development, are kept out of it by the kernel's sandbox.
The first line is a header ({"version": 1, "call_id", "started": seconds since the epoch, "tool", "pty"}), each
other line an event [seconds since the start, code, text]: "o" stdout, "e" stderr, "i" input typed through
terminal_input, "m" a note of ours (such as how much output was left out at the per-call cap). Each write is
flushed, so a recording can be read while it is made (the console's Live view after a reload).

A file is created at the first event; a call that printed nothing has none. Closing it gives the description its
finished audit record keeps (`Recording.close`): the file's SHA-256 among it, so the hash chain covers the
recording, and `damaged` finds a recording changed, cut short or missing. Past RECORDINGS_MAX_BYTES, new calls are
left unrecorded and say so; a call is never refused or delayed for its recording.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import re
import shutil
import time
import zlib
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.db.models import Q

logger = logging.getLogger(__name__)

VERSION = 1
CALL_ID = re.compile(r"[0-9a-f]{8,32}")
NAME = re.compile(r"\d{4}-\d{2}-\d{2}/[0-9a-f]{8,32}\.jsonl\.gz")
Event = tuple[float, str, str]
CODES = frozenset("oeim")
SIZE_REFRESH_SECONDS = 60.0
JOB_ENDED = "background.ended"  # the event that keeps a background command's recording (mcpserver/job_recordings.py)
LEFT_OUT = "bytes of output left out here"  # the note at the per-call cap (executor relay.py, jobhost.py)
BUDGET_FULL = "the recordings' disk budget (SANDSTORM_RECORDINGS_MAX_BYTES) is full"


class _Usage:
    """The recordings' size on disk: measured now and then (other server processes write too), counted between."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Measure again at the next look (the directory changed, or is another one)."""
        self.bytes = 0
        self._measured_at = float("-inf")

    def current(self) -> int:
        if time.monotonic() - self._measured_at > SIZE_REFRESH_SECONDS:
            self.bytes = directory_bytes(root())
            self._measured_at = time.monotonic()
        return self.bytes

    def full(self) -> bool:
        budget = settings.RECORDINGS_MAX_BYTES
        return bool(budget) and self.current() >= budget


USAGE = _Usage()


def state() -> dict[str, Any]:
    """The recordings' size on disk against their budget (0: none), for /health and the console's home."""
    budget = settings.RECORDINGS_MAX_BYTES
    used = USAGE.current()
    return {"bytes": used, "budget": budget, "full": bool(budget) and used >= budget}


# SANDSTORM_RECORDING_MAX_BYTES=0 turns recording off (privacy, or a host whose disk matters): no call gets a
# Recording, and a call that printed something says in its finished record why it has none.
RECORDING_OFF = "recording is off (SANDSTORM_RECORDING_MAX_BYTES=0)"


def enabled() -> bool:
    """Whether calls are recorded at all (`RECORDING_OFF` when not)."""
    return settings.RECORDING_MAX_BYTES > 0


def root() -> Path:
    return Path(settings.RECORDINGS_DIR)


def directory_bytes(directory: Path) -> int:
    total = 0
    for top, _dirs, files in os.walk(directory):
        for name in files:
            try:
                total += os.stat(os.path.join(top, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


class Recording:
    """The recording of one call, written as its events come (`write`), described for its record by `close`."""

    def __init__(self, call_id: str, tool: str, started: float | None = None, pty: bool = False) -> None:
        if not CALL_ID.fullmatch(call_id):
            raise ValueError(f"not a call id: {call_id!r}")
        self.call_id, self.tool, self.pty = call_id, tool, pty
        self.started = time.time() if started is None else started
        self.name = f"{datetime.fromtimestamp(self.started, UTC):%Y-%m-%d}/{call_id}.jsonl.gz"
        self._file: IO[bytes] | None = None
        self._gzip: gzip.GzipFile | None = None
        self.events = 0
        self.output_bytes = 0
        self.unrecorded = ""  # why not (or not all of it), if so
        self.cut = False

    @property
    def path(self) -> Path:
        return root() / self.name

    def write(self, events: Iterable[Event]) -> None:
        """Append events; the first creates the file. Never raises: a recording that cannot be written says why."""
        events = [event for event in events if event[1] in CODES and event[2]]
        lines = [_line(event) for event in events]
        if not lines or (self.unrecorded and self._gzip is None):
            return
        if self._gzip is None and not self._open():
            return
        assert self._gzip is not None
        if USAGE.full():
            self._stop(BUDGET_FULL)
            return
        data = b"".join(lines)
        try:
            before = self._file.tell() if self._file is not None else 0
            self._gzip.write(data)
            self._gzip.flush(zlib.Z_SYNC_FLUSH)  # readable as far as it goes while the call runs
            USAGE.bytes += (self._file.tell() if self._file is not None else 0) - before
        except OSError as error:
            self._stop(f"the recording could not be written ({error.strerror})")
            return
        self.events += len(lines)
        self.output_bytes += sum(len(event[2].encode()) for event in events)
        self.cut = self.cut or any(event[1] == "m" and LEFT_OUT in event[2] for event in events)

    def _open(self) -> bool:
        if USAGE.full():
            self.unrecorded = BUDGET_FULL
            return False
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as error:
            self.unrecorded = f"the recording could not be created ({error.strerror})"
            logger.error("cannot create the recording %s: %s", self.path, error)
            return False
        self._file = os.fdopen(descriptor, "wb")
        self._gzip = gzip.GzipFile(fileobj=self._file, mode="wb", compresslevel=1, mtime=0)
        header = {"version": VERSION, "call_id": self.call_id, "started": self.started, "tool": self.tool}
        self._gzip.write(json.dumps({**header, "pty": self.pty}).encode() + b"\n")
        return True

    def _stop(self, why: str) -> None:
        """Stop writing: what is in the file stays, ended with a note."""
        if not self.unrecorded:
            self.unrecorded, self.cut = why, True
            logger.warning("recording %s stopped: %s", self.name, why)

    def close(self) -> dict[str, Any] | None:
        """End the file; what the finished record keeps of it (None: the call printed nothing)."""
        if self._gzip is None or self._file is None:
            return {"unrecorded": self.unrecorded} if self.unrecorded else None
        try:
            if self.unrecorded:
                self._gzip.write(_line((round(time.time() - self.started, 3), "m", f"[{self.unrecorded}]")))
            self._gzip.close()
            self._file.close()
        except OSError as error:
            logger.error("cannot finish the recording %s: %s", self.path, error)
            self.unrecorded = self.unrecorded or f"the recording could not be finished ({error.strerror})"
        self._gzip = self._file = None
        described: dict[str, Any] = {
            "name": self.name,
            "sha256": file_sha256(self.path),
            "size": self.path.stat().st_size,
            "events": self.events,
            "output_bytes": self.output_bytes,
            "cut": self.cut,
        }
        if self.unrecorded:
            described["unrecorded"] = self.unrecorded
        return described


def _line(event: Event) -> bytes:
    return json.dumps([event[0], event[1], event[2]], ensure_ascii=False).encode() + b"\n"


def live_text(events: Iterable[Event]) -> str:
    """Events as one text, as the console's Live view shows a call's output: our notes on lines of their own."""
    return "".join(text if code != "m" else f"\n{text}\n" for _at, code, text in events if code != "i")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def path_of(name: str) -> Path:
    """The file of a recording named in a record; ValueError for a name that is not one of ours."""
    if not NAME.fullmatch(name):
        raise ValueError(f"not a recording name: {name!r}")
    return root() / name


def read(path: Path) -> tuple[dict[str, Any], list[Event]]:
    """The header and events of a recording, as far as it is written (one still being written, too)."""
    header: dict[str, Any] = {}
    events: list[Event] = []
    with gzip.open(path, "rb") as stream:
        try:
            for number, line in enumerate(stream):
                if not line.endswith(b"\n"):
                    break  # the last line is still being written
                value = json.loads(line)
                if number == 0 and isinstance(value, dict):
                    header = value
                elif isinstance(value, list) and len(value) == 3 and value[1] in CODES:
                    events.append((float(value[0]), str(value[1]), str(value[2])))
        except EOFError:
            pass  # a file still open for writing ends without gzip's trailer
    return header, events


def damaged(detail: dict[str, Any] | None) -> str | None:
    """What is wrong with the recording a finished record describes (missing, changed or cut short), or None."""
    described = (detail or {}).get("recording")
    if not isinstance(described, dict) or "sha256" not in described:
        return None
    try:
        path = path_of(str(described.get("name", "")))
    except ValueError:
        return "its recording's name is not a recording's"
    if not path.is_file():
        return f"its recording {described['name']} is missing"
    if file_sha256(path) != described["sha256"]:
        return f"its recording {described['name']} does not match its SHA-256 (changed or cut short)"
    return None


def damaged_recordings() -> list[str]:
    """Each record whose recording is missing, changed or cut short (a call's finished record, or the event that
    keeps a background command's), as a line naming the record."""
    from audit.models import AuditRecord

    problems = []
    records = AuditRecord.objects.filter(_naming_recordings()).order_by("id")
    for record_id, call_id, detail in records.values_list("id", "call_id", "detail").iterator(chunk_size=2000):
        problem = damaged(detail)
        if problem is not None:
            problems.append(f"record {record_id} (call {call_id}): {problem}")
    return problems


def _naming_recordings() -> Q:
    """The records that may name a recording: calls' finished records, and `background.ended` events."""
    from audit.models import KIND_EVENT, KIND_FINISHED

    return (Q(kind=KIND_FINISHED) | Q(kind=KIND_EVENT, event=JOB_ENDED)) & Q(detail__has_key="recording")


def names_up_to(last_id: int) -> list[str]:
    """The recordings the finished records up to `last_id` name (what a prune of those records removes)."""
    from audit.models import AuditRecord

    records = AuditRecord.objects.filter(_naming_recordings(), id__lte=last_id)
    names = []
    for detail in records.values_list("detail", flat=True).iterator(chunk_size=2000):
        name = (detail or {}).get("recording", {}).get("name")
        if isinstance(name, str) and NAME.fullmatch(name):
            names.append(name)
    return names


def remove(names: Iterable[str]) -> int:
    """Delete these recordings (and the day directories left empty); how many files went."""
    removed, days = 0, set()
    for name in names:
        path = path_of(name)
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
        days.add(path.parent)
    for day in days:
        try:
            day.rmdir()
        except OSError:
            pass  # other calls of that day are kept
    USAGE.bytes = directory_bytes(root())
    return removed


def copy_into(names: Iterable[str], directory: Path) -> tuple[int, int]:
    """Copy these recordings into `directory` (a backup's; 0700), skipping those already there (a recording never
    changes once its call has ended), and remove what it holds that is not among them (pruned since). How many were
    copied, and how many were there in all."""
    wanted = {name for name in names if NAME.fullmatch(name)}
    directory.mkdir(mode=0o700, exist_ok=True)
    copied = 0
    for name in sorted(wanted):
        source, target = path_of(name), directory / name
        if not source.is_file() or (target.is_file() and target.stat().st_size == source.stat().st_size):
            continue
        target.parent.mkdir(mode=0o700, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        shutil.copyfile(source, partial)
        os.chmod(partial, 0o600)
        os.replace(partial, target)
        copied += 1
    for top, _dirs, files in os.walk(directory, topdown=False):
        for file_name in files:
            if os.path.relpath(os.path.join(top, file_name), directory) not in wanted:
                os.unlink(os.path.join(top, file_name))
        if top != str(directory) and not os.listdir(top):
            os.rmdir(top)
    return copied, len(wanted)
