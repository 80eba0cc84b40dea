"""Which sandbox a tool call's processes start in: the confinement profiles, enforced by the kernel (Landlock).

- `read`: every process a read tool starts (git for git_status/git_diff/git_log, rg for file_grep). It may execute
  only git's own programs and rg, write nothing, connect nowhere over TCP, and read only the workspace and the
  system's files (`/usr`, `/etc`, …). A filter, textconv, fsmonitor, pager or hook a repository names cannot run.
- `probe`: the fixed programs of workspace_info (uname, df, free, node, npm) and file_list (ls): `read`, plus
  those programs.
- `workspace`: a full-scope credential confined to the workspace. It may write only in the workspace and a private
  temporary directory (TMPDIR); the hidden paths (the server's state dir, env files, the saved-output directory,
  in development the project checkout around the workspace) can be neither read nor written; no setuid program
  gains privileges (`sudo` answers with one line saying why), and it can neither signal nor ptrace a process
  outside its sandbox.
- `host`: no sandbox: the executor user's whole reach.

A Landlock domain binds a thread and what it starts. So each confined profile has one thread of its own, bound to
its ruleset once when the executor starts, and a process of that profile is started (vfork and exec) from that
thread: nothing is paid per spawn but the hand-over to the thread.

The profile of the call being served is `PROFILE`, a context variable: the server sets it from the credential,
sends it with each request, and the executor's service sets it again for the request's task (service.py), `read`
for the read operations whatever the server asked.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.thread import BrokenThreadPool
from dataclasses import dataclass, field
from typing import TypeVar

from mcpserver.executor import landlock
from mcpserver.executor import sandbox_rules as rules
from mcpserver.executor.interface import ToolFailure

logger = logging.getLogger("mcpserver.executor")

READ, PROBE, WORKSPACE, HOST = "read", "probe", "workspace", "host"
PROFILES = (READ, PROBE, WORKSPACE, HOST)
# What a credential may be given (the others are chosen by the operation).
CREDENTIAL_PROFILES = (WORKSPACE, HOST)

PROFILE: contextvars.ContextVar[str] = contextvars.ContextVar("sandstorm_confinement", default=HOST)

# Operations that only read: whatever they start runs in `read` (workspace_info's probes in `probe`).
READ_OPERATIONS = frozenset(
    {
        "read_file", "read_file_or_image", "git_status", "git_diff", "git_log", "grep", "glob_files",
        "job_output", "job_states", "job_events", "process_start_ticks", "git_roots", "read_saved_output",
    }
)  # fmt: skip
PROBE_OPERATIONS = frozenset({"workspace_info", "list_dir"})

T = TypeVar("T")


@dataclass
class Confinement:
    """The sandboxes of one executor: one bound thread per profile the kernel can enforce."""

    abi: int | None
    unavailable: dict[str, str] = field(default_factory=dict)  # profile -> why the kernel cannot enforce it
    private_tmp: str = ""
    shim_dir: str = ""
    _threads: dict[str, ThreadPoolExecutor] = field(default_factory=dict)
    _rulesets: dict[str, int] = field(default_factory=dict)  # profile -> its ruleset's descriptor, kept for job hosts
    _makers: dict[str, Callable[[], landlock.Ruleset]] = field(default_factory=dict)
    listed: dict[str, int] = field(default_factory=dict)  # the directories `workspace`'s rules were listed from

    def bind(self, profile: str, make: Callable[[], landlock.Ruleset]) -> None:
        """(Re)build `profile`'s ruleset and its bound thread; on failure the profile is unavailable, and says why."""
        self._makers[profile] = make
        old_thread, old_fd = self._threads.pop(profile, None), self._rulesets.pop(profile, None)
        try:
            ruleset = make()
            self._threads[profile] = _bound_thread(profile, ruleset)
            self._rulesets[profile] = ruleset.fd
            self.unavailable.pop(profile, None)
        except (OSError, landlock.LandlockUnavailable) as error:
            self.unavailable[profile] = str(error)
            logger.warning("kernel confinement '%s' is not in force: %s", profile, error)
        finally:
            if old_thread is not None:
                old_thread.shutdown(wait=False)
            if old_fd is not None:
                os.close(old_fd)

    def _fresh(self, profile: str) -> None:
        """`workspace` is built again when a directory its rules were listed from has changed (a new entry there
        would not be readable otherwise): a few stat calls per start."""
        if profile == WORKSPACE and self.listed and rules.changed(self.listed) and WORKSPACE in self._makers:
            self.bind(WORKSPACE, self._makers[WORKSPACE])

    def describe(self) -> dict[str, object]:
        """What is in force, for the executor's identity (the server shows it on /health and the status home)."""
        return {
            "landlock_abi": self.abi,
            "profiles": {name: self.unavailable.get(name, "enforced") for name in (READ, WORKSPACE)},
        }

    def enforced(self, profile: str) -> bool:
        return profile in self._threads

    def start(self, profile: str, popen: Callable[[], T]) -> T:
        """Run `popen` (which starts a process) in `profile`'s sandbox.

        `host` starts it here, unconfined. `read` and `probe` fall back to unconfined where the kernel cannot
        enforce them (the git layer's own defences then stand alone). `workspace` never runs unconfined.
        """
        if profile == HOST:
            return popen()
        self._fresh(profile)
        thread = self._threads.get(profile)
        if thread is None:
            if profile == WORKSPACE:
                reason = self.unavailable.get(WORKSPACE, "not set up")
                raise ToolFailure(
                    "Error: this credential is confined to its workspace, but this host cannot enforce that "
                    f"({reason}), so nothing was run. An admin can give it the 'host' profile on its page."
                )
            return popen()
        return thread.submit(popen).result()

    def ruleset_fd(self, profile: str) -> int | None:
        """The descriptor of `profile`'s ruleset, for a process that binds its own child to it (the job host); None
        for no sandbox (`host`, or a read profile the kernel cannot enforce). Refuses `workspace` as `start` does."""
        if profile == HOST:
            return None
        self._fresh(profile)
        fd = self._rulesets.get(profile)
        if fd is None and profile == WORKSPACE:
            self.start(WORKSPACE, lambda: None)  # raises the refusal
        return fd

    def environment(self, profile: str, env: dict[str, str]) -> dict[str, str]:
        """`env` as a process of `profile` gets it: a confined one has its private TMPDIR and the sudo shim."""
        if profile != WORKSPACE or not self.enforced(WORKSPACE):
            return env
        path = env.get("PATH", os.defpath)
        return {**env, "TMPDIR": self.private_tmp, "PATH": f"{self.shim_dir}:{path}"}

    def close(self) -> None:
        for thread in self._threads.values():
            thread.shutdown(wait=False)
        self._threads.clear()
        for fd in self._rulesets.values():
            os.close(fd)
        self._rulesets.clear()


