"""The cgroup v2 file system, as far as the executor uses it: its own cgroup, subgroups, moving a process, killing a
group. No controllers are enabled: a group here only names processes, which the kernel keeps in it across fork,
setsid and the death of their parents, and which no process can leave without write access to the groups.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

MOUNTINFO = "/proc/self/mountinfo"


FREEZE_WAIT = 1.0  # seconds for a group to be frozen before going on regardless


def own_cgroup() -> Path | None:
    """The directory of this process's cgroup in the v2 hierarchy, or None if there is none mounted here."""
    path = cgroup_of("self")
    return path if path is not None and path.is_dir() else None


def cgroup_of(pid: int | str) -> Path | None:
    """The directory of process `pid`'s cgroup in the v2 hierarchy (None: no such process, or no hierarchy)."""
    mount = _v2_mount()
    if mount is None:
        return None
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as lines:
            relative = next((line[3:].strip() for line in lines if line.startswith("0::")), None)
    except OSError:
        return None
    if relative is None or relative.endswith(" (deleted)"):
        return None
    return mount / relative.lstrip("/")


def _v2_mount() -> Path | None:
    """Where the v2 hierarchy is mounted: /sys/fs/cgroup (unified), /sys/fs/cgroup/unified (hybrid), or elsewhere."""
    try:
        with open(MOUNTINFO, encoding="utf-8") as lines:
            for line in lines:
                fields = line.split()
                separator = fields.index("-") if "-" in fields else -1
                if separator > 0 and fields[separator + 1] == "cgroup2":
                    return Path(fields[4].replace("\\040", " "))
    except OSError:
        return None
    return None


def make(group: Path) -> None:
    """Create `group` if it is not there yet."""
    try:
        group.mkdir()
    except FileExistsError:
        pass


def move(pid: int, group: Path) -> bool:
    """Move process `pid` (all its threads) into `group`; False if it has already ended."""
    try:
        with open(group / "cgroup.procs", "w", encoding="ascii") as procs:
            procs.write(str(pid))
    except ProcessLookupError:
        return False
    return True


def members(group: Path) -> list[int]:
    """The processes in `group` itself (not in its subgroups); none if the group is gone."""
    try:
        text = (group / "cgroup.procs").read_text(encoding="ascii")
    except FileNotFoundError:
        return []
    return [int(line) for line in text.split()]


def populated(group: Path) -> bool:
    """Whether a live process is in `group` or below it."""
    try:
        text = (group / "cgroup.events").read_text(encoding="ascii")
    except FileNotFoundError:
        return False
    return "populated 1" in text


# What `kill` and `frozen` need of the kernel (cgroup.kill: Linux 5.14; cgroup.freeze: 5.2).
CONTROLS = ("cgroup.kill", "cgroup.freeze")


def kill(group: Path) -> None:
    """SIGKILL every process in `group` and below it, including those forked while it is done."""
    (group / "cgroup.kill").write_text("1", encoding="ascii")


@contextlib.contextmanager
def frozen(group: Path) -> Iterator[None]:
    """`group` and below it stopped (cgroup.freeze), so that what is read of it holds until it is thawed; a fatal
    signal still ends a frozen process."""
    control = group / "cgroup.freeze"
    control.write_text("1", encoding="ascii")
    try:
        deadline = time.monotonic() + FREEZE_WAIT
        while "frozen 1" not in (group / "cgroup.events").read_text(encoding="ascii"):
            if time.monotonic() > deadline:
                break
            time.sleep(0.002)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            control.write_text("0", encoding="ascii")


def remove(group: Path) -> bool:
    """Remove `group` and its subgroups if no process is left in them; whether it is gone."""
    for sub in sorted(_subgroups(group), key=lambda path: len(path.parts), reverse=True):
        try:
            sub.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            return False
    try:
        group.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _subgroups(group: Path) -> list[Path]:
    try:
        return [Path(top) / name for top, names, _ in os.walk(group) for name in names]
    except OSError:
        return []
