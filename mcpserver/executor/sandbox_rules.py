"""What each confinement profile's Landlock ruleset allows (confinement.py binds threads to them): the system trees
a program needs, the programs a read may run, the paths that cover everything but the hidden trees, and the
workspace's private TMPDIR and sudo shim."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterable

from mcpserver.executor import landlock
from mcpserver.executor.ripgrep import rg_binary

# System trees a program needs to run (its code, libraries, configuration); read-only in every sandbox.
SYSTEM_READ = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/opt", "/snap")
# Devices any sandboxed program may read and write: nothing is stored through them.
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
# The fixed programs of workspace_info's probes and file_list (ls) besides git.
PROBES = ("uname", "df", "free", "node", "npm", "env", "ls")
SHIMMED = ("sudo", "su", "doas", "pkexec")

SUDO_SHIM = """#!/bin/sh
echo "${0##*/}: this credential is confined to its workspace (confinement profile 'workspace'): no program it runs \
can gain privileges. An admin can give the credential the 'host' profile on its page in the console." >&2
exit 1
"""


def real_path(path: str) -> str | None:
    try:
        return os.path.realpath(path, strict=True)
    except OSError:
        return None


def within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def readable_except(hidden: Iterable[str]) -> list[str]:
    """Paths whose trees cover the whole file system but the `hidden` trees (Landlock can only allow): at each
    directory on the way down to a hidden path, every entry but the ones leading to it."""
    return walk(hidden)[0]


def walk(hidden: Iterable[str]) -> tuple[list[str], dict[str, int]]:
    """readable_except's paths, and the directories it listed with their modification times: an entry made in one
    of them later is not covered, so the sandbox is built again when one changes (Confinement.start)."""
    hidden = sorted({real for path in hidden if (real := real_path(path)) and real != "/"})
    if not hidden:
        return ["/"], {}
    allowed: list[str] = []
    listed: dict[str, int] = {}
    pending = ["/"]
    while pending:
        directory = pending.pop()
        try:
            listed[directory] = os.stat(directory).st_mtime_ns
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            entry = os.path.join(directory, name)
            if any(within(h, entry) for h in hidden):
                if not any(within(entry, h) for h in hidden):
                    pending.append(entry)  # an ancestor of a hidden path: descend
                continue
            # A rule binds what a symlink points to: one leading into (or above) a hidden tree would open it.
            target = real_path(entry) if os.path.islink(entry) else entry
            if target is None or any(within(h, target) or within(target, h) for h in hidden):
                continue
            allowed.append(entry)
    return allowed, listed


def changed(listed: dict[str, int]) -> bool:
    for directory, mtime in listed.items():
        try:
            if os.stat(directory).st_mtime_ns != mtime:
                return True
        except OSError:
            return True
    return False


def _allow_all(ruleset: landlock.Ruleset, paths: Iterable[str], rights: int) -> None:
    for path in paths:
        ruleset.allow(path, rights)


def read_ruleset(root: str, home: str, executables: Iterable[str]) -> landlock.Ruleset:
    ruleset = landlock.Ruleset(
        handled_fs=landlock.fs_rights(99),
        handled_net=landlock.NET_BIND_TCP | landlock.NET_CONNECT_TCP,
        scoped=landlock.SCOPE_ABSTRACT_UNIX_SOCKET | landlock.SCOPE_SIGNAL,
    )
    _allow_all(ruleset, (*SYSTEM_READ, root), landlock.READ)
    # git reads the user's own configuration (identity, aliases); nothing else of the home directory.
    _allow_all(ruleset, (os.path.join(home, ".gitconfig"), os.path.join(home, ".config", "git")), landlock.READ)
    _allow_all(ruleset, DEVICES, landlock.READ_FILE | landlock.WRITE_FILE)
    # Only these programs may be executed: the rules above give none the right. The dynamic loader needs it to
    # start any of them (docs/security.md says what that leaves).
    _allow_all(ruleset, executables, landlock.EXECUTE | landlock.READ)
    return ruleset


def workspace_ruleset(root: str, readable: Iterable[str], private_tmp: str) -> landlock.Ruleset:
    ruleset = landlock.Ruleset(
        handled_fs=landlock.fs_rights(99), scoped=landlock.SCOPE_ABSTRACT_UNIX_SOCKET | landlock.SCOPE_SIGNAL
    )
    _allow_all(ruleset, readable, landlock.READ | landlock.EXECUTE)
    everything = landlock.fs_rights(ruleset.abi)
    _allow_all(ruleset, (root, private_tmp), everything)
    devices = landlock.READ_FILE | landlock.WRITE_FILE | landlock.IOCTL_DEV
    _allow_all(ruleset, (*DEVICES, "/dev/ptmx", "/dev/pts"), devices)
    return ruleset


def loader_paths() -> list[str]:
    """The dynamic loaders a program may name as its interpreter (the kernel opens them for execution)."""
    found = []
    for directory in ("/lib64", "/lib", "/usr/lib64", "/usr/lib"):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        found += [os.path.join(directory, n) for n in names if n.startswith("ld-linux") or n.startswith("ld64.so")]
        for sub in names:  # multiarch: /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
            inner = os.path.join(directory, sub)
            if sub.endswith("-linux-gnu") and os.path.isdir(inner):
                found += [os.path.join(inner, n) for n in os.listdir(inner) if n.startswith("ld-linux")]
    return sorted({real for path in found if (real := real_path(path))})


def programs(names: Iterable[str], path: str) -> list[str]:
    """The real paths of the programs `names` found on `path`."""
    return [real for name in names if (where := shutil.which(name, path=path)) and (real := real_path(where))]


def git_programs(path: str) -> list[str]:
    """git, its own programs (git --exec-path) and rg."""
    found = programs(("git",), path)
    rg = rg_binary()
    if rg and (real := real_path(rg)):
        found.append(real)
    for directory in ("/usr/lib/git-core", "/usr/libexec/git-core"):
        if os.path.isdir(directory):
            found.append(directory)
    return found


def make_private_dirs(root: str) -> tuple[str, str]:
    """The private temporary directory and the sudo shim's directory: in the workspace's `.sandstorm` (0700, the
    executor user's; kept across restarts, so a killed executor leaves nothing new behind anywhere)."""
    base = os.path.join(root, ".sandstorm")
    private_tmp, shim_dir = os.path.join(base, "tmp"), os.path.join(base, "bin")
    for directory in (base, private_tmp, shim_dir):
        os.makedirs(directory, mode=0o700, exist_ok=True)
    ignore = os.path.join(base, ".gitignore")
    if not os.path.exists(ignore):  # a workspace that is itself a repository never stages these
        with open(ignore, "w", encoding="utf-8") as file:
            file.write("*\n")
    for name in SHIMMED:
        shim = os.path.join(shim_dir, name)
        with open(shim, "w", encoding="utf-8") as file:
            file.write(SUDO_SHIM)
        os.chmod(shim, stat.S_IRWXU)
    return private_tmp, shim_dir
