"""Every process a credential's calls start, kept in a cgroup of that credential, so that revoking it ends them all.

A foreground command may leave something running that has left its session and its parent (`setsid cmd &`, a
double fork): no process group, session or subreaper of a call then names it. A cgroup does: a process is born
into its parent's, stays there whatever it does, and cannot move itself out without write access to the groups
(the `workspace` sandbox gives none). So the executor keeps, under its own cgroup:

    sandstorm-<installation>/executor-<pid>          the executor alone, between two starts of a process
    sandstorm-<installation>/cred-<key in hex>-<ms>  what one credential's calls started since <ms>

Each process is started (spawn.py) inside `placed`: under one lock, started, moved into its credential's group,
and then anything it forked before the move (born in the executor's group, the only other process there) is moved
after it. Revoking a credential (`end`) kills its groups created before the revocation, with cgroup.kill, which
also takes what is being forked meanwhile; calls made after the revocation start a new group and are spared.

Where the executor has no cgroup it may manage (no cgroup v2, or no delegation: systemd's `Delegate=yes` gives
the production unit one; as root in development it has the whole hierarchy), `Untracked` stands in and says why.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol, TypeVar

from mcpserver.executor import cgroupfs
from mcpserver.executor.interface import ToolFailure

logger = logging.getLogger("mcpserver.executor")

# The credential (principal key: `bearer:<id>`, `oauth:<application>:<user>`) of the call being served; the server
# sends it with each request (remote.py) and the service sets it for the request's task. "": the server's own.
PRINCIPAL: contextvars.ContextVar[str] = contextvars.ContextVar("sandstorm_principal", default="")

GROUP_NAME = re.compile(r"cred-([0-9a-f]*)-([0-9]+)")
MAX_KEY_BYTES = 100
SWEEPS = 100  # rounds of moving what a new process forked before its move; each round takes all there are
END_WAIT = 2.0  # seconds to wait for a killed group to empty before leaving its removal to a later pass
COMMAND_CHARS = 200
PARENT_FIELD, SESSION_FIELD = 1, 3  # in /proc/<pid>/stat after the command name: ppid, and the session's id


class HasPid(Protocol):
    pid: int


P = TypeVar("P", bound=HasPid)


class Tracking(Protocol):
    def placed(self, start: Callable[[], P]) -> P: ...

    async def end(self, keys: Iterable[str], prefixes: Iterable[str], before: float) -> list[dict[str, object]]: ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


class Untracked:
    """No cgroup to manage: processes start where the executor is; `reason` says why (for /health)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def placed(self, start: Callable[[], P]) -> P:
        return start()

    async def end(self, keys: Iterable[str], prefixes: Iterable[str], before: float) -> list[dict[str, object]]:
        return []

    def describe(self) -> str:
        return f"unavailable: {self.reason}"

    def close(self) -> None:
        pass


