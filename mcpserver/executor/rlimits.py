"""Resource limits of tool processes: how many tasks a command may add, how much memory each process may take.

Set without a preexec_fn (which would cost the spawn its vfork fast path): the executor lowers its own limits,
which every process it starts inherits from its first instruction. The memory limit never changes, so the executor
lowers its hard limit too, for good: no tool can raise it again. The process limit moves with the host (below), so
the executor lowers only its soft limit and pins the child's hard limit to it right after the spawn (prlimit): a
command cannot raise it with `ulimit` after its first moment (a command that does so at once may win that race;
production's cgroup limits, TasksMax=, bind regardless).

- Processes: RLIMIT_NPROC counts every task (process or thread) of the real uid, on the whole host. In development
  that uid also runs the developer's desktop, so the limit is relative: the host's current task count (an upper
  bound of the uid's, read cheaply from /proc/loadavg) plus `max_processes`. A command may thus always add at least
  `max_processes` tasks; a fork bomb stops there. The kernel does not apply it to root (or CAP_SYS_RESOURCE).
- Memory: RLIMIT_DATA, the private writable memory of one process (heap, anonymous mappings). Unlike RLIMIT_AS it
  ignores address space that is only reserved (PROT_NONE): V8's pointer cage, the JVM's heap reservation, Go's
  arenas, Chromium's PartitionAlloc, none of which an address-space limit survives. RLIMIT_RSS does nothing on
  Linux. It binds each process, not their sum: production's cgroup (MemoryMax=) bounds the sum.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

MIN_MAX_MEMORY = 64 * 1024 * 1024  # below it the executor itself (which the limit binds too) could not run
DEFAULT_MAX_PROCESSES = 1024  # far more than a build's compilers and a browser's threads; far less than a fork bomb's
BASE_TTL = 1.0  # seconds a reading of the host's task count is reused


def host_task_count() -> int:
    """Tasks (processes and threads) on the host: the total of /proc/loadavg's `running/total` field."""
    with open("/proc/loadavg", "rb") as loadavg:
        return int(loadavg.read().split()[3].split(b"/")[1])


def default_max_memory() -> int:
    """Half the host's RAM: room for any ordinary tool, while one runaway process cannot take all of it."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2


@dataclass(frozen=True)
class ToolLimits:
    max_processes: int = 0  # tasks a command may add to the host's; 0: no limit
    max_memory: int = 0  # bytes of private writable memory per process; 0: no limit


class LimitKeeper:
    """Applies one ToolLimits to this process (inherited by what it starts) and pins it in each child."""

    def __init__(self, limits: ToolLimits) -> None:
        self.limits = limits
        self._nproc_until = 0.0  # when the current RLIMIT_NPROC is stale

    def apply(self) -> None:
        """At start-up: the memory limit (it does not change); the process limit is set before each spawn."""
        if self.limits.max_memory:
            _set_limit(resource.RLIMIT_DATA, self.limits.max_memory, hard_too=True)

    def before_spawn(self) -> None:
        """Refresh the relative process limit (at most once per BASE_TTL): a new command may add max_processes."""
        if not self.limits.max_processes:
            return
        now = time.monotonic()
        if now < self._nproc_until:
            return
        self._nproc_until = now + BASE_TTL
        _set_limit(resource.RLIMIT_NPROC, host_task_count() + self.limits.max_processes)

    def refresh_now(self) -> None:
        """A spawn failed with EAGAIN: the host's count may have grown past our reading; read it again."""
        self._nproc_until = 0.0
        self.before_spawn()

    def pin(self, pid: int) -> None:
        """Make the child's hard process limit its soft one, so `ulimit` in the command cannot raise it again."""
        if not self.limits.max_processes:
            return
        soft, _hard = resource.getrlimit(resource.RLIMIT_NPROC)
        try:
            resource.prlimit(pid, resource.RLIMIT_NPROC, (soft, soft))
        except ProcessLookupError:
            pass  # it has already ended
        except PermissionError:
            # A setuid program (sudo) may have taken the child over already: its limits are no longer ours to set.
            logger.info("cannot pin the process limit of process %d", pid)


def _set_limit(which: int, value: int, *, hard_too: bool = False) -> None:
    """Set the soft limit (and the hard one if `hard_too`) to `value`, or to the hard limit if that is lower (only
    privileged processes may exceed it)."""
    _soft, hard = resource.getrlimit(which)
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(which, (value, value if hard_too else hard))


# The executor's one keeper (limits are per process): configured by __main__, a no-op until then (as in tests
# that use LocalExecutor in-process, whose own limits must not change).
keeper = LimitKeeper(ToolLimits())


def configure(limits: ToolLimits) -> None:
    global keeper
    keeper = LimitKeeper(limits)
    keeper.apply()
