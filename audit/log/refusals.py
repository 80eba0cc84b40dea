"""The database's refusals of audit records, logged without flooding: the first at once, in one line, then one line
with a count at most every REPORT_SECONDS while they go on; never a traceback per call (a locked or full database
refuses every call, and a traceback each filled the log faster than the disk)."""

from __future__ import annotations

import logging
import threading
import time

logger = logging.getLogger("audit.log")
REPORT_SECONDS = 30.0


class RefusalLog:
    def __init__(self, what: str, report_seconds: float = REPORT_SECONDS) -> None:
        self._what = what  # "the start of a call was refused, so it did not run"
        self._report_seconds = report_seconds
        self._lock = threading.Lock()
        self._unreported = 0
        self._last = float("-inf")

    def note(self, error: BaseException) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last < self._report_seconds:
                self._unreported += 1
                return
            count, self._unreported, self._last = self._unreported + 1, 0, now
        logger.error("audit: %s (%d since the last such line): %s", self._what, count, reason_of(error))


def reason_of(error: BaseException) -> str:
    """The first line of an error's message, or its type's name."""
    text = str(error)
    return text.splitlines()[0][:300] if text else type(error).__name__
