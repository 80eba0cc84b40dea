"""A background job's recording as its host writes it (jobhost.Recorder): the events file beside its log, read back
a page at a time by the server, which keeps it with the audit log once the job is over.

Each line is an event [seconds since the start, code, text] ("o" stdout, "e" stderr, "i" input, "m" a note), and
the last, once the host is done, is {"end": true}. A command of the `host` profile could reach the file while the
job runs: what is not an event is skipped, never passed on as one.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from typing import Any

from mcpserver.executor.jobfiles import JobFiles

CODES = frozenset("oeim")
END = b'{"end": true}'
EVENTS_PAGE = 1024 * 1024  # bytes of the file one page reads


@dataclass
class EventsPage:
    events: list[list[Any]]
    next_offset: int
    end: bool  # the host wrote its end: there is nothing more
    found: bool  # the file exists (a job from before recordings has none)


def read_events(files: JobFiles, offset: int, max_bytes: int) -> EventsPage:
    """The whole lines from byte `offset`, at most `max_bytes` (or the one line there, if it is longer)."""
    try:
        fd = os.open(files.events, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return EventsPage([], offset, False, False)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return EventsPage([], offset, True, False)
        data = os.pread(fd, max_bytes, offset)
        while data and b"\n" not in data and len(data) == max_bytes:  # one line longer than a page: read it whole
            more = os.pread(fd, max_bytes, offset + len(data))
            if not more:
                break
            data += more
    finally:
        os.close(fd)
    whole = data[: data.rfind(b"\n") + 1]
    events: list[list[Any]] = []
    end = False
    for line in whole.splitlines():
        if line.strip() == END:
            end = True
            break
        event = _event(line)
        if event is not None:
            events.append(event)
    return EventsPage(events, offset + len(whole), end, True)


def _event(line: bytes) -> list[Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    if not (isinstance(value, list) and len(value) == 3):
        return None
    at, code, text = value
    if isinstance(at, bool) or not isinstance(at, int | float) or code not in CODES or not isinstance(text, str):
        return None
    return [float(at), code, text]