def _bound_thread(name: str, ruleset: landlock.Ruleset) -> ThreadPoolExecutor:
    """A one-thread pool bound to `ruleset`; raises OSError if the kernel refused to bind it."""

    refused: list[OSError] = []  # the pool reports only that its initializer failed: the reason is kept here

    def bind() -> None:
        try:
            landlock.drop_capabilities()  # root's too: no capability overrides the sandbox or reads other processes
            ruleset.restrict_self()
        except OSError as error:
            refused.append(error)
            raise

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"confined-{name}", initializer=bind)
    try:
        pool.submit(lambda: None).result()
    except BrokenThreadPool as error:
        pool.shutdown(wait=False)
        ruleset.close()
        raise OSError(f"could not bind a thread to the sandbox: {refused[0] if refused else error}") from error
    return pool


def build(root: str, hidden: Iterable[str], *, enabled: bool = True, path: str | None = None) -> Confinement:
    """The executor's sandboxes for the workspace `root`: each profile the kernel can enforce gets its thread.

    `hidden`: trees a `workspace` process may neither read nor write. `enabled` False: kernel confinement turned
    off by the admin (SANDSTORM_KERNEL_CONFINEMENT=off).
    """
    path = path if path is not None else os.environ.get("PATH", os.defpath)
    if not enabled:
        reason = "turned off (SANDSTORM_KERNEL_CONFINEMENT=off)"
        return Confinement(abi=None, unavailable={READ: reason, PROBE: reason, WORKSPACE: reason})
    try:
        abi = landlock.abi_version()
    except landlock.LandlockUnavailable as error:
        reason = str(error)
        return Confinement(abi=None, unavailable={READ: reason, PROBE: reason, WORKSPACE: reason})
    confinement = Confinement(abi=abi)
    home = os.path.expanduser("~")
    loaders = rules.loader_paths()
    git = rules.git_programs(path)
    confinement.private_tmp, confinement.shim_dir = rules.make_private_dirs(root)
    builders: dict[str, Callable[[], landlock.Ruleset]] = {
        READ: lambda: rules.read_ruleset(root, home, [*loaders, *git]),
        PROBE: lambda: rules.read_ruleset(root, home, [*loaders, *git, *rules.programs(rules.PROBES, path)]),
    }
    for name, make in builders.items():
        confinement.bind(name, make)
    hidden = list(hidden)

    def workspace() -> landlock.Ruleset:
        readable, confinement.listed = rules.walk(hidden)
        return rules.workspace_ruleset(root, readable, confinement.private_tmp)

    confinement.bind(WORKSPACE, workspace)
    return confinement


_active = Confinement(abi=None, unavailable={n: "not set up" for n in (READ, PROBE, WORKSPACE)})


def configure(confinement: Confinement) -> None:
    global _active
    _active.close()
    _active = confinement


def active() -> Confinement:
    return _active


@contextlib.contextmanager
def unconfined() -> Iterator[None]:
    """Processes started inside start unconfined: for the executor's own helpers (the job host), never a command."""
    token = PROFILE.set(HOST)
    try:
        yield
    finally:
        PROFILE.reset(token)


def profile_for(operation: str, requested: object) -> str:
    """The profile a request's processes start in: `read`/`probe` for the reading operations, else the one the
    server sent (`host` when it sent none: a server from before profiles existed). Raises ValueError for another."""
    if operation in READ_OPERATIONS:
        return READ
    if operation in PROBE_OPERATIONS:
        return PROBE
    if requested is None:
        return HOST
    if requested not in (READ, *CREDENTIAL_PROFILES):  # read: a read-only credential's, the strictest
        raise ValueError(f"unknown confinement profile {requested!r}")
    return str(requested)


def summary(described: dict[str, object]) -> str:
    """One line saying which protections are in force, from `Confinement.describe()` (the server has only that)."""
    abi = described.get("landlock_abi")
    profiles = described.get("profiles")
    states = profiles if isinstance(profiles, dict) else {}
    parts = [f"{name}: {state}" for name, state in states.items()]
    kernel = f"Landlock ABI {abi}" if abi else "no Landlock"
    groups = described.get("process_groups")
    if groups is not None:
        parts.append(f"processes per credential: {groups}")
    return f"{kernel}; " + "; ".join(parts)
