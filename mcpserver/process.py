"""Identity of this server process: an instance id (for records of calls it started) and its start time."""

from __future__ import annotations

import time
import uuid
from functools import cache
from importlib.metadata import PackageNotFoundError, version

INSTANCE_ID = uuid.uuid4().hex
STARTED_MONOTONIC = time.monotonic()


def uptime_seconds() -> float:
    return time.monotonic() - STARTED_MONOTONIC


@cache  # reading package metadata costs ~2 ms; it cannot change while the process runs
def sandstorm_version() -> str:
    try:
        return version("sandstorm-mcp")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"
