"""A background job's files in the saved-output directory: its log, its state file (appended to by the job host,
one JSON line at a time) and its input FIFO; created and opened by the executor, read back here."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODES = ("none", "stdin", "pty")
JOB_LOG = re.compile(r"bg-\d{8}-\d{6}-[0-9a-f]{8}\.log")
SAVED_OUTPUT = re.compile(r"[a-z]+-\d{8}-\d{6}-[0-9a-f]{32}\.(stdout|stderr)\.log")  # processes.run_process's


@dataclass(frozen=True)
class JobFiles:
    directory: Path
    stem: str

    @property
    def log(self) -> Path:
        return self.directory / f"{self.stem}.log"

    @property
    def state(self) -> Path:
        return self.directory / f"{self.stem}.state"

    @property
    def fifo(self) -> Path:
        return self.directory / f"{self.stem}.in"

    @property
    def events(self) -> Path:
        """The job's recording (jobevents.py)."""
        return self.directory / f"{self.stem}.events"


# What a state file may hold, and of which type: a job of an unconfined credential (or one from before the files left
# the workspace) could have written anything there.
STATE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "state": str, "pid": int, "start_ticks": int, "host_pid": int, "host_ticks": int, "mode": str,
    "stdin_target": str, "exit_code": int, "signal": int, "ended": (int, float),
}  # fmt: skip
STATES = frozenset({"running", "exited", "killed"})


def open_job_files(files: JobFiles, mode: str, recorded: bool = True) -> dict[str, int]:
    """Create the job's log, events file, state file and (with input) FIFO, each new, and open them for the host
    to inherit."""
    flags = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    opened: dict[str, int] = {"log_fd": -1, "state_fd": -1, "fifo_fd": -1, "events_fd": -1}
    try:
        opened["log_fd"] = os.open(files.log, flags | os.O_WRONLY, 0o600)
        if recorded:
            opened["events_fd"] = os.open(files.events, flags | os.O_WRONLY | os.O_APPEND, 0o600)
        opened["state_fd"] = os.open(files.state, flags | os.O_WRONLY | os.O_APPEND, 0o600)
        if mode != "none":
            os.mkfifo(files.fifo, 0o600)
            # Read and write, non-blocking: it opens without a writer, and never reads as ended between writers.
            opened["fifo_fd"] = os.open(files.fifo, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        for fd in opened.values():
            if fd >= 0:
                os.close(fd)
        raise
    return opened


def log_size(files: JobFiles) -> int:
    try:
        return os.stat(files.log, follow_symlinks=False).st_size
    except FileNotFoundError:
        return 0


def last_state(data: bytes) -> bytes:
    """The last whole line the host appended (a line still being written is not one yet); a state file of an older
    host is one JSON object, replaced whole, without a newline."""
    if b"\n" not in data:
        return data
    return data[: data.rindex(b"\n")].rsplit(b"\n", 1)[-1]


def read_state(path: Path) -> dict[str, Any]:
    """The fields of a job's state file that have the type they should; {} for none (no file: a command started
    before job hosts, or one whose files were pruned)."""
    try:
        with open(path, "rb") as state_file:
            found = json.loads(last_state(state_file.read(1 << 20)))
    except (OSError, ValueError):
        return {}
    if not isinstance(found, dict):
        return {}
    state = {
        key: value
        for key, value in found.items()
        if key in STATE_FIELDS and isinstance(value, STATE_FIELDS[key]) and not isinstance(value, bool)
    }
    if state.get("state") not in STATES or state.get("mode", "none") not in MODES:
        return {}
    return state
