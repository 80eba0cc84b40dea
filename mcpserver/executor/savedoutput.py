"""The saved-output directory and its size budget.

The directory is the executor's own, outside the workspace (production: the executor unit's state directory;
development: beside the server's state dir; SANDSTORM_OUTPUT_DIR chooses another). What a command printed, and a
background command's log, belong to the user whose command it was: no tool reaches a path outside the workspace,
and a confined command may not read or write there. The owner reads them back through terminal_output. It used
to be `<workspace>/.sandstorm/output`, where any credential's tools could read and rewrite them; files
left there stay (the agent may delete them), and jobs started then are still read there.

Saved output is a quota, not a cache: once the files hold `max_bytes`, new output is not saved (the result says
so, with what frees room) rather than older files deleted. Older files are named in results an agent may still be
paging through, a background log may still be written, and one noisy agent must not evict everyone else's output.
Files past MAX_AGE_SECONDS go on their own, and `manage.py prune_output` (a daily timer) deletes those, then the
oldest until the directory is back within budget.

The total is kept as a running sum: measured once (a directory walk) on first use, then counted up as we write.
Files deleted by other means (rm, file_delete) make it an overestimate, so when it says "full" the directory is
measured again (at most once per RESCAN_INTERVAL) before anything is refused.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mcpserver.executor.paths import OUTPUT_SUBDIR, SANDSTORM_DIR, Workspace

OUTPUT_DIR_MODE = 0o700

MAX_AGE_SECONDS = 7 * 24 * 3600
DEFAULT_MAX_BYTES = 1024 * 1024 * 1024
RESCAN_INTERVAL = 5.0  # seconds: a full directory refuses without walking it on every call


@dataclass(frozen=True)
class _Entry:
    path: Path
    mtime: float
    size: int


def _entries(directory: Path) -> Iterator[_Entry]:
    """The regular files in `directory` (not symlinks), oldest first."""
    found = []
    try:
        scan = list(os.scandir(directory))
    except FileNotFoundError:
        return iter(())
    for item in scan:
        try:
            if item.is_file(follow_symlinks=False):
                info = item.stat(follow_symlinks=False)
                found.append(_Entry(Path(item.path), info.st_mtime, info.st_size))
        except FileNotFoundError:
            continue  # removed meanwhile, e.g. by a concurrent prune
    return iter(sorted(found, key=lambda entry: entry.mtime))


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def beside(workspace: Workspace) -> Path:
    """The directory an executor built in process (tests, the benchmark) saves to when given none: beside the
    workspace, never in it. The executor process is always given one (__main__.py)."""
    return workspace.root.parent / f"{workspace.root.name}.sandstorm-output"


class OutputDirInWorkspace(ValueError):
    """Saved output inside the workspace would be every credential's to read and rewrite."""


class SavedOutput:
    """Where command output is saved, and how much more may be: `grant` hands out bytes until the budget is used."""

    def __init__(
        self,
        workspace: Workspace,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_age: float = MAX_AGE_SECONDS,
        directory: str | os.PathLike[str] | None = None,
    ) -> None:
        self.workspace = workspace
        self.directory = Path(os.path.realpath(directory)) if directory is not None else beside(workspace)
        if workspace.contains(self.directory):
            raise OutputDirInWorkspace(
                f"the saved-output directory {self.directory} must be outside the workspace {workspace.root}"
            )
        self.max_bytes = max_bytes  # 0: no budget
        self.max_age = max_age
        self._used: int | None = None  # bytes the files hold (an upper bound), None until measured
        self._measured_at = float("-inf")

    @property
    def legacy_directory(self) -> Path:
        """Where output was saved before: read for the jobs started then, never written."""
        return self.workspace.root / SANDSTORM_DIR / OUTPUT_SUBDIR

    def create(self) -> Path:
        """The directory, created (0700: the executor's alone) if it is not there yet."""
        try:
            self.directory.mkdir(mode=OUTPUT_DIR_MODE)
        except FileNotFoundError:
            self.directory.parent.mkdir(mode=OUTPUT_DIR_MODE, parents=True, exist_ok=True)
            self.directory.mkdir(mode=OUTPUT_DIR_MODE, exist_ok=True)
        except FileExistsError:
            pass
        return self.directory

    def grant(self, wanted: int) -> int:
        """How many of `wanted` bytes may be saved now (all of them, some, or 0), counted as used at once."""
        if not self.max_bytes:
            return wanted
        granted = max(0, min(wanted, self.max_bytes - self._used_now(wanted)))
        self._used = self._used_now(0) + granted
        return granted

    def has_room(self) -> bool:
        return not self.max_bytes or self._used_now(1) < self.max_bytes

    def _used_now(self, wanted: int) -> int:
        """The bytes used, measured first if never measured, or if `wanted` more would not fit (rate-limited)."""
        if self._used is None or (self._used + wanted > self.max_bytes and self._may_rescan()):
            self._measure()
        assert self._used is not None
        return self._used

    def give_back(self, unused: int) -> None:
        """Bytes granted but not written (a background log that stayed smaller is found at the next measure)."""
        if self._used is not None:
            self._used = max(0, self._used - unused)

    def full_message(self) -> str:
        return (
            f"saved output in {self.directory} has reached its budget of {self.max_bytes} bytes "
            "(SANDSTORM_OUTPUT_MAX_BYTES): files "
            f"go after {self.max_age / 86400:g} days, or an administrator can run "
            "`manage.py prune_output --max-bytes N`, which deletes the oldest until N are left"
        )

    def _may_rescan(self) -> bool:
        return time.monotonic() - self._measured_at >= RESCAN_INTERVAL

    def _measure(self) -> None:
        """Walk the directory: drop files past their age, and count the rest."""
        now = time.time()
        used = 0
        for entry in _entries(self.directory):
            if now - entry.mtime > self.max_age and _unlink(entry.path):
                continue
            used += entry.size
        self._used = used
        self._measured_at = time.monotonic()

    def prune(self, max_bytes: int | None = None) -> tuple[int, int, int]:
        """Delete files past their age, then the oldest until within `max_bytes` (default: the budget).

        Returns (files removed, files there were, bytes left).
        """
        limit = (self.max_bytes or None) if max_bytes is None else max_bytes  # None: no size rule
        now = time.time()
        entries = list(_entries(self.directory))
        total = sum(entry.size for entry in entries)
        removed = 0
        for entry in entries:
            over_budget = limit is not None and total > limit
            if now - entry.mtime <= self.max_age and not over_budget:
                continue
            if _unlink(entry.path):
                removed += 1
            total -= entry.size
        self._used, self._measured_at = total, time.monotonic()
        return removed, len(entries), total
