"""This server process: its instance id (in the records of the calls it started), start time and version."""

from __future__ import annotations

import time
import uuid
from functools import cache
from importlib.metadata import PackageNotFoundError, version

INSTANCE_ID = uuid.uuid4().hex
STARTED_MONOTONIC = time.monotonic()


def uptime_seconds() -> float:
    return time.monotonic() - STARTED_MONOTONIC


@cache  # read from the package metadata once: it cannot change while the process runs
def sandstorm_version() -> str:
    try:
        return version("sandstorm-mcp")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"