class CredentialGroups:
    """The groups under `base`; the executor itself is in `leaf` (see the module's docstring)."""

    def __init__(self, base: Path, leaf: Path) -> None:
        self.base, self.leaf = base, leaf
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._current: dict[str, Path] = {}  # key -> the group its new processes go to

    def placed(self, start: Callable[[], P]) -> P:
        """Call `start` (which starts a process) and put what it started in the current credential's group before
        returning it. A process that cannot be placed is killed."""
        with self._lock:
            started = start()
            pid = started.pid
            try:
                self._gather(pid, self._group_for(PRINCIPAL.get()))
            except OSError as error:
                for stray in [pid, *self._strays()]:
                    _kill(stray)
                logger.error("could not place process %d in its credential's cgroup: %s", pid, error)
                raise ToolFailure(
                    f"Error: the command could not be tracked ({error.strerror}), so it was stopped"
                ) from error
            return started

    def _group_for(self, key: str) -> Path:
        group = self._current.get(key)
        if group is None or not group.is_dir():
            encoded = key.encode()
            if len(encoded) > MAX_KEY_BYTES:
                logger.warning("credential key too long for a cgroup name; its processes go to the server's group")
            name = f"cred-{encoded.hex()}-{int(time.time() * 1000)}" if 0 < len(encoded) <= MAX_KEY_BYTES else "server"
            group = self.base / name
            cgroupfs.make(group)
            self._current[key] = group
        return group

    def _gather(self, pid: int, group: Path) -> None:
        cgroupfs.move(pid, group)
        for _ in range(SWEEPS):
            strays = self._strays()
            if not strays:
                return
            for stray in strays:
                cgroupfs.move(stray, group)
        for stray in self._strays():  # still forking faster than it is moved: nothing of it is left to run
            _kill(stray)

    def _strays(self) -> list[int]:
        return [pid for pid in cgroupfs.members(self.leaf) if pid != self._pid]

    async def end(self, keys: Iterable[str], prefixes: Iterable[str], before: float) -> list[dict[str, object]]:
        """Kill every process in the groups of `keys` (and of keys starting with one of `prefixes`) created at or
        before `before` (seconds since the epoch); what was killed: pid, command line and credential."""
        wanted, starts = set(keys), tuple(prefixes)
        doomed: list[tuple[Path, str]] = []
        with self._lock:
            for key, created_ms in self._groups():
                if created_ms <= before * 1000 and (key in wanted or key.startswith(starts)):
                    path = self.base / f"cred-{key.encode().hex()}-{created_ms}"
                    doomed.append((path, key))
                    if self._current.get(key) == path:
                        del self._current[key]
            killed = [process for path, key in doomed for process in self._end_group(path, key)]
        deadline = time.monotonic() + END_WAIT
        while any(cgroupfs.populated(path) for path, _key in doomed) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for path, _key in doomed:
            cgroupfs.remove(path)
        if killed:
            logger.warning("ended %d process(es) of revoked credentials: %s", len(killed), killed)
        return killed

    def _end_group(self, path: Path, key: str) -> list[dict[str, object]]:
        """Kill what is in `path`, but for the commands of calls still running: their calls are being cancelled by the
        server that runs them, which records them so (a revocation seen first by another process, `manage.py
        revoke_token`, must not make them look as if they had failed). What was killed."""
        try:
            with cgroupfs.frozen(path):
                members = _all_members(path)
                doomed = [pid for pid in members if not self._of_a_running_call(pid)]
                described = [_described(pid, key) for pid in doomed]
                if len(doomed) == len(members):
                    cgroupfs.kill(path)  # what forks meanwhile too
                else:
                    for pid in doomed:
                        _kill(pid)
        except FileNotFoundError:
            return []  # emptied and removed meanwhile (by another executor's prune)
        return described

    def _of_a_running_call(self, pid: int) -> bool:
        """Whether `pid` is in the session of a running foreground command: one whose session leader's parent is an
        executor, in an executor's own group here (where no command can move itself)."""
        leader = _stat_field(pid, SESSION_FIELD)
        parent = _stat_field(leader, PARENT_FIELD) if leader else None
        group = cgroupfs.cgroup_of(parent) if parent else None
        return group is not None and group.parent == self.base and group.name.startswith("executor-")

    def _groups(self) -> list[tuple[str, int]]:
        found = []
        for entry in os.scandir(self.base):
            match = GROUP_NAME.fullmatch(entry.name)
            if match and entry.is_dir():
                try:
                    found.append((bytes.fromhex(match.group(1)).decode(), int(match.group(2))))
                except ValueError:
                    continue
        return found

    def prune(self) -> None:
        """Remove the groups no process is left in: other executors' (ended) and credentials' past ones."""
        with self._lock:
            current = set(self._current.values())
            for entry in os.scandir(self.base):
                path = Path(entry.path)
                if entry.is_dir() and path != self.leaf and path not in current and not cgroupfs.populated(path):
                    cgroupfs.remove(path)

    def describe(self) -> str:
        return "tracked"

    def close(self) -> None:
        """Leave the executor's group (for the one it came from) and remove what is empty."""
        try:
            cgroupfs.move(self._pid, self.base.parent)
        except OSError:
            return
        cgroupfs.remove(self.leaf)
        self.prune()
        cgroupfs.remove(self.base)  # only if nothing is left in it


def set_up(installation: str) -> Tracking:
    """The executor's groups, under its own cgroup, named after `installation` (a path the executors of one
    installation share, so that one started for a management command finds the server's); `Untracked` if the
    kernel or the service manager gives none."""
    own = cgroupfs.own_cgroup()
    if own is None:
        return Untracked("no cgroup v2 hierarchy is mounted")
    base = own / f"sandstorm-{hashlib.sha256(installation.encode()).hexdigest()[:12]}"
    leaf = base / f"executor-{os.getpid()}"
    try:
        cgroupfs.make(base)
        missing = [
            name for name in cgroupfs.CONTROLS if not (base / name).exists()
        ]  # any group below the root has both
        if missing:
            cgroupfs.remove(base)
            return Untracked(f"the kernel has no {' or '.join(missing)} (Linux 5.14 or later has both)")
        cgroupfs.make(leaf)
        cgroupfs.move(os.getpid(), leaf)
    except OSError as error:
        return Untracked(f"no cgroup of its own to manage at {own} ({error.strerror})")
    groups = CredentialGroups(base, leaf)
    groups.prune()
    return groups


def _all_members(group: Path) -> list[int]:
    return [pid for top, _names, _files in os.walk(group) for pid in cgroupfs.members(Path(top))]


def _stat_field(pid: int, index: int) -> int | None:
    """A number of /proc/<pid>/stat after the command name, by its index there (PARENT_FIELD, SESSION_FIELD)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().decode("ascii", errors="replace").rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    try:
        return int(fields[index])
    except (IndexError, ValueError):
        return None


def _described(pid: int, key: str) -> dict[str, object]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            command = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        command = ""
    return {"pid": pid, "command": command[:COMMAND_CHARS], "credential": key}


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


_active: Tracking = Untracked("not set up")


def configure(tracking: Tracking) -> None:
    global _active
    _active = tracking


def active() -> Tracking:
    return _active
